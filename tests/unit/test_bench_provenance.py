"""bench.provenance: the commit a bench run measured, and whether the tree differed from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.provenance import PROJECT_ROOT, CodeVersion, code_version


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_checkout_names_its_commit_and_local_changes(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert code_version(tmp_path) == CodeVersion(head, modified=False)
    (tmp_path / "untracked.txt").write_text("not part of the code\n")
    assert code_version(tmp_path) == CodeVersion(head, modified=False)
    (tmp_path / "a.txt").write_text("two\n")
    version = code_version(tmp_path)
    assert version == CodeVersion(head, modified=True)
    assert version is not None
    assert version.describe() == f"{head} (with local changes)"


def test_not_a_checkout(tmp_path: Path) -> None:
    assert code_version(tmp_path / "nowhere") is None


def test_the_project_itself() -> None:
    version = code_version()
    assert version is not None
    assert version.commit == _git(PROJECT_ROOT, "rev-parse", "HEAD")
