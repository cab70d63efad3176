"""The run's configuration, owned here: reading (YAML files, model configs that are files,
directories or model ids), precedence (defaults, the file, ``--set``, the command line's flags;
the runs derived from a config), and checking (each section its own values, each task its own
options when it is built).

Hand-written on purpose (about 400 lines): a structured-config library gives the typed merge and
the dotted overrides, but not this project's error contract (one line naming the file and the
dotted key, with the closest valid key for a misspelled one, for the training config, both model
configs and the task's options alike), and it would be one more dependency of every install.
"""

from trainer.contract.config.derived import (
    DEBUG_OVERRIDES,
    DEBUG_SUFFIX,
    overridden_by_command_line,
    stage1_part_overrides,
)
from trainer.contract.config.loading import apply_overrides, load_config
from trainer.contract.config.sections import (
    Config,
    DataSection,
    DistributedSection,
    EvalSection,
    InitSection,
    ModelSection,
    OptimizerSection,
    OptimSection,
    RunConfig,
    Stage1Section,
    as_list,
    check_override_key,
)
from trainer.contract.config.training import LOSSES, TrainingSection

__all__ = [
    "DEBUG_OVERRIDES",
    "DEBUG_SUFFIX",
    "LOSSES",
    "Config",
    "DataSection",
    "DistributedSection",
    "EvalSection",
    "InitSection",
    "ModelSection",
    "OptimSection",
    "OptimizerSection",
    "RunConfig",
    "Stage1Section",
    "TrainingSection",
    "apply_overrides",
    "as_list",
    "check_override_key",
    "load_config",
    "overridden_by_command_line",
    "stage1_part_overrides",
]
