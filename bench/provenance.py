"""Which code a bench run measured: the checkout's commit and whether it had local changes.

Figures are compared across sessions and machines; a run whose tree differed from
its commit (an experiment, a stale build) must say so in its own JSON.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

#: The project's checkout (bench/ sits at its top).
PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: Budget of one git call.
_GIT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CodeVersion:
    """The commit checked out and whether tracked files differ from it."""

    commit: str
    modified: bool

    def describe(self) -> str:
        """For instance ``"a9eee09c... (with local changes)"``."""
        return f"{self.commit}{' (with local changes)' if self.modified else ''}"


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def code_version(root: Path = PROJECT_ROOT) -> CodeVersion | None:
    """The checkout's commit, or None when ``root`` is not a git checkout (or git is missing)."""
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if commit is None or status is None:
        return None
    return CodeVersion(commit.strip(), bool(status.strip()))
