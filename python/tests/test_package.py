"""The wheel: the gleaner binary and the package, installable as they are."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]


def maturin() -> str:
    beside = Path(sys.executable).parent / "maturin"
    if beside.is_file():
        return str(beside)
    pytest.fail("maturin is not installed beside this Python: pip install maturin")


def test_the_wheel_carries_the_binary_and_the_package_and_installs(tmp_path):
    out = tmp_path / "wheels"
    subprocess.run(
        [maturin(), "build", "--profile", "dev", "--out", str(out), "--quiet"],
        cwd=PYTHON_DIR,
        check=True,
    )
    (wheel,) = out.glob("gleaner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("__init__", "client", "executor", "_worker", "_cli", "errors"):
        assert f"gleaner/{module}.py" in names
    assert any(n.endswith(".data/scripts/gleaner") for n in names), names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [venv / "bin" / "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        check=True,
    )
    version = subprocess.run(
        [venv / "bin" / "gleaner", "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith("gleaner ")
    found = subprocess.run(
        [venv / "bin" / "python", "-c", "import gleaner._cli as c; print(c.find_binary())"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert found.stdout.strip() == str(venv / "bin" / "gleaner")
