"""The training config's ``training`` section: what a step trains, how long, how often it
evaluates and saves, and what guards it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from trainer.contract.config.schema import require

LOSSES = ("non_saturating", "hinge", "least_squares", "wasserstein")


@dataclass
class TrainingSection:
    #: generator optimizer steps
    max_steps: int = 1000
    #: micro-batch size per process
    batch_size: int = 64
    #: micro-batches per optimizer step, both models
    gradient_accumulation_steps: int = 1
    #: discriminator optimizer steps per generator step; 0: the discriminator is frozen, a
    #: fixed reward model (in eval mode, no optimizer or gradients, not wrapped by DDP), as in
    #: RL fine-tuning against a trained critic
    d_steps_per_g_step: int = 1
    #: "alternating": the discriminator steps, then the generator against the stepped one;
    #: "simultaneous": both gradients at the step's starting weights, then both steps (the
    #: order of PacGAN's and ALI's code; one D step per G step, no fp16 GradScaler; see
    #: docs/design.md, "What one optimizer step is")
    updates: Literal["alternating", "simultaneous"] = "alternating"
    #: one generation per optimizer step: the generator phase takes the samples its step's (last)
    #: discriminator phase drew, from the generator as it stood at the step's start, instead of
    #: drawing its own (for tasks whose generator loss takes samples without gradients: the text
    #: recipes' REINFORCE; a mixture refuses it); no effect without a discriminator phase; on
    #: in configs/training/text_stage2.yaml (measured: docs/own-models.md), off elsewhere
    share_samples: bool = False
    #: optimizer steps between evals
    eval_every: int = 500
    #: optimizer steps between checkpoints
    save_every: int = 1000
    #: optimizer steps per train record (and per progress line when there is no terminal)
    log_every: int = 50
    #: how many checkpoints/step-* to keep
    keep_checkpoints: int = 2
    #: the eval metric best/ follows; empty: no best/
    best_metric: str = ""
    #: whether a lower or a higher best_metric is better
    best_mode: Literal["min", "max"] = "min"
    #: one seed for everything
    seed: int = 0
    #: empty: whatever the accelerate config (or launcher) says
    mixed_precision: Literal["", "no", "bf16", "fp16"] = ""
    #: seconds of training after which the run saves an agreed checkpoint and stops cleanly; 0
    #: means no limit
    max_time: float = 0.0
    #: a step whose gradients are non-finite is skipped on every rank ("skip") or stops the run
    #: ("error", exit 3)
    nonfinite: Literal["skip", "error"] = "skip"
    #: so many skipped steps in a row stop the run
    max_consecutive_skips: int = 10
    #: the adversarial loss of both models
    loss: Literal["non_saturating", "hinge", "least_squares", "wasserstein"] = "non_saturating"
    #: gradient-penalty weight, used by the wasserstein loss
    gp_weight: float = 10.0
    #: R1 penalty on real data (0 turns it off), applied every ``r1_interval`` D steps
    r1_weight: float = 0.0
    #: discriminator steps between two R1 penalties
    r1_interval: int = 1
    #: accelerate trackers; "auto" means tensorboard when it is installed, "none" none
    log_with: list[str] = field(default_factory=lambda: ["auto"])
    #: the trackers' project ("": the output directory's name); tensorboard writes under
    #: OUTPUT/tensorboard/<project_name>
    project_name: str = ""
    #: the run's name in trackers that take one (wandb name, mlflow run_name; "": theirs)
    run_name: str = ""
    #: keyword arguments of each tracker's start, by tracker name (accelerate's init_kwargs),
    #: e.g. {wandb: {entity: my-team, tags: [ring]}}
    tracker_init_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: decay of an exponential moving average of the generator's weights and floating-point
    #: buffers (0: none; integer and boolean buffers are copied); when on, the eval scores the
    #: average (its record says "generator": "ema") and best/ and final/ export it as
    #: generator/, the trained weights as generator_raw/
    ema_decay: float = 0.0
    #: generator steps before the average starts (until then it copies the weights)
    ema_start: int = 0
    #: a lower decay for the average's first updates: min(ema_decay, (1 + n) / (10 + n))
    ema_warmup: bool = False
    #: dataloader workers
    num_workers: int = 0
    #: what a step trains: both models against each other (stage 2), or one model alone in
    #: stage 1: the generator by maximum likelihood ("mle", the task's mle_loss), the
    #: discriminator against the frozen generator ("discriminator")
    objective: Literal["adversarial", "mle", "discriminator"] = "adversarial"

    def check(self, source: str) -> None:
        at_least_one = ("max_steps", "batch_size", "gradient_accumulation_steps", "eval_every", "save_every",
                        "log_every", "keep_checkpoints", "max_consecutive_skips", "r1_interval")  # fmt: skip
        for name in at_least_one:
            require(getattr(self, name) >= 1, source, f"training.{name}", "must be at least 1")
        require(self.d_steps_per_g_step >= 0, source, "training.d_steps_per_g_step", "must be 0 (frozen) or more")
        require(
            self.d_steps_per_g_step > 0 or self.objective != "discriminator",
            source,
            "training.d_steps_per_g_step",
            "is 0 (a frozen discriminator) with training.objective discriminator, which trains nothing",
        )
        require(
            self.updates == "alternating" or (self.d_steps_per_g_step == 1 and self.objective == "adversarial"),
            source,
            "training.updates",
            "is simultaneous, which takes one discriminator step per generator step "
            "(training.d_steps_per_g_step: 1, training.objective: adversarial)",
        )
        for name in ("num_workers", "gp_weight", "ema_start", "r1_weight"):
            require(getattr(self, name) >= 0, source, f"training.{name}", "must be 0 or more")
        require(self.max_time >= 0, source, "training.max_time", "must be 0 (no limit) or more")
        require(0 <= self.ema_decay < 1, source, "training.ema_decay", "must be in [0, 1) (0: no average)")
