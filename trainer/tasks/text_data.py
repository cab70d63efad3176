"""The ``text`` recipe's data: texts from local files (text, json/jsonl, csv, parquet) or a
dataset by name, as one ``text`` column (read with ``datasets``, which caches them), and their
token ids, truncated and ended with the end-of-sequence token. Data that cannot be read is one
DataError naming the file or dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.contract.errors import DataError

#: the ``datasets.load_dataset`` builder of each file suffix
FORMATS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def read_texts(files: list[str], column: str, cache_dir: Path) -> Any:
    """The texts of ``files`` as one ``datasets.Dataset`` with a ``text`` column; a file that
    cannot be read, has no rows or lacks the column is one DataError naming it."""
    import datasets

    parts = []
    for name in files:
        builder = FORMATS.get(Path(name).suffix.lower())
        if builder is None:
            raise DataError(f"{name}: unknown file type; expected one of {', '.join(FORMATS)}")
        try:
            table = datasets.load_dataset(builder, data_files=name, split="train", cache_dir=str(cache_dir))
        except Exception as exc:  # each builder raises its own parser's errors
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise DataError(f"{name}: cannot read as {builder}: {first[:200]}") from None
        parts.append(texts_of(table, "text" if builder == "text" else column, name))
    return datasets.concatenate_datasets(parts)


def texts_of(table: Any, column: str, source: str) -> Any:
    """``table``'s ``column`` as the one ``text`` column of strings; a table without rows or
    without the column is one DataError naming ``source``."""
    import datasets

    if len(table) == 0:
        raise DataError(f"{source}: no rows")
    if column not in table.column_names:
        raise DataError(
            f"{source}: no column {column!r} (task_options.text_column); it has {', '.join(table.column_names)}"
        )
    table = table.select_columns([column])
    if column != "text":
        table = table.rename_column(column, "text")
    # one string type for all (parquet may hold large_string): the parts must concatenate
    return table.cast_column("text", datasets.Value("string"))


def read_dataset(
    name: str, config: str, train_split: str, eval_split: str, column: str, cache_dir: Path, eval_required: bool = False
) -> Any:
    """The train split of a dataset by name or local directory, and its eval split (None when
    it has none of that name: a DataError with ``eval_required``), as :func:`texts_of` tables. A directory written by
    ``save_to_disk`` is read with ``load_from_disk`` (one Dataset is the train split), any
    other name with ``load_dataset`` (a folder of data files, with a README card or not, or a
    dataset id); one that cannot be loaded (offline and not cached, no such dataset) is one
    DataError naming it."""
    import datasets

    path = Path(name)
    try:
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            loaded = datasets.load_from_disk(name)
        else:
            loaded = datasets.load_dataset(name, config or None, cache_dir=str(cache_dir))
    except Exception as exc:  # the Hub's, the builders' and the parsers' errors alike
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise DataError(f"{name}: cannot load the dataset (data.dataset): {first[:200]}") from None
    splits = loaded if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    if train_split not in splits:
        raise DataError(f"{name}: no split {train_split!r} (data.train_split); it has {', '.join(sorted(splits))}")
    if eval_required and eval_split not in splits:
        raise DataError(
            f"{name}: no split {eval_split!r} (data.eval_split) and data.eval_fraction is 0; "
            f"it has {', '.join(sorted(splits))}"
        )
    train = texts_of(splits[train_split], column, f"{name} ({train_split})")
    held_out = texts_of(splits[eval_split], column, f"{name} ({eval_split})") if eval_split in splits else None
    return train, held_out


def has_text(row: dict[str, Any]) -> bool:
    """Whether a row holds a text that is not empty or blank."""
    return isinstance(row["text"], str) and bool(row["text"].strip())


def tokenize(rows: dict[str, list[str]], tokenizer: Any, max_length: int, eos_id: int) -> dict[str, list[list[int]]]:
    """Token ids of a batch of texts: the first ``max_length - 1`` tokens, then end-of-sequence."""
    ids = tokenizer(rows["text"], add_special_tokens=False)["input_ids"]
    return {"input_ids": [row[: max_length - 1] + [eos_id] for row in ids]}
