"""Where numbers go: ``metrics.jsonl`` and accelerate's trackers (main process only)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from trainer.contract.config import Config
from trainer.contract.config.schema import to_mapping
from trainer.state import storage


def resolve_trackers(names: list[str]) -> list[str]:
    """Tracker names for accelerate; ``auto`` is tensorboard when it is installed."""
    resolved = []
    for name in names:
        if name == "auto":
            if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
                resolved.append("tensorboard")
        elif name not in ("none", ""):
            resolved.append(name)
    return list(dict.fromkeys(resolved))


#: the keyword that names a run when a tracker starts, by tracker (accelerate passes the rest
#: of a tracker's init_kwargs on; tensorboard, aim and comet take the project as the run's name)
RUN_NAME_KEYS = {"wandb": "name", "mlflow": "run_name"}


def tracker_settings(cfg: Config, trackers: list[str]) -> tuple[str, dict[str, dict[str, Any]]]:
    """The project name and the start keyword arguments of each tracker, by tracker: the
    config's ``tracker_init_kwargs`` with ``run_name`` under each tracker's own keyword."""
    t = cfg.training
    kwargs = {name: dict(values) for name, values in t.tracker_init_kwargs.items()}
    if t.run_name:
        for name in trackers:
            if name in RUN_NAME_KEYS:
                kwargs.setdefault(name, {}).setdefault(RUN_NAME_KEYS[name], t.run_name)
    return t.project_name or Path(cfg.output_dir).name, kwargs


def flat_hparams(cfg: Config) -> dict[str, Any]:
    """The config as flat scalar hyper-parameters, as trackers want them."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}{key}.", value)
        elif isinstance(node, (int, float, str, bool)):
            flat[prefix[:-1]] = node
        else:
            flat[prefix[:-1]] = str(node)

    walk("", to_mapping(cfg))
    return flat


class MetricsLog:
    """Appends one JSON record per (split, step) to ``metrics.jsonl`` and logs to trackers.

    On resume from step N, records after N (from the interrupted run) are dropped, so each
    (split, step) pair appears once.
    """

    def __init__(self, accelerator: Accelerator, output_dir: Path, resumed_step: int | None) -> None:
        self.accelerator = accelerator
        self.path = output_dir / "metrics.jsonl"
        self.world_size = accelerator.num_processes
        if not accelerator.is_main_process:
            return
        kept = []
        if resumed_step is not None and self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:  # a record cut by a full disk (or blank): it was never whole
                    continue
                if record["step"] <= resumed_step:
                    kept.append(line + "\n")
        storage.write_whole(self.path, "".join(kept))  # a full disk cannot cut the records kept

    def write(self, split: str, step: int, values: dict[str, Any]) -> None:
        """Record ``values`` for ``split`` at ``step`` (a no-op off the main process)."""
        if not self.accelerator.is_main_process:
            return
        record = {"step": step, "split": split, "world_size": self.world_size, **values}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        scalars = {f"{split}/{k}": v for k, v in values.items() if isinstance(v, (int, float))}
        self.accelerator.log(scalars, step=step)


def start_trackers(accelerator: Accelerator, cfg: Config, trackers: list[str]) -> None:
    """Start the run's trackers (accelerate's init_trackers: the main process's), with the config
    as hyper-parameters."""
    if trackers:
        project, init_kwargs = tracker_settings(cfg, trackers)
        accelerator.init_trackers(project, config=flat_hparams(cfg), init_kwargs=init_kwargs)


def finish_trackers(accelerator: Accelerator) -> None:
    """Flush and close the trackers (the main process's)."""
    if accelerator.is_main_process:
        for tracker in accelerator.trackers:
            tracker.finish()
