"""The oracle of the synthetic-data text benchmark: a fixed LSTM language model.

Its shape and equations are those of the SeqGAN oracle (vocabulary 5000, embedding and
state 32, length 20, start token 0 whose embedding is the first input, zero initial state):

    i = sigmoid(x Wi + h Ui + bi)        f = sigmoid(x Wf + h Uf + bf)
    o = sigmoid(x Wog + h Uog + bog)     g = tanh(x Wc + h Uc + bc)
    c = f * c + i * g                    h = o * tanh(c)
    logits = h Wo + bo

The weights are a seeded draw from N(0, 1) (as SeqGAN drew its own), or read from a
safetensors file with those tensor names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from trainer.contract.errors import DataError
from trainer.tasks.sampling import inverse_cdf_sample

GATES = ("i", "f", "og", "c")


def tensor_shapes(vocab_size: int, embed_dim: int, hidden_dim: int) -> dict[str, tuple[int, ...]]:
    """The oracle's tensors by name, with their shapes."""
    shapes: dict[str, tuple[int, ...]] = {"embedding": (vocab_size, embed_dim)}
    for gate in GATES:
        shapes[f"W{gate}"] = (embed_dim, hidden_dim)
        shapes[f"U{gate}"] = (hidden_dim, hidden_dim)
        shapes[f"b{gate}"] = (hidden_dim,)
    shapes["Wo"] = (hidden_dim, vocab_size)
    shapes["bo"] = (vocab_size,)
    return shapes


class OracleLSTM(nn.Module):
    """The oracle: scores token sequences and samples new ones. It is never trained."""

    def __init__(self, tensors: dict[str, torch.Tensor], identity: str) -> None:
        super().__init__()
        for name, value in tensors.items():
            self.register_buffer(name, value.float().contiguous())
        self.vocab_size, self.hidden_dim = self.Wo.shape[1], self.Wo.shape[0]
        #: names the oracle in cache keys: a hash of its weights
        self.identity = identity

    @classmethod
    def seeded(cls, seed: int, vocab_size: int = 5000, embed_dim: int = 32, hidden_dim: int = 32) -> OracleLSTM:
        """A random oracle: every tensor drawn from N(0, 1) in a fixed order from ``seed``."""
        rng = torch.Generator().manual_seed(seed)
        shapes = tensor_shapes(vocab_size, embed_dim, hidden_dim)
        tensors = {name: torch.randn(shape, generator=rng) for name, shape in shapes.items()}
        return cls(tensors, f"seed{seed}-v{vocab_size}-e{embed_dim}-h{hidden_dim}")

    @classmethod
    def from_file(cls, path: str | Path, vocab_size: int = 5000) -> OracleLSTM:
        """The oracle stored in a safetensors file; a missing or misshapen tensor names the file."""
        from safetensors.torch import load

        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: oracle file not found (data.oracle_path)")
        data = path.read_bytes()  # read once: for the tensors and for the hash that names the oracle
        try:
            tensors = load(data)
        except Exception as exc:  # safetensors raises several types for a damaged file
            raise DataError(f"{path}: not a readable safetensors file: {exc}") from None
        embedding = tensors.get("embedding")
        if embedding is None or embedding.dim() != 2:
            raise DataError(f"{path}: no 2-D tensor 'embedding'")
        hidden = tensors["Wi"].shape[-1] if "Wi" in tensors else -1
        expected = tensor_shapes(vocab_size, embedding.shape[1], hidden)
        for name, shape in expected.items():
            found = tuple(tensors[name].shape) if name in tensors else None
            if found != shape:
                raise DataError(f"{path}: tensor {name!r} has shape {found}, expected {shape}")
        digest = hashlib.sha256(data).hexdigest()[:16]
        return cls({name: tensors[name] for name in expected}, f"file-{digest}")

    def _step(
        self, tokens: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.embedding[tokens]
        i = torch.sigmoid(x @ self.Wi + h @ self.Ui + self.bi)
        f = torch.sigmoid(x @ self.Wf + h @ self.Uf + self.bf)
        o = torch.sigmoid(x @ self.Wog + h @ self.Uog + self.bog)
        g = torch.tanh(x @ self.Wc + h @ self.Uc + self.bc)
        c = f * c + i * g
        h = o * torch.tanh(c)
        return h @ self.Wo + self.bo, h, c

    def _initial(self, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        zeros = self.bo.new_zeros(batch, self.hidden_dim)
        start = torch.zeros(batch, dtype=torch.long, device=self.bo.device)
        return start, zeros, zeros.clone()

    def _walk(self, sequences: torch.Tensor) -> Iterator[torch.Tensor]:
        """The next-token log-probabilities [batch, vocab] at each position of ``sequences``."""
        previous, h, c = self._initial(sequences.shape[0])
        for t in range(sequences.shape[1]):
            logits, h, c = self._step(previous, h, c)
            yield logits.log_softmax(-1)
            previous = sequences[:, t]

    @torch.no_grad()
    def token_log_probs(self, sequences: torch.Tensor) -> torch.Tensor:
        """``log p(token_t | tokens_<t)`` for each token of ``sequences`` [batch, length]."""
        steps = [log_p.gather(1, sequences[:, t : t + 1]) for t, log_p in enumerate(self._walk(sequences))]
        return torch.cat(steps, dim=1)

    def sample(self, num: int, length: int, rng: torch.Generator) -> torch.Tensor:
        """``num`` sequences of ``length`` tokens drawn with ``rng`` (position by position)."""
        return self._sample(num, length, lambda _: torch.rand(num, generator=rng, device=rng.device))

    def sample_with(self, uniforms: torch.Tensor) -> torch.Tensor:
        """The sequences [batch, length] whose tokens are drawn with ``uniforms`` [batch, length]
        in [0, 1): each row a function of its own uniforms alone."""
        return self._sample(uniforms.shape[0], uniforms.shape[1], lambda position: uniforms[:, position])

    @torch.no_grad()
    def _sample(self, num: int, length: int, uniforms_at: Callable[[int], torch.Tensor]) -> torch.Tensor:
        previous, h, c = self._initial(num)
        tokens = []
        for position in range(length):
            logits, h, c = self._step(previous, h, c)
            previous = inverse_cdf_sample(logits, uniforms_at(position))
            tokens.append(previous)
        return torch.stack(tokens, dim=1)
