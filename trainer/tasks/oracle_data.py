"""The oracle recipe's data: its sampled train and eval sets, cached on disk, and the training
sequences beyond the sampled set (``task_options.train_sequences``).

Rows below the set's size are the set's; later rows are drawn from the oracle, row ``i`` with
uniforms from ``data_seed`` and ``i``. A batch's tokens depend in the last bit of a float on the
rows drawn with them (the LSTM's batched arithmetic groups its sums by batch), so rows are drawn
in groups that do not change: a finite set in chunks of fixed rows, once, then cached; an
endless stream by the run's micro-batches, which every number of processes and a resume fetch
alike. The data-limit experiment (docs/results/oracle.md) trains stage 2 on 10k, 100k and
endless rows.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.contract.task import EndlessRows
from trainer.tasks.oracle import OracleLSTM
from trainer.training.sample_order import derived_seed

#: rows sampled together, so that a dataset does not depend on how much memory the machine has
CHUNK = 1000


def cached(cache: Path, key: str, make: Callable[[], dict[str, torch.Tensor]]) -> Any:
    """The splits ``make`` returns (token tensors by name), as a ``datasets.DatasetDict`` cached
    under ``cache/key``: the first run writes it (into a temporary directory renamed into
    place, so readers never see half of it), later runs and the other ranks read it."""
    import datasets

    path = cache / key
    if not path.is_dir():
        splits = {name: datasets.Dataset.from_dict({"input_ids": t.tolist()}) for name, t in make().items()}
        partial = cache / f".partial-{key}-{os.getpid()}"
        datasets.DatasetDict(splits).save_to_disk(str(partial))
        try:
            partial.rename(path)
        except OSError:  # written meanwhile by another process: keep theirs
            shutil.rmtree(partial, ignore_errors=True)
    return datasets.load_from_disk(str(path))


def oracle_sequences(oracle: OracleLSTM, data_seed: int, seq_len: int, sizes: dict[str, int], cache: Path) -> Any:
    """The train and eval sets (``sizes`` by split, in that order) sampled from ``oracle`` with
    one generator seeded by ``data_seed``, cached by oracle, seed and sizes."""

    def sample() -> dict[str, torch.Tensor]:
        rng = torch.Generator().manual_seed(data_seed)
        return {
            split: torch.cat([oracle.sample(min(CHUNK, size - at), seq_len, rng) for at in range(0, size, CHUNK)])
            for split, size in sizes.items()
        }

    key = f"oracle_text-{oracle.identity}-data{data_seed}-len{seq_len}-{sizes['train']}-{sizes['eval']}"
    return cached(cache, key, sample)


class OracleSequences:
    """Rows ``i`` of the training sequences: the sampled set's first, the oracle's after it."""

    def __init__(self, sampled: torch.Tensor, oracle: OracleLSTM, data_seed: int) -> None:
        self.sampled, self.oracle, self.data_seed = sampled, oracle, data_seed

    def rows(self, indices: list[int]) -> torch.Tensor:
        """The rows ``indices``, those past the sampled set drawn together."""
        index = torch.tensor(indices, dtype=torch.long)
        tokens = self.sampled.new_empty((len(indices), self.sampled.shape[1]))
        inside = index < len(self.sampled)
        tokens[inside] = self.sampled[index[inside]]
        later = index[~inside].tolist()
        if later:
            tokens[~inside] = self.oracle.sample_with(torch.stack([self.uniforms(i) for i in later]))
        return tokens

    def uniforms(self, row: int) -> torch.Tensor:
        """The uniforms row ``row``'s tokens are drawn with."""
        rng = torch.Generator().manual_seed(derived_seed("oracle row", self.data_seed, row))
        return torch.rand(self.sampled.shape[1], generator=rng)

    def first(self, size: int, cache: Path) -> torch.Tensor:
        """The first ``size`` rows: the sampled set's, and those after it drawn in chunks of
        :data:`CHUNK` rows and cached."""
        if size <= len(self.sampled):
            return self.sampled[:size]

        def draw() -> dict[str, torch.Tensor]:
            return {
                "train": torch.cat([self.rows(list(range(at, min(at + CHUNK, size)))) for at in range(0, size, CHUNK)])
            }

        sampled, length = len(self.sampled), self.sampled.shape[1]
        key = f"oracle_text-{self.oracle.identity}-data{self.data_seed}-len{length}-{sampled}-rows{size}"
        return cached(cache, key, draw)["train"].with_format("torch")[:]["input_ids"]


class EndlessOracleSequences(EndlessRows):
    """Every row, in order: no sequence twice (the sampled set's, then fresh ones)."""

    def __init__(self, sequences: OracleSequences) -> None:
        self.sequences = sequences

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        return {"input_ids": self.sequences.rows(indices)}
