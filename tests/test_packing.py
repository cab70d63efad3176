"""Training forwards on packed rows of valid tokens give the padded computation's losses and
gradients (harness.padded: the forwards as they were before packing): every loss part, every
parameter's gradient, on a fixed batch of mixed lengths, for GPT-2 and Llama; and the chosen
tokens' log-probabilities without a float32 copy of the logits."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers import check, fork_launch, launch, records
from safetensors.torch import load_file
from test_text import example, write_text_run  # noqa: F401 (example: the fixture)

from harness.padded import use_padded
from trainer.contract.config import load_config
from trainer.contract.task import Penalties
from trainer.tasks.packing import chosen_log_probs, packed_layout
from trainer.tasks.text import TextTask

MAX_LENGTH, NEW_TOKENS = 24, 12


# -- a fixed batch of mixed lengths --------------------------------------------------------------
def words(count: int, generator: torch.Generator, banned: list[int]) -> list[int]:
    out = []
    while len(out) < count:
        token = int(torch.randint(0, 300, (1,), generator=generator))
        if token not in banned:
            out.append(token)
    return out


def fixed_batch(task, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Real texts (one at max_length, one shorter than the samples) and samples (one that ends at
    its first token, one that never ends), padded as the recipe pads them; with ``prompt_len``,
    each sample continues its real text's first tokens."""
    rng = torch.Generator().manual_seed(7)
    avoid = [task.eos_id, task.pad_id, task.start_id]
    real_lengths = [MAX_LENGTH - 1, 3, 17, 9]  # tokens before the end token
    real = [words(n, rng, avoid) + [task.eos_id] for n in real_lengths]
    new_tokens = [0, NEW_TOKENS, 5, 8]  # chosen tokens before the end: none, all (never ends), ...
    fake = []
    for text, n in zip(real, new_tokens, strict=True):
        chosen = words(n, rng, avoid) + ([task.eos_id] if n < NEW_TOKENS else [])
        fake.append(text[:prompt_len] + chosen)

    def padded(rows: list[list[int]]) -> torch.Tensor:
        width = max(map(len, rows))
        return torch.tensor([row + [task.pad_id] * (width - len(row)) for row in rows])

    return padded(real), padded(fake)


def text_task(tmp_path, paths, options: dict[str, Any], training: dict[str, Any] | None = None, dtype=torch.float32):
    task_options = {"max_length": MAX_LENGTH, "max_new_tokens": NEW_TOKENS, **options}
    config = write_text_run(tmp_path, paths, {"task_options": task_options, "training": training or {}})
    task = TextTask(load_config(config))
    generator, discriminator = task.build_generator().eval().to(dtype), task.build_discriminator().eval().to(dtype)
    torch.manual_seed(0)
    reference = copy.deepcopy(generator).requires_grad_(False)
    with torch.no_grad():  # the generator a step away from its reference: the KL is not 0
        for param in generator.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    task.__dict__["reference"] = reference
    return task, generator, discriminator


def losses_and_gradients(task, generator, discriminator, real, fake) -> dict[str, torch.Tensor]:
    """The generator's loss, its parts and gradients, then the discriminator's (fresh gradients)."""
    task.generate = lambda *args, **kwargs: fake.clone()
    batch = {"input_ids": real}
    rng = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    loss, parts = task.generator_loss(generator, discriminator, fake.shape[0], rng, batch)
    loss.backward()
    out |= {"g_loss": loss.detach()} | {f"g.{k}": v.detach() for k, v in parts.items()}
    out |= {f"grad g.{name}": p.grad.clone() for name, p in generator.named_parameters() if p.grad is not None}
    discriminator.zero_grad(set_to_none=True)
    if not task.uses_likelihood_ratio:
        loss, parts = task.discriminator_loss(discriminator, real, fake, rng, Penalties())
        loss.backward()
        out |= {"d_loss": loss.detach()} | {f"d.{k}": v.detach() for k, v in parts.items()}
        out |= {f"grad d.{n}": p.grad.clone() for n, p in discriminator.named_parameters() if p.grad is not None}
    generator.zero_grad(set_to_none=True)
    discriminator.zero_grad(set_to_none=True)
    return out


def scale(value: torch.Tensor) -> float:
    """What a difference is relative to: a tensor's largest value, and at least 1 for a loss (a
    loss near 0 is a sum of log-probabilities and ratings of order 1 that cancel)."""
    return max(float(value.abs().max()), 1.0 if value.dim() == 0 else 1e-12)


