"""The installed package holds the product only: the harness (launching, the fault matrix) stays
in the source checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest
from helpers import ROOT


@pytest.mark.timeout(120)
def test_the_wheel_holds_the_trainer_package_alone(tmp_path):
    source = tmp_path / "source"  # a copy: an in-tree build would leave build/ in the checkout
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for name in ("trainer", "harness"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run([*command, "-q", "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # the distribution's name is free on the package index; the import name stays trainer
    assert {name.split("/")[0] for name in names} == {"trainer", "adversarial_trainer-0.1.0.dist-info"}
    assert "adversarial_trainer-0.1.0.dist-info/licenses/LICENSE" in names
    assert {"trainer/training/loop.py", "trainer/tasks/oracle_text.py", "trainer/contract/config/sections.py"} <= set(
        names
    )
    assert not [name for name in names if "faultmatrix" in name or name.endswith("testing.py")]


def test_the_product_imports_nothing_from_the_harness():
    importers = [path for path in (ROOT / "trainer").rglob("*.py") if "harness" in path.read_text()]
    assert importers == []
