"""Recipe ``gaussian_mixture``: MLP G and D on the 2-D ring and grid of the mode-collapse
literature, scored by modes captured, high-quality samples and reverse KL."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from trainer.contract.config.schema import require
from trainer.contract.errors import ConfigError, DataError
from trainer.contract.task import Task, TensorRows


@dataclass
class GaussianMixtureOptions:
    #: the real data: 8 Gaussians on the unit circle (std 0.01), or 25 on a 5 x 5 grid (std 0.05)
    mixture: Literal["ring", "grid"] = "ring"
    #: PacGAN packing: the discriminator judges this many samples at once
    packing: int = 1
    #: fill each of a pack's places by its own generator forward of batch/packing latents, as
    #: PacGAN's code does (in training, BatchNorm then normalises each place by its own
    #: statistics); false: one forward of the whole batch
    generate_per_place: bool = False
    #: write a scatter plot of generated vs real points at each eval (needs matplotlib)
    plot: bool = True


@dataclass
class GeneratorConfig:
    #: the latent vector's size (drawn from a standard normal)
    latent_dim: int = 2
    #: units of each hidden layer
    hidden_dim: int = 400
    #: hidden layers (the output layer comes after them)
    num_layers: int = 4
    #: each hidden layer Linear without bias, BatchNorm, ReLU (PacGAN's generator)
    batch_norm: bool = False
    #: weights drawn from N(0, init_std) and biases 0 (PacGAN: 0.02); 0: PyTorch's default
    init_std: float = 0.0

    def check(self, source: str) -> None:
        check_mlp(self, source)


@dataclass
class DiscriminatorConfig:
    #: units of each hidden layer
    hidden_dim: int = 200
    #: hidden layers (the output layer comes after them)
    num_layers: int = 3
    #: hidden layers of maxout units of this many pieces each (PacGAN: 5); 0: ReLU layers
    maxout_pieces: int = 0
    #: weights drawn from N(0, init_std) and biases 0; 0: PyTorch's default
    init_std: float = 0.0

    def check(self, source: str) -> None:
        check_mlp(self, source)
        require(
            self.maxout_pieces == 0 or self.maxout_pieces >= 2,
            source,
            "maxout_pieces",
            "must be 0 (ReLU layers) or at least 2",
        )


def check_mlp(model: GeneratorConfig | DiscriminatorConfig, source: str) -> None:
    if model.num_layers < 0 or model.hidden_dim < 1 or model.init_std < 0:
        raise ConfigError(f"{source}: keys 'num_layers', 'hidden_dim', 'init_std' must be at least 0, 1 and 0")


#: PacGAN's batch normalisation (its library's defaults): epsilon 1e-4, and population
#: statistics moved by 0.05 of the batch's at each training forward
BATCH_NORM_EPS, BATCH_NORM_MOMENTUM = 1e-4, 0.05


class Maxout(nn.Module):
    """``out_dim`` maxout units: each the largest of ``pieces`` linear functions of the input."""

    def __init__(self, in_dim: int, out_dim: int, pieces: int) -> None:
        super().__init__()
        self.pieces = pieces
        self.linear = nn.Linear(in_dim, out_dim * pieces)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).unflatten(-1, (-1, self.pieces)).amax(-1)


def mlp(
    in_dim: int,
    hidden_dim: int,
    num_layers: int,
    out_dim: int,
    batch_norm: bool = False,
    maxout_pieces: int = 0,
    init_std: float = 0.0,
) -> nn.Sequential:
    """``num_layers`` hidden layers of ``hidden_dim`` (ReLU; Linear without bias, BatchNorm,
    ReLU with ``batch_norm``; maxout units with ``maxout_pieces``), then a linear output;
    with ``init_std`` every weight drawn from N(0, init_std) and every bias 0."""
    layers: list[nn.Module] = []
    for i in range(num_layers):
        width = in_dim if i == 0 else hidden_dim
        if maxout_pieces:
            layers.append(Maxout(width, hidden_dim, maxout_pieces))
        elif batch_norm:
            norm = nn.BatchNorm1d(hidden_dim, eps=BATCH_NORM_EPS, momentum=BATCH_NORM_MOMENTUM)
            layers += [nn.Linear(width, hidden_dim, bias=False), norm, nn.ReLU()]
        else:
            layers += [nn.Linear(width, hidden_dim), nn.ReLU()]
    layers.append(nn.Linear(hidden_dim if num_layers else in_dim, out_dim))
    model = nn.Sequential(*layers)
    if init_std:
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, init_std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
    return model


def mixture_modes(mixture: str) -> tuple[torch.Tensor, float]:
    """Mode centres and the per-mode std of the ring (8 on the unit circle, std 0.01) or the
    grid (25 at {-4,-2,0,2,4}^2, std 0.05)."""
    if mixture == "ring":
        angles = torch.arange(8, dtype=torch.float64) * (2 * math.pi / 8)
        return torch.stack([angles.cos(), angles.sin()], dim=1).float(), 0.01
    axis = torch.arange(-4.0, 5.0, 2.0)
    return torch.cartesian_prod(axis, axis), 0.05


def sample_mixture(mixture: str, num: int, seed: int) -> torch.Tensor:
    """``num`` points from the mixture, reproducible from ``seed``."""
    centres, std = mixture_modes(mixture)
    rng = torch.Generator().manual_seed(seed)
    which = torch.randint(len(centres), (num,), generator=rng)
    return centres[which] + std * torch.randn(num, 2, generator=rng)


def read_points(path: str) -> torch.Tensor:
    """Points from a local jsonl/csv/parquet file with columns x and y, read with ``datasets``.

    A missing or non-numeric value is rejected with its row number (1 = first data row).
    """
    import datasets

    kinds = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
    kind = kinds.get(Path(path).suffix.lower())
    if kind is None:
        raise DataError(f"{path}: unsupported data file type; use .jsonl, .csv or .parquet")
    try:
        table = datasets.load_dataset(kind, data_files=path, split="train", keep_in_memory=True)
    except Exception as exc:  # datasets raises many types for unreadable files
        raise DataError(f"{path}: cannot read: {str(exc).splitlines()[0]}") from None
    missing = [c for c in ("x", "y") if c not in table.column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)}; found {table.column_names}")
    columns = []
    for name in ("x", "y"):
        values = table[name]
        for row, value in enumerate(values, start=1):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise DataError(f"{path}: row {row}: column '{name}' is {value!r}, not a finite number")
        columns.append(torch.tensor(values, dtype=torch.float32))
    if not columns[0].numel():
        raise DataError(f"{path}: no rows")
    return torch.stack(columns, dim=1)


class GaussianMixtureTask(Task):
    """MLP generator and discriminator on a 2-D Gaussian mixture (optionally PacGAN-packed)."""

    Options = GaussianMixtureOptions
    GeneratorConfig = GeneratorConfig
    DiscriminatorConfig = DiscriminatorConfig

    def __init__(self, run: Any) -> None:
        super().__init__(run)
        packing, batch_size = self.options.packing, self.config.training.batch_size
        if packing < 1 or batch_size % packing:
            raise ConfigError(
                f"{run.source}: key 'task_options.packing' ({packing}) must be at least 1 "
                f"and divide training.batch_size ({batch_size})"
            )
        self.centres, self.std = mixture_modes(self.options.mixture)

    def build_generator(self) -> nn.Module:
        g = self.generator_config
        return mlp(g.latent_dim, g.hidden_dim, g.num_layers, 2, batch_norm=g.batch_norm, init_std=g.init_std)

    def build_discriminator(self) -> nn.Module:
        d = self.discriminator_config
        return mlp(
            2 * self.options.packing, d.hidden_dim, d.num_layers, 1, maxout_pieces=d.maxout_pieces, init_std=d.init_std
        )

    def collate(self, items: Any) -> Any:
        return items  # TensorRows.__getitems__ already returns the batch

    def train_dataset(self) -> torch.utils.data.Dataset:
        data = self.config.data
        if data.path:
            return TensorRows(points=read_points(data.path))
        return TensorRows(points=sample_mixture(self.options.mixture, data.train_size, self.config.training.seed))

    def eval_dataset(self) -> torch.utils.data.Dataset:
        # Real points and the latents to generate from are fixed by the seed, so an eval
        # scores the same samples whatever the number of processes.
        size = self.config.data.eval_size
        seed = self.config.training.seed + 1
        latents = torch.randn(size, self.generator_config.latent_dim, generator=torch.Generator().manual_seed(seed))
        return TensorRows(real=sample_mixture(self.options.mixture, size, seed), latent=latents)

    def real(self, batch: Any) -> torch.Tensor:
        return batch["points"]

    def generate(self, generator: nn.Module, num: int, rng: torch.Generator, batch: Any = None) -> torch.Tensor:
        latents = torch.randn(num, self.generator_config.latent_dim, generator=rng, device=rng.device)
        if not self.options.generate_per_place:
            return generator(latents)
        # pack i holds the i-th sample of each forward, in the order score() reads them
        places = [generator(part) for part in latents.chunk(self.options.packing)]
        return torch.stack(places, dim=1).flatten(0, 1)

    def score(self, discriminator: nn.Module, samples: torch.Tensor) -> torch.Tensor:
        return discriminator(samples.reshape(-1, 2 * self.options.packing)).reshape(-1)

    def eval_outputs(self, generator: nn.Module, discriminator: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        return {"fake": generator(batch["latent"]).float(), "real": batch["real"]}

    def eval_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        fake = outputs["fake"].double()
        centres = self.centres.to(fake)
        distance, nearest = torch.cdist(fake, centres).min(dim=1)
        good = distance <= 3 * self.std
        counts = torch.bincount(nearest[good], minlength=len(centres)).double()
        num_modes = len(centres)
        if counts.sum() > 0:
            share = counts / counts.sum()
            present = share > 0
            reverse_kl = float((share[present] * (share[present] * num_modes).log()).sum())
        else:
            reverse_kl = math.log(num_modes)
        return {
            "modes": int((counts > 0).sum()),
            "high_quality": float(good.double().mean()),
            "reverse_kl": reverse_kl,
        }

    def on_eval(self, step: int, outputs: dict[str, torch.Tensor], output_dir: Path, trackers: list[Any]) -> None:
        if not self.options.plot:
            return
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        fig, ax = plt.subplots(figsize=(5, 5))
        real, fake = outputs["real"].cpu(), outputs["fake"].cpu()
        ax.scatter(real[:, 0], real[:, 1], s=2, c="tab:blue", alpha=0.5, label="real")
        ax.scatter(fake[:, 0], fake[:, 1], s=2, c="tab:red", alpha=0.5, label="generated")
        ax.set_title(f"{self.options.mixture}, step {step}")
        ax.set_aspect("equal")
        ax.legend(loc="upper right", markerscale=4)
        path = output_dir / "samples" / f"step-{step:07d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        for tracker in trackers:
            if tracker.name == "tensorboard":
                tracker.writer.add_figure("samples", fig, global_step=step)
        plt.close(fig)
