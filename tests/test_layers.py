"""The layers of docs/ARCHITECTURE.md: no module imports from a layer above its own."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

import trainer

PACKAGE = ROOT / "trainer"
#: the package's face, outside the layers: names imported on first use, the earlier names
OUTSIDE = {"trainer", "trainer.compat"}
#: what ``from trainer import X`` may name from inside a layer: the lazily imported public names
OUTSIDE_NAMES = {*trainer.__all__, "compat"}


def layers() -> dict[str, int]:
    """Package -> layer number, from the architecture page's table."""
    table = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    found = {package: int(number) for number, package in re.findall(r"^\| (\d) \| `(trainer\.\w+)` \|", table, re.M)}
    assert len(found) == 6, found
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for every import of a trainer module, at any depth (functions too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("trainer")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainer"):
            assert node.level == 0, "relative import"
            # ``from trainer.state import checkpoint`` imports the module trainer.state.checkpoint
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def layer_of(module: str, table: dict[str, int]) -> int | None:
    for package, number in table.items():
        if module == package or module.startswith(f"{package}."):
            return number
    return None


def test_every_module_is_in_a_layer_and_imports_none_above_it():
    table = layers()
    upward, homeless = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name in OUTSIDE:
            continue
        own = layer_of(name, table)
        if own is None:
            homeless.append(name)
            continue
        for line, target in imported(ast.parse(path.read_text(), str(path))):
            theirs = layer_of(target, table)
            if theirs is not None and theirs > own:
                upward.append(f"{path.relative_to(ROOT)}:{line} (layer {own}) imports {target} (layer {theirs})")
            elif theirs is None and target.split(".")[1] not in OUTSIDE_NAMES:
                homeless.append(f"{path.relative_to(ROOT)}:{line} imports {target}, in no layer")
    assert not homeless, homeless
    assert not upward, "\n".join(upward)


def test_the_earlier_module_names_still_import_the_modules_with_a_warning():
    import warnings

    import trainer.contract.errors
    import trainer.contract.task

    for earlier in ("trainer.errors", "trainer.tasks.base"):  # as if for the first time
        sys.modules.pop(earlier, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from trainer.errors import ConfigError  # type: ignore[import-not-found]
        from trainer.tasks.base import Task  # type: ignore[import-not-found]
    assert ConfigError is trainer.contract.errors.ConfigError and Task is trainer.contract.task.Task
    assert [str(w.message).split(";")[0] for w in caught] == [
        "trainer.errors is now trainer.contract.errors",
        "trainer.tasks.base is now trainer.contract.task",
    ]
    from trainer.tasks import Task as earlier

    assert earlier is Task


def test_no_module_is_over_350_lines():
    folders = ("trainer", "scripts", "benchmarks", "research", "harness")
    sizes = {path: len(path.read_text().splitlines()) for f in folders for path in (ROOT / f).rglob("*.py")}
    assert sizes and not {str(p.relative_to(ROOT)): n for p, n in sizes.items() if n > 350}


def test_no_module_imports_torch_s_sharding_modules_a_run_without_sharding_does_not_need():
    """trainer.distributed.sharding.NOT_IMPORTED: each process that fails before training (a bad
    config, a bad init file) would pay about 0.9 s of CPU for them."""
    probe = (
        "import importlib, pkgutil, sys, trainer\n"
        "from trainer.distributed.sharding import NOT_IMPORTED\n"
        "for found in pkgutil.walk_packages(trainer.__path__, 'trainer.'):\n"
        "    importlib.import_module(found.name)\n"
        "print(sorted(name for name in NOT_IMPORTED if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
