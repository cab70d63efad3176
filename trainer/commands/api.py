"""The Python API: the same runs as the command line, from a script or a notebook.

    from trainer import load_config, Trainer, launch

    run = load_config("configs/training/ring.yaml", {"training.max_steps": 500})
    metrics = Trainer(run, device="cpu").fit()           # in this process
    Trainer(run, device="cpu").evaluate("outputs/ring/final")
    launch("configs/training/ring.yaml", num_processes=2, overrides={"training.max_steps": 500})

Each ``fit()`` or ``evaluate()`` releases Accelerate's per-process state when it ends, so
the next one in the same kernel starts clean.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.contract.config import RunConfig, load_config
from trainer.contract.errors import UserError
from trainer.distributed.world import end_process_group, release_accelerator
from trainer.training.loop import Trainer


def _fit_in_each_process(run: RunConfig, device: str, resume: str | None, overwrite: bool) -> None:
    """What every launched process runs: the trainer, ended with one error line on bad input."""
    from trainer.commands.cli import failure_status, report

    try:
        Trainer(run, device=device, resume=resume, overwrite=overwrite).fit()
    except UserError as exc:
        raise SystemExit(report(exc, os.environ.get("RANK", "0"))) from None
    except Exception as exc:
        raise SystemExit(failure_status(exc)) from None
    finally:
        end_process_group()


def check_cuda_untouched(device: str) -> None:
    """A UserError when the processes would use CUDA after this process (a notebook's kernel)
    has: accelerate's notebook_launcher forks them, and a forked process cannot use CUDA."""
    import torch

    if device in ("auto", "cuda") and torch.cuda.is_available() and torch.cuda.is_initialized():
        raise UserError(
            "launch: this kernel has used CUDA already, and processes forked from it cannot: restart the "
            "kernel and call launch(...) before anything else touches the GPU (or train in the kernel "
            "itself with Trainer(run).fit(), one GPU)"
        )


def launch(
    target: Callable[..., Any] | str | Path | RunConfig,
    num_processes: int = 2,
    overrides: dict[str, Any] | None = None,
    device: str = "auto",
    resume: str | None = None,
    args: tuple[Any, ...] = (),
    overwrite: bool = False,
) -> dict[str, Any] | None:
    """Run ``target`` in ``num_processes`` processes through accelerate's ``notebook_launcher``.

    ``target`` is a function (called in every process with ``args``), or a training config
    (a path, with ``overrides``, or a :class:`RunConfig`): then every process trains it, as
    ``accelerate launch`` would, and the last eval record of ``metrics.jsonl`` is returned
    (``resume`` and ``overwrite`` as for :class:`Trainer`).
    On a machine without GPUs the processes are CPU processes over gloo.
    """
    from accelerate import notebook_launcher

    check_cuda_untouched(device)
    if callable(target):
        function, function_args, run = target, args, None
    else:
        run = target if isinstance(target, RunConfig) else load_config(target, overrides)
        function, function_args = _fit_in_each_process, (run, device, resume, overwrite)
    release_accelerator()  # whatever an earlier cell left behind would stop the launcher
    notebook_launcher(function, function_args, num_processes=num_processes)
    if run is None:
        return None
    lines = (Path(run.config.output_dir) / "metrics.jsonl").read_text().splitlines()
    evals = [record for record in map(json.loads, filter(str.strip, lines)) if record["split"] == "eval"]
    return evals[-1] if evals else None
