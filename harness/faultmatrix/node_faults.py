"""Faults of a job on two nodes, simulated on this machine: two ``torchrun`` agents started side
by side (``--nnodes 2 --rdzv_backend c10d``, one rendezvous endpoint), each with its own
workers, as a cluster's nodes meet. With ``processes`` N the job has 2N ranks, N per node."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from harness.faultmatrix.runs import (
    HARD_TIMEOUT,
    Outcome,
    Run,
    alive,
    error_lines,
    restart_after_kill_outcome,
    wait,
    with_tail,
)
from harness.launch import ROOT, SCRIPT, free_port

#: the first line of a C++ warning or error a worker logs ("[rank1]:[W1204 ... TCPStore.cpp:125]
#: ...", then its stack frames); the agents' own have no rank prefix
WORKER_CPP_LOG = re.compile(r"^\[rank\d+\]:\[[WE]\d{4} ", re.MULTILINE)


def worker_noise(stderr: str) -> bool:
    """Whether a worker printed a traceback (a frame in the trainer or its script) or a C++
    warning with its stack. The surviving agent's own traceback and C++ warnings (its
    rendezvous store was on the lost node) are the launcher's, all in torch."""
    frames = [line for line in stderr.splitlines() if line.lstrip().startswith('File "')]
    return bool(WORKER_CPP_LOG.search(stderr)) or any("/trainer/" in line or "/scripts/" in line for line in frames)


