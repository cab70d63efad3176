"""Recipe ``oracle_text``: the synthetic-oracle text benchmark of the text-GAN literature.

A fixed LSTM (the oracle, :mod:`trainer.tasks.oracle`) generates the real sequences. The
generator is a transformers causal LM and the discriminator a transformers sequence
classifier, both built from their config files (no download) or loaded from
``save_pretrained`` directories. Stage 1 trains the generator by maximum likelihood
(``training.objective: mle``) and then the discriminator; stage 2 trains the generator by
policy gradient on the discriminator's reward (REINFORCE with the batch mean as baseline),
optionally mixed with maximum likelihood. Eval generates from the eval sequences' prefixes
and scores ``nll_oracle`` (quality), ``nll_test`` (the generator's NLL on held-out real
sequences: diversity), ``d_accuracy``, ``d_oracle_corr`` (whether the discriminator's
rating of a generated sequence tracks its quality) and ``distinct2`` (distinct bigrams of the
generated sequences: low when they repeat a token, which the oracle may score well).

Token ids: the oracle's vocabulary is 0..V-1; the generator and discriminator have one more
token, V, the start token (also the padding id; never generated).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from trainer.contract.config.schema import require
from trainer.contract.errors import ConfigError
from trainer.contract.task import TensorRows, cache_root
from trainer.tasks.oracle import OracleLSTM
from trainer.tasks.oracle_data import EndlessOracleSequences, OracleSequences, oracle_sequences
from trainer.tasks.sequence_gan import SequenceGanTask
from trainer.tasks.sequence_metrics import discriminator_accuracy, distinct_bigrams, pearson
from trainer.tasks.sequence_objectives import SequenceGanOptions
from trainer.tasks.transformers_models import build_config


@dataclass
class OracleTextOptions(SequenceGanOptions):
    #: the oracle's vocabulary (the models have one more token: the start token)
    vocab_size: int = 5000
    #: tokens per sequence
    seq_len: int = 20
    #: the seed of the random oracle (when data.oracle_path is empty)
    oracle_seed: int = 0
    #: the random oracle's embedding size
    oracle_embed_dim: int = 32
    #: the random oracle's LSTM state size
    oracle_hidden_dim: int = 32
    #: seed of the sampled train and eval sequences (kept apart from training.seed, so that
    #: runs with different seeds see the same data)
    data_seed: int = 0
    #: training: how many distinct real sequences a run trains on: 0, data.train_size's sampled
    #: set; N, the first N rows of that set followed by sequences drawn from the oracle (row i
    #: from data_seed and i) when the run starts; -1, no end: every training sequence a new
    #: one (the set's, then fresh ones drawn as the run takes them). The eval set is the same
    #: in every case
    train_sequences: int = 0
    #: eval: the generator's sampling temperature, also applied to its nll_test (below 1: fewer,
    #: likelier tokens; research/oracle_frontier.py sweeps it to draw the quality-diversity
    #: trade-off a stage 2 must beat)
    eval_temperature: float = 1.0

    def check(self, source: str) -> None:
        super().check(source)
        require(self.vocab_size >= 2, source, "task_options.vocab_size", "must be at least 2")
        require(self.seq_len >= 1, source, "task_options.seq_len", "must be at least 1")
        require(self.eval_temperature > 0, source, "task_options.eval_temperature", "must be positive")
        require(self.train_sequences >= -1, source, "task_options.train_sequences", "must be -1 (no end), 0 or more")


class OracleTextTask(SequenceGanTask):
    """GPT-2-style generator against a sequence-classifier discriminator on oracle data."""

    Options = OracleTextOptions

    def __init__(self, run: Any) -> None:
        super().__init__(run)
        o, cfg = self.options, self.config
        self.start_id = self.pad_id = o.vocab_size
        self.eos_id, self.banned = None, [self.start_id]
        self.validate_training()
        if cfg.data.path:
            raise ConfigError(f"{run.source}: key 'data.path': oracle_text samples its data from the oracle")
        if not 0 <= cfg.eval.prefix_len < o.seq_len:
            raise ConfigError(f"{run.source}: key 'eval.prefix_len' must be less than task_options.seq_len")
        tokens = {"bos_token_id": self.start_id, "pad_token_id": self.start_id, "eos_token_id": None}
        self.generator_hf = build_config(run.generator, run.generator_source, **tokens)
        self.discriminator_hf = build_config(run.discriminator, run.discriminator_source, num_labels=1, **tokens)
        models = ((self.generator_hf, run.generator_source), (self.discriminator_hf, run.discriminator_source))
        for config, source in models:
            if config.vocab_size != o.vocab_size + 1:
                raise ConfigError(
                    f"{source}: key 'vocab_size' is {config.vocab_size}; it must be task_options.vocab_size + 1 "
                    f"= {o.vocab_size + 1} (the start token)"
                )
            positions = getattr(config, "max_position_embeddings", None)
            if positions is not None and positions < o.seq_len + 1:
                raise ConfigError(f"{source}: {positions} positions are fewer than seq_len + 1 = {o.seq_len + 1}")
        self.generator_needs_data = cfg.training.objective == "mle" or o.mle_weight > 0 or self.uses_likelihood_ratio

    # -- the oracle and the data ---------------------------------------------------------------
    @functools.cached_property
    def oracle(self) -> OracleLSTM:
        """The oracle (built on first use, on the CPU)."""
        o, path = self.options, self.config.data.oracle_path
        if path:
            return OracleLSTM.from_file(path, o.vocab_size)
        return OracleLSTM.seeded(o.oracle_seed, o.vocab_size, o.oracle_embed_dim, o.oracle_hidden_dim)

    @functools.cached_property
    def _table(self) -> Any:
        """The train and eval sequences (read, or sampled and cached, once per task)."""
        data = self.config.data
        sizes = {"train": data.train_size, "eval": data.eval_size}
        o = self.options
        return oracle_sequences(self.oracle, o.data_seed, o.seq_len, sizes, cache_root(data.cache_dir))

    def _sequences(self, split: str) -> torch.Tensor:
        return self._table[split].with_format("torch")[:]["input_ids"]

    def train_dataset(self) -> torch.utils.data.Dataset:
        sampled, wanted = self._sequences("train"), self.options.train_sequences
        if wanted == 0:
            return TensorRows(input_ids=sampled)
        sequences = OracleSequences(sampled, self.oracle, self.options.data_seed)
        if wanted == -1:
            return EndlessOracleSequences(sequences)
        return TensorRows(input_ids=sequences.first(wanted, cache_root(self.config.data.cache_dir)))

    def eval_dataset(self) -> torch.utils.data.Dataset:
        # Each eval sequence carries the uniforms its generated tokens are drawn with, so an eval
        # scores the same generated sequences whatever the number of processes or batch size.
        real = self._sequences("eval")
        rng = torch.Generator().manual_seed(self.options.data_seed + 1)
        return TensorRows(real=real, uniforms=torch.rand(real.shape, generator=rng))

    def collate(self, items: Any) -> Any:
        return items  # TensorRows.__getitems__ already returns the batch

    def real(self, batch: Any) -> torch.Tensor:
        return batch["input_ids"]

    # -- models ------------------------------------------------------------------------------
    def build_generator(self) -> nn.Module:
        # A save_pretrained directory given as the model config brings its weights along.
        pretrained = self.load_pretrained("generator", Path(self.run.generator_source))
        return pretrained or AutoModelForCausalLM.from_config(self.generator_hf)

    def build_discriminator(self) -> nn.Module:
        pretrained = self.load_pretrained("discriminator", Path(self.run.discriminator_source))
        model = pretrained or AutoModelForSequenceClassification.from_config(self.discriminator_hf)
        self.check_prefix_head(model, self.run.discriminator_source)
        return model

    def load_pretrained(self, role: str, path: Path) -> nn.Module | None:
        model = super().load_pretrained(role, path)
        if model is not None and model.config.vocab_size != self.options.vocab_size + 1:
            raise ConfigError(
                f"{path}: a {role} with vocabulary {model.config.vocab_size}, "
                f"but task_options.vocab_size + 1 is {self.options.vocab_size + 1}"
            )
        return model

    # -- sampling ------------------------------------------------------------------------------
    def generate(self, generator: nn.Module, num: int, rng: torch.Generator, batch: Any = None) -> torch.Tensor:
        prefix = torch.empty((num, 0), dtype=torch.long, device=rng.device)
        uniforms = torch.rand(num, self.options.seq_len, generator=rng, device=rng.device)
        return self.sample_sequences(generator, prefix, uniforms)

    # -- eval ------------------------------------------------------------------------------------
    def generator_eval(self, generator: nn.Module, batch: Any, temperature: float) -> dict[str, torch.Tensor]:
        """The generator's part of the eval of one batch at ``temperature``: the generated
        sequences (prefix included) and their ``nll_oracle``, and ``nll_test`` of the real ones."""
        real, prefix_len = batch["real"], self.config.eval.prefix_len
        tokens = self.sample_sequences(generator, real[:, :prefix_len], batch["uniforms"][:, prefix_len:], temperature)
        oracle = self.oracle.to(real.device)
        return {
            "nll_oracle": -oracle.token_log_probs(tokens)[:, prefix_len:].mean(1),
            "nll_test": -self.token_log_probs(generator, real, temperature).mean(1),
            "sequences": tokens,
        }

    def eval_outputs(self, generator: nn.Module, discriminator: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        outputs = self.generator_eval(generator, batch, self.options.eval_temperature)
        tokens = outputs.pop("sequences")
        outputs["d_real"] = self.score(discriminator, batch["real"]).float()
        outputs["d_fake"] = self.score(discriminator, tokens).float()
        outputs["generated"] = tokens[:, self.config.eval.prefix_len :]
        return outputs

    def eval_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        return {
            "nll_oracle": float(outputs["nll_oracle"].double().mean()),
            "nll_test": float(outputs["nll_test"].double().mean()),
            "d_accuracy": discriminator_accuracy(outputs),
            "d_oracle_corr": pearson(outputs["d_fake"], -outputs["nll_oracle"]),
            "distinct2": distinct_bigrams(outputs["generated"].tolist()),
        }

    def on_eval(self, step: int, outputs: dict[str, torch.Tensor], output_dir: Path, trackers: list[Any]) -> None:
        count = self.options.write_samples
        if count <= 0:
            return
        rows = outputs["generated"][:count].tolist()
        path = output_dir / "samples" / f"step-{step:07d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        texts = [" ".join(str(t) for t in row if t >= 0) for row in rows]
        path.write_text("".join(text + "\n" for text in texts))
        for tracker in trackers:  # a string value is text to accelerate's trackers (add_text)
            tracker.log({"samples": "\n\n".join(texts)}, step=step)
