import os

# One thread per process: the tests launch several processes on a small machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402  (after the thread count, which must come first)
from accelerate.state import PartialState  # noqa: E402


@pytest.fixture
def process_state():
    """The one-process state accelerate's logger needs (code that logs outside a run), dropped
    after the test."""
    PartialState(cpu=True)
    yield
    PartialState._reset_state()
