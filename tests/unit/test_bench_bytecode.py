"""The bench compiles the bytecode of what it launches before timing anything."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench.bytecode import LAUNCHED_PACKAGES, compile_launched_code, package_dirs


def _package(root: Path, name: str, source: str) -> Path:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(source)
    return pkg


def test_bytecode_is_written_for_every_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _package(tmp_path, "bytecode_probe_ok", "X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert compile_launched_code(["bytecode_probe_ok"])
    cached = Path(importlib.util.cache_from_source(str(pkg / "mod.py")))
    assert cached.is_file()


def test_a_module_that_does_not_compile_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(tmp_path, "bytecode_probe_bad", "def broken(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not compile_launched_code(["bytecode_probe_bad"])


def test_a_missing_package_is_named() -> None:
    with pytest.raises(ModuleNotFoundError, match="no_such_package_here"):
        package_dirs(["no_such_package_here"])


def test_the_launched_packages_are_found_here() -> None:
    dirs = package_dirs(LAUNCHED_PACKAGES)
    assert len(dirs) >= len(LAUNCHED_PACKAGES)
    assert all((d / "__init__.py").is_file() for d in dirs)
