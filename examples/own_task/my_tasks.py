"""A 1-D mixture of two Gaussians, trained by the stage-2 loop as a user's own task."""

from dataclasses import dataclass, field

import torch
from torch import nn

from trainer import Task
from trainer.contract.errors import ConfigError


@dataclass
class TwoPeaksOptions:
    centres: list[float] = field(default_factory=lambda: [-2.0, 2.0])
    std: float = 0.1

    def check(self, source: str) -> None:  # optional: bounds, checked before any device is touched
        if self.std <= 0:
            raise ConfigError(f"{source}: key 'task_options.std' must be positive")


def mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))


class TwoPeaks(Task):
    Options = TwoPeaksOptions  # `task_options` is checked against it

    def build_generator(self) -> nn.Module:
        return mlp(self.generator_config["width"])  # the model configs, as mappings

    def build_discriminator(self) -> nn.Module:
        return mlp(self.discriminator_config["width"])

    def points(self, num: int, seed: int) -> torch.Tensor:
        rng = torch.Generator().manual_seed(seed)
        centres = torch.tensor(self.options.centres)
        which = torch.randint(len(centres), (num,), generator=rng)
        return (centres[which] + self.options.std * torch.randn(num, generator=rng)).unsqueeze(1)

    def train_dataset(self):
        return torch.utils.data.TensorDataset(self.points(self.config.data.train_size, self.config.training.seed))

    def real(self, batch):
        return batch[0]

    def eval_dataset(self):
        latents = torch.randn(self.config.data.eval_size, 1, generator=torch.Generator().manual_seed(1))
        return torch.utils.data.TensorDataset(latents)

    def generate(self, generator, num, rng, batch=None):
        # draw noise from `rng` (this rank's generator, saved in checkpoints) for exact resume
        return generator(torch.randn(num, 1, generator=rng, device=rng.device))

    def eval_outputs(self, generator, discriminator, batch):
        return {"sample": generator(batch[0]).squeeze(1)}  # per-sample outputs, gathered

    def eval_metrics(self, outputs):
        sample = outputs["sample"]
        distance = (sample[:, None] - torch.tensor(self.options.centres)).abs().min(dim=1).values
        return {"near_a_peak": float((distance < 3 * self.options.std).float().mean())}
