"""A real-text example that needs no download: texts no one here wrote (the docstrings of
Python's standard library, which ship with every Python), a byte-level BPE tokenizer trained
on them in seconds, and a tiny causal LM written with ``save_pretrained``.

    python scripts/make_text_example.py OUT        # OUT/texts.jsonl, OUT/eval.jsonl, OUT/gpt2/
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import warnings
from pathlib import Path
from typing import Any

import torch

#: the modules whose docstrings make the corpus (a fixed list: the same corpus everywhere)
MODULES = (
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fractions",
    "ftplib", "functools", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client",
    "imaplib", "inspect", "ipaddress", "itertools", "json", "logging", "mailbox", "mimetypes", "multiprocessing",
    "operator", "optparse", "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "shlex", "shutil",
    "smtplib", "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "timeit", "tokenize", "traceback", "typing", "unittest", "urllib.parse", "uuid", "warnings",
    "weakref", "xml.dom.minidom", "zipfile",
)  # fmt: skip
EOS = "<|endoftext|>"


def docstring_paragraphs(min_chars: int = 40, max_chars: int = 400) -> list[str]:
    """The paragraphs of the standard library's docstrings (modules, classes, functions and
    methods), whitespace collapsed, without code examples, each once, in a fixed order."""
    seen: dict[str, None] = {}
    for name in MODULES:
        with warnings.catch_warnings():  # typing's deprecated submodules warn when read
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(name)
        objects: list[Any] = [module]
        for _, member in sorted(vars(module).items()):
            if getattr(member, "__module__", None) == module.__name__ and (
                inspect.isclass(member) or inspect.isfunction(member)
            ):
                objects.append(member)
                if inspect.isclass(member):
                    objects.extend(m for _, m in sorted(vars(member).items()) if inspect.isfunction(m))
        for obj in objects:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                doc = inspect.getdoc(obj) or ""
            for paragraph in doc.split("\n\n"):
                if ">>>" in paragraph or paragraph.lstrip().startswith(("-", "*", ":")):
                    continue
                text = " ".join(paragraph.split())
                if min_chars <= len(text) <= max_chars:
                    seen.setdefault(text)
    return list(seen)


def train_tokenizer(texts: list[str], vocab_size: int, directory: Path) -> Any:
    """A byte-level BPE tokenizer trained on ``texts``, saved as a PreTrainedTokenizerFast with
    ``<|endoftext|>`` as its beginning-, end- and unknown-token, as GPT-2's."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, unk_token=EOS)
    tokenizer.save_pretrained(directory)
    return tokenizer


def tiny_model_config(architecture: str, vocab_size: int, eos_id: int, width: int = 64, layers: int = 2) -> Any:
    """The config of a tiny causal LM of ``architecture`` (gpt2 or llama)."""
    from transformers import GPT2Config, LlamaConfig

    tokens = {"bos_token_id": eos_id, "eos_token_id": eos_id}
    if architecture == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_positions=128, n_embd=width, n_layer=layers, n_head=2, **tokens)
    if architecture == "llama":
        return LlamaConfig(
            **tokens,
            vocab_size=vocab_size,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=128,
        )
    raise ValueError(f"unknown architecture {architecture!r}: gpt2 or llama")


#: fields every downloaded GPT-2 checkpoint's config.json carries that a fresh config does not
STOCK_GPT2_FIELDS = {
    "n_ctx": 128,
    "summary_type": "cls_index",
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
}


def write_text_example(
    out: str | Path, architecture: str = "gpt2", vocab_size: int = 1000, eval_texts: int = 200, seed: int = 0
) -> dict[str, Path]:
    """Write ``texts.jsonl`` (training) and ``eval.jsonl`` (held out) of the corpus, and
    ``<architecture>/``: a tiny untrained causal LM with the tokenizer beside it. Returns the
    paths by name (``train``, ``eval``, ``model``)."""
    from transformers import AutoModelForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    texts = docstring_paragraphs()
    random.Random(seed).shuffle(texts)
    paths = {"train": out / "texts.jsonl", "eval": out / "eval.jsonl", "model": out / architecture}
    for split, rows in (("eval", texts[:eval_texts]), ("train", texts[eval_texts:])):
        paths[split].write_text("".join(json.dumps({"text": text}) + "\n" for text in rows))
    tokenizer = train_tokenizer(texts[eval_texts:], vocab_size, paths["model"])
    config = tiny_model_config(architecture, len(tokenizer), tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):  # the weights from the seed, the caller's state untouched
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(paths["model"])
    if architecture == "gpt2":  # as a downloaded checkpoint's config.json
        config_file = paths["model"] / "config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **STOCK_GPT2_FIELDS}, indent=2))
    return paths
