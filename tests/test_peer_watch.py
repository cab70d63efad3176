"""The peers' watch thread leaves nothing running inside torch when its process exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SERVER = textwrap.dedent(
    """
    import sys, time
    import torch.distributed as dist
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    print(server.port, flush=True)
    time.sleep(120)
    """
)

RANK = textwrap.dedent(
    """
    import atexit, sys, time
    from trainer.distributed import peer_watch
    # atexit runs its functions last in, first out: this one after any the trainer registers
    atexit.register(lambda: print("watch thread alive after close:", watch._thread.is_alive(), file=sys.stderr))
    watch = peer_watch.start_watch(rank=1, world_size=2, stop_grace_s=30, timeout_s=600)
    print("watching", flush=True)
    sys.stdin.readline()  # the store's server is frozen now: the watch thread waits in a store call
    time.sleep(2 * peer_watch.POLL_S)
    if sys.argv[1] == "close":
        peer_watch.close_watch()
    sys.exit(3)
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("closed_by", ["close", "exit"])
def test_the_watch_thread_ends_before_the_process_does_while_the_store_s_server_is_slow(closed_by):
    """A slow store's server (a node's agent under load) holds the watch thread inside a torch
    store call for seconds. A daemon thread that returns from torch while the interpreter
    finalizes aborts the process ("terminate called without an active exception", status
    -6) in place of the rank's own exit status: closing waits for the thread to end, and a
    process that exits without closing its watch closes it first."""
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        rank = subprocess.Popen(
            [sys.executable, "-c", RANK, closed_by],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert rank.stdout.readline().strip() == "watching"
        os.kill(server.pid, signal.SIGSTOP)
        rank.stdin.write("\n")
        rank.stdin.flush()
        time.sleep(5)  # longer than a poll and the old join bound together
        os.kill(server.pid, signal.SIGCONT)
        _, stderr = rank.communicate(timeout=90)
        assert rank.returncode == 3, stderr[-2000:]
        assert "watch thread alive after close: False" in stderr, stderr[-2000:]
        assert "terminate called" not in stderr
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