def assert_equal_to_relative(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert float((got[key] - value).abs().max()) <= rtol * scale(value), key


CASES = [
    pytest.param({"reward": "prefix", "mle_weight": 0.0, "kl_coef": 0.0}, id="prefix"),
    pytest.param({"reward": "prefix", "mle_weight": 0.2, "kl_coef": 0.3}, id="prefix-mle-kl"),
    pytest.param({"reward": "sequence", "mle_weight": 0.0, "kl_coef": 0.3}, id="sequence-kl"),
    pytest.param({"reward": "sequence", "mle_weight": 0.2, "kl_coef": 0.0}, id="sequence-mle"),
    pytest.param({"reward": "prefix", "mle_weight": 0.2, "kl_coef": 0.3, "prompt_len": 3}, id="prompt3"),
    pytest.param({"generator_objective": "ddo", "mle_weight": 0.2}, id="ddo"),
    pytest.param({"generator_objective": "spin"}, id="spin"),
]


#: float64 shows the two computations agree (up to rounding, 1e-9 with room); float32 differs by
#: rounding where a sum cancels: losses by up to 1.3e-6 of their scale, gradients by up to 5e-5 of
#: a tensor's largest element (measured on the discriminator's final LayerNorm bias, whose
#: gradient is about 1e-4 where others are 0.2)
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
@pytest.mark.parametrize("options", CASES)
def test_packed_forwards_give_the_padded_losses_and_gradients(tmp_path, example, architecture, options, dtype):  # noqa: F811
    training = {"d_steps_per_g_step": 0} if "generator_objective" in options else None
    task, generator, discriminator = text_task(tmp_path, example[architecture], options, training, dtype)
    real, fake = fixed_batch(task, options.get("prompt_len", 0))
    packed = losses_and_gradients(task, generator, discriminator, real, fake)
    assert all(task.packs(m, role) for m, role in ((generator, "generator"), (discriminator, "discriminator")))
    use_padded(task)
    padded = losses_and_gradients(task, generator, discriminator, real, fake)
    assert_equal_to_relative(packed, padded, TOLERANCE[dtype])
    # the check is not vacuous: a loss moved by three times the tolerance fails it
    moved = {**packed, "g_loss": packed["g_loss"] + 3 * TOLERANCE[dtype] * scale(packed["g_loss"])}
    with pytest.raises(AssertionError, match="g_loss"):
        assert_equal_to_relative(moved, padded, TOLERANCE[dtype])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_eval_log_probabilities_at_a_temperature_are_the_padded_ones(tmp_path, example, architecture):  # noqa: F811
    task, generator, discriminator = text_task(tmp_path, example[architecture], {})
    real, fake = fixed_batch(task, 0)
    sequences = torch.cat([real, torch.nn.functional.pad(fake, (0, real.shape[1] - fake.shape[1]), value=task.pad_id)])
    mask = task.valid_mask(sequences)
    with torch.no_grad():
        packed = task.token_log_probs(generator, sequences, 0.7) * mask
        ratings = task.score(discriminator, sequences)
        use_padded(task)
        padded = task.token_log_probs(generator, sequences, 0.7) * mask
        padded_ratings = task.score(discriminator, sequences)
    torch.testing.assert_close(packed, padded, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(ratings, padded_ratings, rtol=1e-6, atol=1e-6)


def test_the_layout_computes_valid_tokens_only_and_gives_them_back():
    lengths = torch.tensor([24, 1, 12, 5, 24, 7, 3, 19])
    layout = packed_layout(lengths.tolist(), 24, torch.device("cpu"), row_tokens=40)
    assert layout.valid_tokens == int(lengths.sum())
    assert layout.rows * layout.width <= 1.05 * layout.valid_tokens
    values = torch.arange(8 * 24).view(8, 24) + 1
    mask = torch.arange(24) < lengths.unsqueeze(1)
    assert torch.equal(layout.unpack(layout.pack(values, 0)), values * mask)
    # each sequence counts its positions from 0; the filler at a row's end too
    rows = layout.pack(values, 0)
    for sequence in range(8):
        first = int(layout.place[layout.sequence == sequence][0])
        assert int(layout.positions.reshape(-1)[first]) == 0
        assert int(rows.reshape(-1)[first]) == int(values[sequence, 0])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chosen_log_probs_are_log_softmax_at_the_tokens(temperature):
    torch.manual_seed(0)
    logits = (torch.randn(3, 70, 501) * 3).requires_grad_(True)
    tokens = torch.randint(1, 501, (3, 70))
    banned = torch.zeros(501, dtype=torch.bool)
    banned[0] = True
    upstream = torch.randn(3, 70)
    got = chosen_log_probs(logits, tokens, temperature, banned)
    (got * upstream).sum().backward()
    grad, logits.grad = logits.grad, None
    want = (logits / temperature).masked_fill(banned, -float("inf")).log_softmax(-1)
    want = want.gather(2, tokens.unsqueeze(2)).squeeze(2)
    (want * upstream).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, logits.grad, rtol=1e-6, atol=1e-7)


def final_generator(out) -> dict[str, torch.Tensor]:
    return load_file(str(out / "final" / "generator" / "model.safetensors"))


@pytest.mark.timeout(400)
def test_three_steps_packed_end_where_the_padded_path_ends_in_one_and_two_processes(tmp_path, example):  # noqa: F811
    paths = example["gpt2"]
    weights = {}
    for processes in (1, 2):
        for packed in (True, False):
            out = tmp_path / f"{processes}-{packed}"
            config = write_text_run(
                out,
                paths,
                {
                    "task_options": {"packed": packed, "mle_weight": 0.2, "kl_coef": 0.1},
                    "training": {"max_steps": 3, "eval_every": 3, "save_every": 3, "batch_size": 4 // processes},
                    "init": {"generator": str(paths["model"])},
                    # SGD: Adam would turn the rounding noise of gradients that are 0 in exact
                    # arithmetic (GPT-2's key biases: softmax ignores a shift) into steps of lr
                    "optim": {"generator": {"name": "sgd", "lr": 0.05}, "discriminator": {"name": "sgd", "lr": 0.05}},
                },
            )
            # one run on the real launcher, the others' workers forked from this process (harness.forked)
            run = launch if (processes, packed) == (2, True) else fork_launch
            result = check(run(["--config", str(config), "--device", "cpu"], processes))
            path = "packed rows" if packed else "padded batches (task_options.packed is false)"
            assert f"generator forwards (GPT2LMHeadModel): {path}" in result.stderr
            assert {r["world_size"] for r in records(out / "out")} == {processes}
            weights[processes, packed] = final_generator(out / "out")
    start = load_file(str(paths["model"] / "model.safetensors"))
    for processes in (1, 2):
        padded, packed = weights[processes, False], weights[processes, True]
        assert any(not torch.equal(padded[key], start[key]) for key in start)  # it trained
        for key, value in padded.items():
            torch.testing.assert_close(packed[key], value, rtol=1e-5, atol=1e-5, msg=key)


def test_a_model_that_ignores_the_restarts_takes_padded_batches(tmp_path, example):  # noqa: F811
    task, generator, _ = text_task(tmp_path, example["gpt2"], {})

    class IgnoresRestarts(torch.nn.Module):
        """The generator with an all-ones mask always: packed sequences would see each other."""

        def __init__(self, model):
            super().__init__()
            self.model, self.config = model, model.config

        def forward(self, input_ids, position_ids=None, attention_mask=None, **kwargs):
            return self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=torch.ones_like(input_ids))

    assert task.packs(generator, "generator")
    assert not task.packs(IgnoresRestarts(generator), "generator")


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_a_batch_with_little_padding_stays_a_batch_cut_after_its_longest_sequence(
    tmp_path,
    example,  # noqa: F811
    architecture,
    monkeypatch,
):
    """Sequences of one length (the oracle's) and one a token short: no packed rows (packing could
    save at most 5%), the batch cut after its longest sequence, the padded values."""
    task, generator, discriminator = text_task(tmp_path, example[architecture], {"reward": "sequence"})
    rng = torch.Generator().manual_seed(3)
    avoid = [task.eos_id, task.pad_id, task.start_id]
    rows = [words(NEW_TOKENS, rng, avoid) for _ in range(6)]
    rows[0] = rows[0][: NEW_TOKENS - 1] + [task.eos_id]
    sequences = torch.nn.functional.pad(torch.tensor(rows), (0, 5), value=task.pad_id)  # 5 columns of padding
    widths = []
    for model, role in ((generator, "generator"), (discriminator, "discriminator")):
        assert task.packs(model, role)  # the models take packed rows; this batch does not need them
        model.register_forward_pre_hook(lambda _m, _a, k: widths.append(k["input_ids"].shape), with_kwargs=True)
    monkeypatch.setattr("trainer.tasks.sequence_forwards.packed_layout", None)  # a call would fail
    mask = task.valid_mask(sequences)
    with torch.no_grad():
        got = task.token_log_probs(generator, sequences) * mask, task.score(discriminator, sequences)
        # the longest: 12 tokens and the first padding token, which is the end token (GPT-2's pad)
        assert widths == [(6, NEW_TOKENS + 1), (6, NEW_TOKENS + 1)]
        use_padded(task)
        want = task.token_log_probs(generator, sequences) * mask, task.score(discriminator, sequences)
    for value, expected in zip(got, want, strict=True):
        torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-5)
