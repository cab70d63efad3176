"""The docs: the site builds in strict mode (a broken link or anchor fails it), the README stays
short, its own-model config trains as written, and the reference pages are what the code makes."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, check, launch, records

from trainer.commands import reference


def build_site(source: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of the site whose mkdocs.yml lies in ``source``."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=source, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


@pytest.mark.timeout(150)
def test_the_docs_site_builds_in_strict_mode(tmp_path):
    built = build_site(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "getting-started" / "index.html").is_file()
    # the home page holds the README's opening paragraph, included, not copied
    assert "that cannot deadlock" in (tmp_path / "site" / "index.html").read_text()
    # the own-task page holds the example's files, included from examples/own_task/
    assert "TwoPeaksOptions" in (tmp_path / "site" / "own-task" / "index.html").read_text()


@pytest.mark.timeout(150)
def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy)
    shutil.copy(ROOT / "README.md", copy)  # the home page includes its opening paragraph
    shutil.copytree(ROOT / "examples", copy / "examples")  # and pages include example files
    page = copy / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\n[a](launching.md#no-such-section), [b](no-such-page.md)\n")
    built = build_site(copy, tmp_path / "site")
    assert built.returncode != 0
    assert "does not contain an anchor '#no-such-section'" in built.stderr, built.stderr
    assert "'no-such-page.md', but the target is not found" in built.stderr, built.stderr


def test_the_readme_is_at_most_250_lines_and_links_every_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = set(re.findall(r"'([\w/-]+\.md)'", str(nav))) - {"index.md"}
    linked = set(re.findall(r"\]\(docs/([\w/-]+\.md)\)", readme))
    assert pages and pages <= linked, sorted(pages - linked)
    # every file in docs/ a link may reach is in the site's nav
    assert {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")} == pages | {"index.md"}


@pytest.mark.timeout(300)
def test_the_readme_s_own_model_config_trains(tmp_path):
    """examples/my_model.yaml as the README shows it, beside texts of its own, on the offline
    example's GPT-2 in place of the model id: two steps and an eval."""
    example = (ROOT / "examples" / "my_model.yaml").read_text()
    shown = re.search(
        r"<!-- example: examples/my_model.yaml -->\n```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S
    )
    assert shown and shown[1] == example
    make = [sys.executable, str(ROOT / "scripts" / "make_text_example.py"), str(tmp_path / "text_example")]
    check(subprocess.run(make, capture_output=True, text=True, timeout=120))
    for name in ("texts.jsonl", "eval.jsonl"):  # the config names them beside itself
        shutil.copy(tmp_path / "text_example" / name, tmp_path / name)
    (tmp_path / "my_model.yaml").write_text(example)
    short = ["--set=training.max_steps=2", "--set=training.eval_every=2", "--set=eval.batch_size=20"]
    model = f"--set=model.generator_config={tmp_path / 'text_example' / 'gpt2'}"
    args = ["--config", str(tmp_path / "my_model.yaml"), "--device", "cpu", model, *short]
    result = check(launch([*args, "--output-dir", str(tmp_path / "out")], 1))
    assert "discriminator: score head newly initialised; the rest from " in result.stderr
    assert [r["step"] for r in records(tmp_path / "out", "eval")] == [2]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(reference.PAGES))
def test_each_reference_page_is_what_the_code_makes(name):
    """docs/reference/: the config keys from the dataclasses, the commands from their --help;
    rewrite them with ``python -m trainer.commands.reference``."""
    made = reference.PAGES[name]().rstrip() + "\n"
    assert (ROOT / "docs" / "reference" / name).read_text() == made, f"docs/reference/{name} is out of date"


def test_a_config_key_without_a_comment_fails_the_reference():
    @dataclasses.dataclass
    class Section:
        #: documented
        shown: int = 1
        hidden: str = ""

    with pytest.raises(ValueError, match="Section.hidden has no #: comment"):
        list(reference.rows(Section))


def test_the_config_reference_lists_every_key_with_its_default():
    page = reference.config_page()
    assert "| `training.max_steps` | int | `1000` | generator optimizer steps |" in page
    assert "| `optim.generator.betas` | list of float | `[0.5, 0.999]` |" in page
    assert '| `training.loss` | `"non_saturating"` \\| `"hinge"` \\| `"least_squares"` \\| `"wasserstein"` |' in page
    assert '| `data.train_files` | str or list of str | `""` |' in page
    keys = set(re.findall(r"^\| `([\w.]+)` \|", page, re.M))
    assert {"distributed.stop_grace_s", "stage1.discriminator_from_generator", "task_options.packing"} <= keys
    assert {"task_options.seq_len", "task_options.max_new_tokens", "task_options.generator_objective"} <= keys


@pytest.mark.timeout(300)
def test_the_python_api_page_s_block_runs(tmp_path):
    """docs/python-api.md's block, shrunk to a few steps in a directory of the test's own."""
    block = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "python-api.md").read_text(), re.S)[1]
    steps, final = '{"training.max_steps": 1500}', '"outputs/ring/final"'
    assert steps in block and final in block
    shrunk = {"training.max_steps": 4, "training.eval_every": 2, "training.save_every": 2}
    shrunk |= {"training.log_with": ["none"], "task_options.plot": False, "output_dir": str(tmp_path / "ring")}
    code = block.replace(steps, repr(shrunk)).replace(final, repr(str(tmp_path / "ring" / "final")))
    code += "\nprint('RESULT', scores['num_samples'], metrics['step'])\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "RESULT 2500 4", done.stdout[-2000:]
    assert {r["world_size"] for r in records(tmp_path / "ring", "eval")} == {2}  # the launch replaced the first run
