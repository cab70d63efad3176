"""What the text recipes share: sampling with ``generate``, per-token log-probabilities, the
discriminator's ratings of every prefix, and REINFORCE on them (the SeqGAN family).

Sequences are token tensors [batch, length]. A recipe with an end-of-sequence token (``text``)
ends each sequence at its first one; what follows is padding, excluded from every loss and
metric by :meth:`SequenceGanTask.valid_mask`. A recipe without one (``oracle_text``) has
sequences of one fixed length, and every mean is a plain mean.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import extract_model_from_parallel
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GenerationConfig,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from trainer.contract import losses
from trainer.contract.errors import ConfigError
from trainer.contract.task import Penalties, Task
from trainer.state.adapters import AdapterOff
from trainer.tasks.sampling import InverseCdfSampling
from trainer.tasks.sequence_forwards import SequenceForwards, without_mask_notice
from trainer.tasks.sequence_objectives import (
    kl_estimate,
    likelihood_ratio_objective,
    masked_mean,
    pad_right,
    reinforce_advantages,
)
from trainer.tasks.transformers_models import from_pretrained, load_pretrained

logger = logging.getLogger("trainer")


class SequenceGanTask(SequenceForwards, Task):
    """A causal-LM generator against a sequence-classifier discriminator.

    Subclasses set ``start_id`` (the token every sequence is generated after), ``pad_id``,
    ``eos_id`` (None: fixed-length sequences) and ``banned`` (ids never sampled), and provide
    the data and the eval.
    """

    #: REINFORCE scores samples drawn without gradients: they may be the discriminator phase's
    takes_shared_samples = True
    #: generated sequences continue this many tokens of a real one (0: from the start token)
    prompt_len: int = 0

    def validate_training(self) -> None:
        """Refuse, with the key named, what the text recipes cannot train: gradient penalties
        (they need continuous inputs), and ``ddo``/``spin`` beside a discriminator to train."""
        cfg, o = self.config, self.options
        if cfg.training.loss == "wasserstein" or cfg.training.r1_weight > 0:
            raise ConfigError(
                f"{self.run.source}: key 'training.loss'/'training.r1_weight': gradient penalties need "
                f"continuous inputs; {cfg.task} takes non_saturating, hinge or least_squares and no R1"
            )
        if self.uses_likelihood_ratio:
            if cfg.training.d_steps_per_g_step > 0:
                raise ConfigError(
                    f"{self.run.source}: key 'training.d_steps_per_g_step': task_options.generator_objective "
                    f"{o.generator_objective} trains no discriminator network (its discriminator is the "
                    "generator's likelihood ratio); set it to 0"
                )
            if o.round_steps and cfg.model.peft != "":
                raise ConfigError(
                    f"{self.run.source}: key 'task_options.round_steps': with model.peft the reference is the "
                    "generator with its adapter off, which rounds cannot move; set it to 0"
                )

    @property
    def uses_likelihood_ratio(self) -> bool:
        """Whether stage 2 trains the generator by ``ddo`` or ``spin`` (a stage-1 run does not)."""
        adversarial = self.config.training.objective == "adversarial"
        return adversarial and self.options.generator_objective in ("ddo", "spin")

    def generated_mask(self, sequences: torch.Tensor) -> torch.Tensor | None:
        """:meth:`valid_mask` without the prompt: the positions the generator chose (None:
        every position)."""
        mask = self.valid_mask(sequences)
        if not self.prompt_len:
            return mask
        chosen = (torch.arange(sequences.shape[1], device=sequences.device) >= self.prompt_len).float()
        return chosen.expand(sequences.shape) if mask is None else mask * chosen

    # -- models --------------------------------------------------------------------------------
    def pretrained(self, role: str, source: str) -> nn.Module:
        """The generator (a causal LM) or the discriminator (a classifier with one label) that a
        ``save_pretrained`` directory or a model id holds."""
        if role == "generator":
            return from_pretrained(AutoModelForCausalLM, source, "generator")
        # num_labels=1: a causal LM's checkpoint (the generator's) gives the body, a new head
        return from_pretrained(
            AutoModelForSequenceClassification, source, "discriminator", num_labels=1, pad_token_id=self.pad_id
        )

    def load_pretrained(self, role: str, path: Path) -> nn.Module | None:
        if not (path.is_dir() and (path / "config.json").is_file()):
            return None
        return self.pretrained(role, str(path))

    def check_prefix_head(self, model: nn.Module, source: str) -> None:
        """Prefix rewards need the classifier's head on every position (a ``score`` module)."""
        if self.options.reward == "prefix" and not isinstance(getattr(model, "score", None), nn.Module):
            raise ConfigError(
                f"{source}: a {type(model).__name__} has no per-position 'score' head (causal classifiers "
                "such as gpt2 and llama have); set task_options.reward: sequence"
            )

    # -- sampling and scoring ------------------------------------------------------------------
    def warpers(self, temperature: float) -> list[Any]:
        """The logits processors before sampling: temperature, top-k, top-p (those in use)."""
        o = self.options
        chain: list[Any] = []
        if temperature != 1.0:
            chain.append(TemperatureLogitsWarper(temperature))
        if o.top_k > 0:
            chain.append(TopKLogitsWarper(o.top_k))
        if o.top_p < 1.0:
            chain.append(TopPLogitsWarper(o.top_p))
        return chain

    def sample_sequences(
        self, generator: nn.Module, prefix: torch.Tensor, uniforms: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        """``prefix`` [batch, p] continued by the generator's ``generate`` (KV cache) for up to
        ``uniforms.shape[1]`` tokens, token t drawn with ``uniforms[:, t]``; a sequence that
        ends early is padded."""
        model = extract_model_from_parallel(generator)
        start = torch.full((prefix.shape[0], 1), self.start_id, dtype=torch.long, device=prefix.device)
        prompt = torch.cat([start, prefix], dim=1)
        generation = GenerationConfig(
            do_sample=False,  # the sampling is InverseCdfSampling's
            max_new_tokens=uniforms.shape[1],
            bos_token_id=self.start_id,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            use_cache=True,
        )
        processors = [*self.warpers(temperature), InverseCdfSampling(uniforms, prompt.shape[1], self.banned)]
        with without_mask_notice():
            output = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                generation_config=generation,
                logits_processor=LogitsProcessorList(processors),
            )
        return output[:, 1:]

    # -- forwards of valid tokens only (trainer.tasks.packing) --------------------------------
    def discriminator_loss(
        self,
        discriminator: nn.Module,
        real: torch.Tensor,
        fake: torch.Tensor,
        rng: torch.Generator,
        penalties: Penalties,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        real, fake = pad_right([real, fake], self.pad_id)
        if self.options.reward == "sequence":
            return super().discriminator_loss(discriminator, real, fake, rng, penalties)
        # Real and generated sequences in one forward; every real prefix is a labelled example.
        both = torch.cat([real, fake])
        scores = self.prefix_scores(discriminator, both)
        # A generated sequence's prompt is real text: only what the generator chose is fake.
        keep = (self.valid_mask(real), self.generated_mask(fake))
        if keep[0] is not None and keep[1] is not None:
            real_scores, fake_scores = (s[k.bool()] for s, k in zip(scores.chunk(2), keep, strict=True))
        else:
            real_scores, fake_scores = (s.reshape(-1) for s in scores.chunk(2))
        loss = losses.discriminator_loss(self.config.training.loss, real_scores, fake_scores)
        return loss, {"d_real": real_scores.detach().mean(), "d_fake": fake_scores.detach().mean()}

    def _advantages(self, fake: torch.Tensor, discriminator: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token advantages [batch, length] of generated sequences (0 on padding), and
        their mean reward (:func:`reinforce_advantages`)."""
        o = self.options
        ratings = self.score(discriminator, fake) if o.reward == "sequence" else self.prefix_scores(discriminator, fake)
        return reinforce_advantages(ratings, self.generated_mask(fake), o.discount, o.normalize_advantage)

    # -- the reference model of the KL penalty ---------------------------------------------------
    @functools.cached_property
    def reference(self) -> nn.Module:
        """The frozen generator the KL penalty, ddo and spin measure from: ``init.generator`` (the stage-1
        generator), else the pretrained generator the run starts from; with an adapter on the
        generator (``model.peft``), the generator with its adapter off."""
        if self.adapted_generator is not None:
            # the base weights under the adapter are the starting generator's: no second copy
            return AdapterOff(self.adapted_generator)
        source = self.config.init.generator or self.run.generator_source
        model = load_pretrained(AutoModelForCausalLM, Path(source), "reference generator")
        if model is None:
            raise ConfigError(
                f"{self.run.source}: key 'task_options.kl_coef'/'generator_objective' needs a reference "
                "generator: init.generator or model.generator_config naming a save_pretrained directory"
            )
        # Under the generator's mixed precision too: else a bf16 generator's ratio to its own
        # fp32 copy is rounding, not 0.
        return self.prepare_frozen(model.eval().requires_grad_(False))

    def load_frozen(self) -> None:
        """The reference, when the KL penalty, ddo or spin needs it."""
        if self.options.kl_coef > 0 or self.uses_likelihood_ratio:
            _ = self.reference

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        """The reference when rounds move it: a checkpoint holds it (else it is the starting
        generator, read again on resume)."""
        return {"reference": self.reference} if self.uses_likelihood_ratio and self.options.round_steps else {}

    @torch.no_grad()
    def after_generator_step(self, generator: nn.Module, step: int) -> None:
        """A new round every ``round_steps`` generator steps: the reference becomes the
        generator (the unwrapped one, the same on every rank)."""
        rounds = self.options.round_steps
        if self.uses_likelihood_ratio and rounds and step % rounds == 0:
            self.reference.load_state_dict(generator.state_dict())

    def kl_to_reference(self, sequences: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
        """Per-token KL estimate (:func:`kl_estimate`) from the reference on the sampled tokens."""
        with torch.no_grad():
            ref_log_p = self.token_log_probs(self.reference, sequences)
        return kl_estimate(log_p, ref_log_p)

    # -- losses ----------------------------------------------------------------------------------
    def mle_loss(self, generator: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        real = self.real(batch)
        return -masked_mean(self.token_log_probs(generator, real), self.valid_mask(real)), {}

    def likelihood_ratio_loss(
        self, generator: nn.Module, num: int, rng: torch.Generator, batch: Any
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of ``ddo`` or ``spin`` on a batch of real sequences and ``num`` samples of
        the reference, with the implicit discriminator ``d(x) = beta * (log p(x) - log
        p_ref(x))`` over a sequence's chosen tokens (:func:`likelihood_ratio_objective`); plus
        ``mle_weight`` x NLL of the real ones. At the start (the generator is the
        reference) the gradient of either is beta/2 x maximum likelihood's: the samples' expected
        score is zero; the samples act as the generator moves away from the reference."""
        o = self.options
        reference = self.reference
        with torch.no_grad():
            fake = self.generate(reference, num, rng, batch)
        real = self.real(batch)
        # One forward for real and generated sequences: DDP allows one forward per backward.
        sequences = torch.cat(pad_right([real, fake], self.pad_id))
        log_p = self.token_log_probs(generator, sequences)
        with torch.no_grad():
            ref_log_p = self.token_log_probs(reference, sequences)
        mask = self.generated_mask(sequences)
        log_ratio = (log_p - ref_log_p) if mask is None else (log_p - ref_log_p) * mask
        ratio_real, ratio_fake = log_ratio.sum(1).split([real.shape[0], num])
        loss = likelihood_ratio_objective(o.generator_objective, o.beta, o.ddo_alpha, ratio_real, ratio_fake)
        parts = {"log_ratio_real": ratio_real.detach().mean(), "log_ratio_fake": ratio_fake.detach().mean()}
        if o.mle_weight > 0:
            nll = -masked_mean(log_p[: real.shape[0]], self.valid_mask(sequences[: real.shape[0]]))
            loss = loss + o.mle_weight * nll
            parts["nll_real"] = nll.detach()
        return loss, parts

    def generator_loss(
        self,
        generator: nn.Module,
        discriminator: nn.Module,
        num: int,
        rng: torch.Generator,
        batch: Any = None,
        samples: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The stage-2 loss of ``generator_objective``: :meth:`likelihood_ratio_loss`, or REINFORCE: raise the
        log-probability of tokens whose return (the discriminator's ratings) is above the batch's
        mean at that position, lower the others'; plus ``mle_weight`` x NLL of real data and
        ``kl_coef`` x KL from the reference generator. REINFORCE scores ``samples`` when given
        (``training.share_samples``), else ``num`` it draws."""
        o = self.options
        if self.uses_likelihood_ratio:
            return self.likelihood_ratio_loss(generator, num, rng, batch)
        with torch.no_grad():
            fake = self.generate(generator, num, rng, batch) if samples is None else samples
            advantage, reward = self._advantages(fake, discriminator)
        mle = o.mle_weight > 0
        # One forward for generated and real sequences: DDP allows one forward per backward.
        sequences = torch.cat(pad_right([fake, self.real(batch)], self.pad_id)) if mle else fake
        log_p = self.token_log_probs(generator, sequences)
        fake_log_p, fake_mask = log_p[:num, : fake.shape[1]], self.generated_mask(fake)
        policy = -masked_mean(advantage * fake_log_p, fake_mask)
        loss, parts = policy, {"reward": reward, "policy_loss": policy.detach()}
        if o.kl_coef > 0:
            kl = masked_mean(self.kl_to_reference(fake, fake_log_p), fake_mask)
            loss = loss + o.kl_coef * kl
            parts["kl"] = kl.detach()
        if mle:
            real = sequences[num:]
            nll = -masked_mean(log_p[num:], self.valid_mask(real))
            loss = loss + o.mle_weight * nll
            parts["nll_real"] = nll.detach()
        return loss, parts

    #: padding of generated sequences gathered across ranks (not a token id)
    eval_pad_value = -1
