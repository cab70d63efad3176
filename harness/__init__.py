"""What the tests, the benchmarks and the fault matrix share: launching a training script the way
a user does, and the fault matrix's scenarios. It lives in the source checkout only (the
installed ``trainer`` package holds the product alone) and is imported with the checkout on
``sys.path``: the scripts put it there, pytest's ``pythonpath`` does for the tests."""
