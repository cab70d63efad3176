import os
import sys

# One thread per process: the tests launch several processes on a small machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The suite launches some 800 Python processes. Where the environment turns bytecode caching off
# (PYTHONDONTWRITEBYTECODE), each would compile the project's modules again (10% of the CPU of
# two test files, measured on a 2-core machine). The caches go to __pycache__/, which git ignores.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest  # noqa: E402  (after the thread count, which must come first)
from accelerate.state import PartialState  # noqa: E402


@pytest.fixture
def process_state():
    """The one-process state accelerate's logger needs (code that logs outside a run), dropped
    after the test."""
    PartialState(cpu=True)
    yield
    PartialState._reset_state()
