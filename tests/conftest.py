import os

# One thread per process: the tests launch several processes on a small machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
