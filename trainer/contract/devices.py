"""The ``--device`` every command takes: its choices and what each means (the process group
interprets it: :mod:`trainer.distributed.process_group`)."""

DEVICES = ("auto", "cpu", "cuda")
#: a job whose ranks would differ (one node without a GPU) is refused on every rank
DEVICE_HELP = "cuda (NCCL between processes), cpu (gloo), or auto: cuda where there is a GPU, else cpu"
