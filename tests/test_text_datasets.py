"""The text recipe's texts from a dataset by name (``data.dataset``): a local dataset
directory (``save_to_disk``, or a folder of data files with a README card), its splits, its
text column, 1 and 2 processes, and offline a name that is not cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, launch, records
from test_text import EVAL_TEXTS, bad, check_evals, write_text_run

from trainer.commands.cli import main
from trainer.contract.errors import DataError
from trainer.tasks.text_data import read_dataset


def rows(path):
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The example's texts as a ``save_to_disk`` DatasetDict (train, validation), in a column
    named ``body``, beside a column the recipe does not read."""
    import datasets

    from trainer.commands.text_example import write_text_example

    root = tmp_path_factory.mktemp("text_dataset")
    paths = write_text_example(root, "gpt2", vocab_size=300, eval_texts=EVAL_TEXTS)
    splits = {}
    for split, name in (("train", "train"), ("validation", "eval")):
        texts = rows(paths[name])
        splits[split] = datasets.Dataset.from_dict({"body": texts, "id": list(range(len(texts)))})
    datasets.DatasetDict(splits).save_to_disk(str(root / "saved"))
    return {**paths, "dataset": root / "saved"}


def dataset_config(saved, data=None, options=None):
    """The overrides that point a text run at the saved dataset (its column ``body``)."""
    data = {"train_files": "", "eval_files": "", "dataset": str(saved["dataset"]), **(data or {})}
    return {"data": data, "task_options": {"text_column": "body", **(options or {})}}


def dataset_run(tmp_path, saved, data=None, options=None):
    return write_text_run(tmp_path, saved, dataset_config(saved, data, options))


def test_a_folder_of_data_files_with_a_card_reads_its_splits(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": f"train {i}"}) + "\n" for i in range(5)))
    (folder / "b.jsonl").write_text("".join(json.dumps({"text": f"held out {i}"}) + "\n" for i in range(3)))
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: a.jsonl\n"
        "  - split: test\n    path: b.jsonl\n---\n# texts\n"
    )
    train, held_out = read_dataset(str(folder), "", "train", "test", "text", tmp_path / "cache")
    assert train["text"] == [f"train {i}" for i in range(5)]
    assert held_out["text"] == [f"held out {i}" for i in range(3)]
    train, held_out = read_dataset(str(folder), "", "train", "validation", "text", tmp_path / "cache")
    assert len(train) == 5 and held_out is None  # no such split: the caller holds texts out
    with pytest.raises(DataError, match=f"{folder}: no split 'training' \\(data.train_split\\); it has test, train"):
        read_dataset(str(folder), "", "training", "test", "text", tmp_path / "cache")
    with pytest.raises(
        DataError, match=f"{folder} \\(train\\): no column 'body' \\(task_options.text_column\\); it has text"
    ):
        read_dataset(str(folder), "", "train", "test", "body", tmp_path / "cache")


@pytest.mark.timeout(300)
def test_a_saved_dataset_trains_in_one_process_with_both_splits(tmp_path, saved):
    config = dataset_run(tmp_path, saved)
    assert main(["--config", str(config), "--device", "cpu"]) == 0
    check_evals(tmp_path / "out", 1)  # every validation text, once


@pytest.mark.timeout(300)
def test_a_saved_dataset_trains_in_two_processes(tmp_path, saved):
    config = dataset_run(tmp_path, saved)
    result = launch(["--config", str(config), "--device", "cpu"], 2, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    check_evals(tmp_path / "out", 2)


@pytest.mark.timeout(300)
def test_without_an_eval_split_a_share_of_train_is_held_out(tmp_path, saved):
    config = dataset_run(tmp_path, saved, {"eval_split": "test", "eval_fraction": 0.01})
    assert main(["--config", str(config), "--device", "cpu"]) == 0
    held_out = records(tmp_path / "out", "eval")[-1]["num_samples"]
    assert held_out == -(-len(rows(saved["train"])) // 100)


@pytest.mark.timeout(300)
def test_bad_dataset_settings_are_one_line_each(tmp_path, saved, capsys):
    dataset = saved["dataset"]
    line = bad(tmp_path / "split", saved, dataset_config(saved, {"eval_split": "test"}), capsys)
    assert f"{dataset}: no split 'test' (data.eval_split) and data.eval_fraction is 0; it has train, validation" in line
    line = bad(tmp_path / "column", saved, dataset_config(saved, options={"text_column": "title"}), capsys)
    assert f"{dataset} (train): no column 'title' (task_options.text_column); it has body, id" in line
    line = bad(tmp_path / "both", saved, dataset_config(saved, {"train_files": str(saved["train"])}), capsys)
    assert "key 'data.dataset'" in line and "data.train_files" in line


@pytest.mark.timeout(120)
def test_offline_a_name_that_is_not_cached_is_one_line(tmp_path, saved):
    config = dataset_run(tmp_path, saved, {"dataset": "no-such-org/no-such-texts"})
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_stage2.py"), "--config", str(config), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=100,
        env=offline,
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "no-such-org/no-such-texts: cannot load the dataset (data.dataset): " in lines[0], lines
    assert "Traceback" not in result.stderr
