"""Recipe ``text``: your own pretrained causal LM against your own classifier, on your own texts.

The generator is any transformers causal LM (``AutoModelForCausalLM``) and the discriminator any
sequence classifier with one label (``AutoModelForSequenceClassification``), each named by a
``save_pretrained`` directory, a model id, or a YAML of config fields for a fresh model; the
discriminator may be the word ``generator`` (its body, a new score head). The tokenizer is
``model.tokenizer`` or the generator's. Texts come from local files (text, json/jsonl, csv,
parquet), are tokenized with ``Dataset.map`` (cached by datasets), truncated and ended with
the end-of-sequence token.

Stage 1 trains the generator by maximum likelihood (``training.objective: mle``), then the
discriminator; stage 2 is REINFORCE on the discriminator's ratings (see
:mod:`trainer.tasks.sequence_gan`), with optional maximum-likelihood and KL terms. Eval
generates one sequence per held-out text and scores ``nll_test``, ``d_accuracy``,
``mean_length`` and ``distinct2``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
)

from trainer.contract.config import as_list
from trainer.contract.config.model_configs import is_model_source
from trainer.contract.config.schema import require
from trainer.contract.errors import ConfigError, DataError
from trainer.contract.task import cache_root
from trainer.tasks.sequence_gan import SequenceGanTask
from trainer.tasks.sequence_metrics import discriminator_accuracy, distinct_bigrams, mean_bleu
from trainer.tasks.sequence_objectives import SequenceGanOptions
from trainer.tasks.text_data import has_text, read_dataset, read_texts, tokenize
from trainer.tasks.transformers_models import build_config

logger = logging.getLogger("trainer")


@dataclass
class TextOptions(SequenceGanOptions):
    #: the column of json, csv and parquet files that holds the texts (text files: each line)
    text_column: str = "text"
    #: tokens kept of each text, its end-of-sequence token included
    max_length: int = 64
    #: tokens generated per sequence (fewer when it ends with the end-of-sequence token)
    max_new_tokens: int = 32
    #: sampling temperature, in training and eval
    temperature: float = 1.0
    #: generate from the first this many tokens of a real text (0: unconditional); texts
    #: shorter than that are left out
    prompt_len: int = 0
    #: eval: BLEU and Self-BLEU over the first this many generated texts (their cost grows
    #: with the square of it)
    bleu_samples: int = 200

    def check(self, source: str) -> None:
        super().check(source)
        for name in ("max_length", "max_new_tokens", "bleu_samples"):
            require(getattr(self, name) >= 2, source, f"task_options.{name}", "must be at least 2")
        require(self.temperature > 0, source, "task_options.temperature", "must be positive")
        require(
            0 <= self.prompt_len < self.max_length - 1,
            source,
            "task_options.prompt_len",
            "must be in [0, max_length - 1)",
        )


def model_config(fields: dict[str, Any], source: str, **forced: Any) -> PretrainedConfig:
    """The transformers config of a model to load (stock config.json fields accepted as
    transformers accepts them) or of a fresh model from YAML (checked key by key)."""
    if not is_model_source(source):
        return build_config(fields, source, **forced)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = fields.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ConfigError(f"{source}: config.json has model_type {model_type!r}, unknown to transformers")
    return CONFIG_MAPPING[model_type].from_dict({**fields, **forced})


class TextTask(SequenceGanTask):
    """A pretrained causal LM against a sequence classifier on local texts."""

    Options = TextOptions

    def __init__(self, run: Any) -> None:
        super().__init__(run)
        o, cfg = self.options, self.config
        self.validate_training()
        if cfg.data.path:
            raise ConfigError(f"{run.source}: key 'data.path': the text recipe reads data.train_files")
        if not (as_list(cfg.data.train_files) or cfg.data.dataset):
            raise ConfigError(
                f"{run.source}: key 'data.train_files' is empty: name your training texts (or data.dataset)"
            )
        if not (as_list(cfg.data.eval_files) or cfg.data.dataset) and cfg.data.eval_fraction <= 0:
            raise ConfigError(f"{run.source}: key 'data.eval_files' is empty and data.eval_fraction is 0")
        if cfg.eval.prefix_len:
            raise ConfigError(f"{run.source}: key 'eval.prefix_len': the text recipe generates unconditionally (0)")
        self.tokenizer = self._tokenizer()
        tok = self.tokenizer
        self.eos_id = tok.eos_token_id
        self.pad_id = tok.pad_token_id
        self.start_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        self.banned = sorted({self.start_id, self.pad_id} - {self.eos_id})
        self.generator_hf = model_config(run.generator, run.generator_source)
        self.discriminator_hf = model_config(
            run.discriminator, run.discriminator_source, num_labels=1, pad_token_id=self.pad_id
        )
        for config, source in (
            (self.generator_hf, run.generator_source),
            (self.discriminator_hf, run.discriminator_source),
        ):
            if config.vocab_size < len(tok):
                raise ConfigError(
                    f"{source}: a vocabulary of {config.vocab_size} is smaller than the tokenizer's {len(tok)}"
                )
            positions = getattr(config, "max_position_embeddings", None)
            longest = max(o.max_length, o.max_new_tokens + 1)
            if positions is not None and positions < longest:
                raise ConfigError(f"{source}: {positions} positions are fewer than the {longest} a sequence needs")
        self.prompt_len = o.prompt_len
        # The generator phase takes real texts for its MLE term, or for its prompts.
        needs_data = (cfg.training.objective == "mle", o.mle_weight > 0, self.uses_likelihood_ratio, o.prompt_len > 0)
        self.generator_needs_data = any(needs_data)

    def _tokenizer(self) -> Any:
        """``model.tokenizer``, else the generator's; without a pad token, end-of-sequence pads."""
        source = self.config.model.tokenizer or self.run.generator_source
        if not is_model_source(source):
            raise ConfigError(
                f"{self.run.source}: key 'model.tokenizer' is empty and the generator ({source}) is a YAML "
                "config: name a tokenizer directory or id"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as exc:
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise ConfigError(f"{source}: cannot load a tokenizer: {first[:200]}") from None
        if tokenizer.eos_token_id is None:
            raise ConfigError(f"{source}: the tokenizer has no end-of-sequence token (eos_token)")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"  # training batches; generate's prompts are one start token
        return tokenizer

    # -- data ------------------------------------------------------------------------------------
    @functools.cached_property
    def _splits(self) -> dict[str, Any]:
        """Tokenized train and eval texts (datasets caches the tokenization: a rerun is free)."""
        data, o = self.config.data, self.options
        cache = cache_root(data.cache_dir) / "datasets"
        train_files, eval_files = as_list(data.train_files), as_list(data.eval_files)
        if data.dataset:
            train_files = [data.dataset]
            hold_out = not eval_files and data.eval_fraction > 0
            train, held_out = read_dataset(
                data.dataset,
                data.dataset_config,
                data.train_split,
                data.eval_split,
                o.text_column,
                cache,
                eval_required=not (eval_files or hold_out),
            )
        else:
            train, held_out = read_texts(train_files, o.text_column, cache), None
        if eval_files:
            held_out = read_texts(eval_files, o.text_column, cache)
        elif held_out is None:
            split = train.train_test_split(test_size=data.eval_fraction, seed=self.config.training.seed)
            train, held_out = split["train"], split["test"]
        splits = {}
        for name, table, files in (("train", train, train_files), ("eval", held_out, eval_files or train_files)):
            before = len(table)
            table = table.filter(has_text)
            if before != len(table):
                logger.info(f"{name} texts: skipped {before - len(table)} empty rows of {before}")
            if len(table) == 0:
                raise DataError(f"{', '.join(files)}: no {name} text that is not empty")
            ending = {"tokenizer": self.tokenizer, "max_length": o.max_length, "eos_id": self.eos_id}
            table = table.map(tokenize, batched=True, remove_columns=["text"], fn_kwargs=ending)
            if o.prompt_len:
                before = len(table)
                table = table.filter(lambda row: len(row["input_ids"]) > o.prompt_len)
                logger.info(f"{name} texts: left out {before - len(table)} of at most prompt_len tokens")
                if len(table) == 0:
                    raise DataError(f"{', '.join(files)}: no {name} text longer than task_options.prompt_len")
            splits[name] = table
        return splits

    def train_dataset(self) -> torch.utils.data.Dataset:
        return self._splits["train"]

    def eval_dataset(self) -> torch.utils.data.Dataset:
        # Each eval text carries the uniforms its generated tokens are drawn with, so an eval
        # scores the same generated sequences whatever the number of processes or batch size.
        table = self._splits["eval"]
        rng = torch.Generator().manual_seed(self.config.training.seed + 1)
        uniforms = torch.rand(len(table), self.options.max_new_tokens, generator=rng)
        return table.add_column("uniforms", uniforms.tolist())

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer.pad({"input_ids": [item["input_ids"] for item in items]}, return_tensors="pt")
        out = {"input_ids": batch["input_ids"]}
        if "uniforms" in items[0]:
            out["uniforms"] = torch.tensor([item["uniforms"] for item in items])
        return out

    def real(self, batch: Any) -> torch.Tensor:
        return batch["input_ids"]

    # -- models ----------------------------------------------------------------------------------
    def _finish(self, model: nn.Module) -> nn.Module:
        model.config.pad_token_id = self.pad_id
        if self.config.model.gradient_checkpointing:
            # transformers 5.25 renamed it (the old name warns); the floor, 4.45, has the old only
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        return model.to(getattr(torch, self.config.model.dtype))

    def build_generator(self) -> nn.Module:
        source = self.run.generator_source
        if is_model_source(source):
            return self._finish(self.pretrained("generator", source))
        return self._finish(AutoModelForCausalLM.from_config(self.generator_hf))

    def build_discriminator(self) -> nn.Module:
        source = self.run.discriminator_source
        if is_model_source(source):
            model = self.pretrained("discriminator", source)
        else:
            model = AutoModelForSequenceClassification.from_config(self.discriminator_hf)
        self.check_prefix_head(model, source)
        return self._finish(model)

    def load_pretrained(self, role: str, path: Path) -> nn.Module | None:
        model = super().load_pretrained(role, path)
        return None if model is None else self._finish(model)

    def save_with(self, role: str, directory: Path) -> None:
        """Beside exported weights: the tokenizer, and the generator's sampling settings, so that
        ``pipeline("text-generation", model=directory)`` generates as the eval does."""
        self.tokenizer.save_pretrained(directory)
        if role == "generator":
            o = self.options
            GenerationConfig(
                do_sample=True,
                max_new_tokens=o.max_new_tokens,
                temperature=o.temperature,
                top_k=o.top_k or None,
                top_p=o.top_p,
                bos_token_id=self.start_id,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
            ).save_pretrained(directory)

    # -- sampling --------------------------------------------------------------------------------
    def prompts(self, num: int, batch: Any, device: torch.device) -> torch.Tensor:
        """The first ``prompt_len`` tokens of the batch's first ``num`` texts (none when 0)."""
        if not self.prompt_len:
            return torch.empty((num, 0), dtype=torch.long, device=device)
        return self.real(batch)[:num, : self.prompt_len]

    def generate(self, generator: nn.Module, num: int, rng: torch.Generator, batch: Any = None) -> torch.Tensor:
        uniforms = torch.rand(num, self.options.max_new_tokens, generator=rng, device=rng.device)
        return self.sample_sequences(
            generator, self.prompts(num, batch, rng.device), uniforms, self.options.temperature
        )

    # -- eval ------------------------------------------------------------------------------------
    def eval_outputs(self, generator: nn.Module, discriminator: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        real = batch["input_ids"]
        prompts = self.prompts(real.shape[0], batch, real.device)
        tokens = self.sample_sequences(generator, prompts, batch["uniforms"], self.options.temperature)
        real_mask, fake_mask = self.valid_mask(real), self.valid_mask(tokens)
        log_p = self.token_log_probs(generator, real, self.options.temperature)
        return {
            "nll_test": -(log_p * real_mask).sum(1) / real_mask.sum(1),
            "d_real": self.score(discriminator, real).float(),
            "d_fake": self.score(discriminator, tokens).float(),
            "length": fake_mask.sum(1),
            "generated": tokens.masked_fill(fake_mask == 0, self.eval_pad_value),
        }

    def decode(self, rows: list[list[int]]) -> list[str]:
        """Texts of token-id rows (eval padding and the end-of-sequence token dropped), with
        whitespace collapsed."""
        texts = self.tokenizer.batch_decode([[t for t in row if t >= 0 and t != self.eos_id] for row in rows])
        return [" ".join(text.split()) for text in texts]

    @functools.cached_property
    def _reference_words(self) -> list[list[str]]:
        """The held-out texts as words: BLEU's references."""
        return [text.split() for text in self.decode(self._splits["eval"]["input_ids"])]

    def eval_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        rows = outputs["generated"].tolist()
        words = [text.split() for text in self.decode(rows[: self.options.bleu_samples])]
        return {
            "nll_test": float(outputs["nll_test"].double().mean()),
            "d_accuracy": discriminator_accuracy(outputs),
            "mean_length": float(outputs["length"].double().mean()),
            "distinct2": distinct_bigrams(rows),
            "bleu4": mean_bleu(words, lambda _: self._reference_words),
            "self_bleu4": mean_bleu(words, lambda i: words[:i] + words[i + 1 :]),
        }

    def on_eval(self, step: int, outputs: dict[str, torch.Tensor], output_dir: Path, trackers: list[Any]) -> None:
        count = self.options.write_samples
        if count <= 0:
            return
        texts = self.decode(outputs["generated"][:count].tolist())
        path = output_dir / "samples" / f"step-{step:07d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(text + "\n" for text in texts))
        for tracker in trackers:  # a string value is text to accelerate's trackers (add_text)
            tracker.log({"samples": "\n\n".join(texts)}, step=step)
