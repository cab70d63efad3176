"""LoRA (any PEFT adapter) on the generator and the discriminator (``model.peft``,
``model.discriminator_peft``), with the ``peft`` library.

The base weights stay frozen and only the adapter trains: checkpoints hold the adapter's
weights alone, and the generator with its adapter switched off is the frozen reference the
KL penalty measures from, so that reference costs no second copy of the weights.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from torch import nn

from trainer.contract.errors import ConfigError

#: the PEFT task type of each role's transformers model (the discriminator's head is then
#: trained whole: PEFT adds a sequence classifier's ``score``/``classifier`` to modules_to_save)
TASK_TYPES = {"generator": "CAUSAL_LM", "discriminator": "SEQ_CLS"}
#: the directory of an export's adapter, beside the merged model's
ADAPTER_SUFFIX = "-adapter"


def require_peft(key: str, source: str) -> Any:
    """The ``peft`` module; one line naming the key when it is not installed."""
    try:
        import peft
    except ImportError:
        raise ConfigError(
            f"{source}: key '{key}' needs the peft library: pip install 'trainer[peft]' (or pip install peft)"
        ) from None
    return peft


def adapter_config(spec: dict[str, Any] | str, role: str, key: str, source: str, transformers_model: bool) -> Any:
    """The PEFT config ``spec`` describes: a mapping of ``peft.LoraConfig`` fields, or a saved
    adapter (a directory with ``adapter_config.json``, or that file) whose config is reused."""
    peft = require_peft(key, source)
    if isinstance(spec, str):
        path = Path(spec)
        directory = path.parent if path.name == "adapter_config.json" else path
        if not (directory / "adapter_config.json").is_file():
            raise ConfigError(f"{source}: key '{key}' names {spec!r}, which holds no adapter_config.json")
        try:
            config = peft.PeftConfig.from_pretrained(str(directory))
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(f"{directory / 'adapter_config.json'}: not a PEFT adapter config: {exc}") from None
        config.inference_mode = False
        return config
    fields = dict(spec)
    if transformers_model:
        fields.setdefault("task_type", TASK_TYPES[role])
    try:
        return peft.LoraConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: key '{key}': not a LoRA config: {exc}") from None


def with_adapter(model: nn.Module, spec: dict[str, Any] | str, role: str, key: str, source: str) -> nn.Module:
    """``model`` with a fresh adapter of ``spec`` (its base weights frozen; PEFT lets the
    gradients through blocks that gradient checkpointing recomputes); ``model`` itself when
    ``spec`` is empty (no adapter)."""
    if spec == "":
        return model
    peft = require_peft(key, source)
    transformers_model = hasattr(model, "config") and hasattr(model, "save_pretrained")
    config = adapter_config(spec, role, key, source, transformers_model)
    if isinstance(spec, dict) and "fan_in_fan_out" not in spec:
        # GPT-2's projections are transformers' Conv1D (weights stored transposed): PEFT
        # would set this itself, with a warning
        config.fan_in_fan_out = any(type(module).__name__ == "Conv1D" for module in model.modules())
    try:
        adapted = peft.get_peft_model(model, config)
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{source}: key '{key}': cannot add the adapter to the {role}: {exc}") from None
    return adapted


def is_adapted(model: nn.Module) -> bool:
    """Whether ``model`` (unwrapped) carries a PEFT adapter."""
    # a model carries one only where peft is imported already; importing it to ask costs a
    # run of plain torch models seconds (peft imports transformers' modeling stack)
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


class AdapterOff(nn.Module):
    """The generator with its adapter switched off, as a frozen model: calls and ``generate``
    run the base weights alone. The generator is held, not registered: this module has no
    parameters of its own, and nothing it is asked (a mode, gradients, a state dict, a move)
    reaches the generator."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._held = [model]

    @property
    def adapted(self) -> nn.Module:
        """The generator it holds (with its adapter)."""
        return self._held[0]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        model = self._held[0]
        with model.disable_adapter():
            return model(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        model = self._held[0]
        with model.disable_adapter():
            return model.generate(*args, **kwargs)


class AdapterWeights(nn.Module):
    """What accelerate's checkpoint loads into in place of an adapted model: its adapter's
    weights only, as a state dict (the base weights come from the run's start again)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._held = [model]  # not a submodule: its own state dict stays the adapter's

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self._held[0], save_embedding_layers=False)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self._held[0], state_dict)
        # set_peft_model_state_dict reports the base weights as missing; only an adapter
        # weight that is missing, or one that is not the adapter's, is wrong here
        missing = [k for k in result.missing_keys if "lora_" in k or "modules_to_save" in k]
        return nn.modules.module._IncompatibleKeys(missing, list(result.unexpected_keys))


def checkpoint_adapters_only(accelerator: Accelerator) -> None:
    """Make accelerate's checkpoints hold an adapted model's adapter weights alone (its hooks
    for this: the weights it is about to save, and the models it is about to load into)."""

    def save(models: list[nn.Module], weights: list[dict[str, Any]], output_dir: str) -> None:
        for index, model in enumerate(models):
            unwrapped = accelerator.unwrap_model(model)
            if is_adapted(unwrapped):
                weights[index] = AdapterWeights(unwrapped).state_dict()

    def load(models: list[nn.Module], input_dir: str) -> None:
        for index, model in enumerate(models):
            unwrapped = accelerator.unwrap_model(model)
            if is_adapted(unwrapped):
                models[index] = AdapterWeights(unwrapped)

    accelerator.register_save_state_pre_hook(save)
    accelerator.register_load_state_pre_hook(load)


def adapted_exports(model: nn.Module, directory: Path, merge: bool) -> dict[Path, Callable[[Path], None]]:
    """How to write an adapted model (unwrapped) into ``directory``, by the directory each writer
    fills: with ``merge``, the base with the adapter merged in (``save_pretrained``:
    ``from_pretrained`` and ``pipeline`` load it as any model) and the adapter beside it in
    ``DIRECTORY-adapter``; else the adapter alone (``PeftModel.from_pretrained`` loads it onto
    its base, and so does transformers' ``from_pretrained``)."""

    def adapter(path: Path) -> None:
        model.save_pretrained(str(path), save_embedding_layers=False)

    def merged(path: Path) -> None:
        # A copy is merged: merging in place and back would not restore the weights bit for bit.
        copy.deepcopy(model).merge_and_unload().save_pretrained(str(path))

    if not merge:
        return {directory: adapter}
    return {directory: merged, directory.with_name(directory.name + ADAPTER_SUFFIX): adapter}
