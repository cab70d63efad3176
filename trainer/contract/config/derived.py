"""The overrides of runs derived from a config: ``--debug``'s run, and each part of stage 1."""

from __future__ import annotations

from typing import Any

from trainer.contract.config.overrides import dotted

#: what --debug sets before the --set overrides: a breakpoint may pause a step for as long as
#: it likes (no watchdog), and everything happens within seconds in this one process
DEBUG_OVERRIDES = [
    "training.max_steps=4",
    "training.eval_every=2",
    "training.save_every=2",
    "training.log_every=1",
    "training.num_workers=0",
    "distributed.watchdog_s=0",
]
#: --debug's outputs: beside the configured directory, replaced by each debug run
DEBUG_SUFFIX = "-debug"


def stage1_part_overrides(
    part: str, section: dict[str, Any], common: dict[str, Any], defaults: dict[str, Any], fixed: dict[str, Any]
) -> dict[str, Any]:
    """The overrides of stage 1's ``part`` (generator, discriminator), later ones winning: what
    the part defaults to, the config's ``stage1.<part>`` section, the command line's ``--set``
    (``common``), its ``--set stage1.<part>.KEY`` (more specific than ``KEY``), then what the part
    must be (its objective, the weights it starts from)."""
    prefix = f"stage1.{part}."
    specific = {key[len(prefix) :]: value for key, value in common.items() if key.startswith(prefix)}
    return {**defaults, **dotted(section), **common, **specific, **fixed}


def overridden_by_command_line(
    part: str, section: dict[str, Any], common: dict[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """The keys of the config's ``stage1.<part>`` section that the command line's plain ``--set``
    sets to another value (a ``--set stage1.<part>.KEY`` is the user's own choice), each with
    (the section's value, the command line's)."""
    prefix = f"stage1.{part}."
    return {
        key: (value, common[key])
        for key, value in dotted(section).items()
        if key in common and common[key] != value and prefix + key not in common
    }