class TwoNodes:
    """One job of two simulated nodes running ``run``'s config (``run.processes`` = both nodes'
    ranks), under torchrun's elastic agent with ``max_restarts``, in a launcher's environment."""

    def __init__(self, run: Run, max_restarts: int = 0, nnodes: str = "2", rdzv_conf: str = "") -> None:
        self.run, self.max_restarts, self.nnodes, self.rdzv_conf = run, max_restarts, nnodes, rdzv_conf
        self.per_node = run.processes // 2
        self.endpoint = f"127.0.0.1:{free_port()}"
        self.job_id = uuid.uuid4().hex[:8]

    def command(self, *extra: str) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", self.nnodes, "--nproc_per_node", str(self.per_node),
            "--rdzv_backend", "c10d", "--rdzv_endpoint", self.endpoint, "--rdzv_id", self.job_id,
            "--max-restarts", str(self.max_restarts),
            *(["--rdzv_conf", self.rdzv_conf] if self.rdzv_conf else []),
            str(SCRIPT), *self.run.args, *extra,
        ]  # fmt: skip

    def start(self, *extra: str) -> list[subprocess.Popen]:
        """Both agents, each in a session of its own (a node: killing its group kills the node)."""
        for old in self.run.pids.iterdir():
            old.unlink()
        agents = []
        for index in range(2):
            if index:  # the first agent hosts the rendezvous store: once it listens, the second
                listening(self.endpoint, HARD_TIMEOUT)
            agents.append(
                subprocess.Popen(
                    self.command(*extra),
                    cwd=ROOT,
                    env=self.run.env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        return agents

    def finish(self, agents: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
        """Wait for both agents (a hang is killed and reported as exit -999), their workers too."""
        ends = [wait(agent, HARD_TIMEOUT) for agent in agents]
        for pid_file in self.run.pids.glob("rank*.pid"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        return ends

    def run_to_end(self, *extra: str) -> tuple[list[tuple[int, str, str]], float]:
        start = time.monotonic()
        ends = self.finish(self.start(*extra))
        return ends, time.monotonic() - start


def listening(endpoint: str, timeout: float) -> None:
    """Wait until a server accepts connections at ``endpoint`` (host:port), at most ``timeout`` s."""
    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
            return
        time.sleep(0.05)


def parent(pid: int) -> int:
    """The parent process of ``pid`` (0 when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def plain_run(work: Path, processes: int) -> Outcome:
    """Two nodes, no fault: both agents exit 0, every record names the whole world."""
    label = "two nodes, a plain run"
    run = Run(work, 2 * processes)
    ends, seconds = TwoNodes(run).run_to_end()
    train = run.records("train")
    worlds = {r["world_size"] for r in train}
    ok = all(code == 0 for code, _, _ in ends) and bool(train) and train[-1]["step"] == 6 and worlds == {2 * processes}
    exits = "/".join(str(code) for code, _, _ in ends)
    outcome = f"exit {exits}, last train step {train[-1]['step'] if train else None}, world sizes {sorted(worlds)}"
    tails = "\n".join("\n".join(err.strip().splitlines()[-2:]) for _, _, err in ends)
    return Outcome(label, processes, ok, with_tail(outcome, ok, tails, 4, 400), seconds, run.on_disk())


def restart_after_lost_worker(work: Path, processes: int) -> Outcome:
    """Two nodes under ``--max-restarts 1`` with the launcher's defaults (the agents' shared
    store), the last rank's worker SIGKILLed after the first checkpoint: the agents restart
    their workers (the one whose worker died counts restart 1, the other 0), and the job goes on
    as in restart_after_kill_outcome."""

    def launch(run: Run) -> tuple[list[int], str, float]:
        ends, seconds = TwoNodes(run, max_restarts=1).run_to_end("--resume", "latest")
        return [code for code, _, _ in ends], "\n".join(err for _, _, err in ends), seconds

    label = "two nodes, SIGKILL one worker, --max-restarts 1"
    return restart_after_kill_outcome(work, 2 * processes, label, processes, launch)


#: seconds from a node's loss to the end of every rank of the other node
LOST_NODE_BOUND_S = 30.0


def lost_node(which: str) -> Callable[[Path, int], Outcome]:
    """Two nodes without restarts; one node lost (its agent and workers SIGKILLed): the node of
    rank 0 (``first``: its agent hosts the workers' store, the notice board) or of the last rank
    (``last``). Every rank of the other node ends within LOST_NODE_BOUND_S, each with one line
    naming the peer's loss, no traceback and no C++ frames."""
    return functools.partial(_lost_node, which)


def lose_node(
    nodes: TwoNodes, agents: list[subprocess.Popen], pids: dict[int, int], rank: int
) -> tuple[list[int], int, str, float]:
    """SIGKILL the node of ``rank`` (torch's agent starts each worker in a session of its own:
    a node is its agent and the agent's children) and wait for the other node's agent. Returns
    its workers' pids, its exit status, its stderr and the seconds from the kill."""
    lost = next(a for a in agents if parent(pids[rank]) == a.pid)
    survivor = next(a for a in agents if a is not lost)
    survivors = [pid for pid in pids.values() if parent(pid) == survivor.pid]
    start = time.monotonic()
    for pid in [lost.pid, *(pid for pid in pids.values() if parent(pid) == lost.pid)]:
        os.kill(pid, signal.SIGKILL)
    code, _, stderr = wait(survivor, HARD_TIMEOUT)
    seconds = time.monotonic() - start
    nodes.finish([lost])
    return survivors, code, stderr, seconds


def _lost_node(which: str, work: Path, processes: int) -> Outcome:
    label = f"two nodes, the node of the {which} rank lost (agent SIGKILLed)"
    run = Run(work, 2 * processes, {"step_sleep_s": 0.02}, training={"max_steps": 100000, "save_every": 100000})
    nodes = TwoNodes(run)
    agents = nodes.start()
    pids = run.rank_pids()
    time.sleep(0.5)
    rank = 0 if which == "first" else 2 * processes - 1
    survivors, code, stderr, seconds = lose_node(nodes, agents, pids, rank)
    left = [pid for pid in survivors if alive(pid)]
    said = [line for line in error_lines(stderr) if "a peer ended without a notice" in line]
    noise = worker_noise(stderr)
    ok = code != 0 and not left and seconds <= LOST_NODE_BOUND_S and len(said) == len(survivors) and not noise
    outcome = (
        f"other node: exit {code}, {len(left)} left, {len(said)} of {len(survivors)} rank(s) said one line"
        f"{', traceback or C++ frames' if noise else ''}: {said[0][:110] if said else ''}"
    )
    return Outcome(label, processes, ok, with_tail(outcome, ok, stderr, 4, 600), seconds, run.on_disk())


def go_on_without_a_node(work: Path, processes: int) -> Outcome:
    """An elastic job (``--nnodes 1:2``, ``--max-restarts 1``, ``--resume latest``) loses the
    node that does not host the rendezvous store (agent and workers SIGKILLed) after its first
    checkpoint: the other node's agent re-forms a group of one node, whose workers resume from
    that checkpoint at half the world (the accumulation doubled) and reach max_steps; that agent
    exits 0. (The host's loss ends the job: torch's c10d store lives in its agent.)"""
    label = "two elastic nodes (--nnodes 1:2), the node without the store lost, the other goes on"
    training = {"max_steps": 40, "save_every": 4, "eval_every": 1000, "log_every": 1}
    run = Run(work, 2 * processes, {"step_sleep_s": 0.05}, training=training)
    # the group waits for a second node this long once it has one (torch's default: 30 s): at
    # the start too, where 2 s let a loaded machine form the job of one node, the second agent
    # still importing torch
    nodes = TwoNodes(run, max_restarts=1, nnodes="1:2", rdzv_conf="last_call_timeout=5")
    agents = nodes.start("--resume", "latest")
    pids = run.rank_pids()
    first = run.out / "checkpoints" / "step-0000004"
    deadline = time.monotonic() + HARD_TIMEOUT
    while not first.is_dir() and time.monotonic() < deadline:
        time.sleep(0.02)
    rank = next(rank for rank, pid in pids.items() if parent(pid) == agents[1].pid)
    _, code, stderr, seconds = lose_node(nodes, agents, pids, rank)
    train = run.records("train")
    resumed = re.search(r"resumed from \S+/(step-\d+) at step (\d+)", stderr)
    adapted = f"this run has {processes}: training.gradient_accumulation_steps 1 -> 2" in stderr
    worlds = sorted({r["world_size"] for r in train})
    said = [line for line in error_lines(stderr) if "a peer ended without a notice" in line]
    last = train[-1]["step"] if train else None
    ok = code == 0 and bool(resumed) and adapted and last == 40 and worlds == [processes, 2 * processes]
    ok = ok and all(len(line.splitlines()) == 1 for line in said)
    outcome = (
        f"survivor: exit {code}, {len(said)} line(s) on the loss, "
        f"{'resumed from ' + resumed.group(1) if resumed else 'no resume'}"
        f"{', accumulation 1 -> 2' if adapted else ', accumulation not adapted'}, last train step {last}, "
        f"world sizes {worlds}"
    )
    return Outcome(label, processes, ok, with_tail(outcome, ok, stderr, 6, 800), seconds, run.on_disk())
