"""Bytecode of the code the bench launches, compiled before anything is timed.

An installed wheel carries compiled bytecode (pip compiles it at install), but
the bench runs the project from its editable install, and where
``PYTHONDONTWRITEBYTECODE`` is set (as on the machine these figures come from)
Python never caches what it compiles: every launch of a service would compile
its ~40 modules from source again (0.03-0.2 CPU s per service process in 3
interleaved pairs of start-ups here), counted in the row's CPU as if it were
the replicator's start-up work. The bench writes the bytecode once, so each
row starts as an installed one would.
"""

from __future__ import annotations

import compileall
import importlib.util
from collections.abc import Sequence
from pathlib import Path

#: Packages whose code runs in the rows' processes (the services, their contracts, the copy loop).
LAUNCHED_PACKAGES = ("ferryman", "ferryman_wrapper", "ferryman_deduper", "bench")


def package_dirs(packages: Sequence[str] = LAUNCHED_PACKAGES) -> list[Path]:
    """Directories of ``packages``, as the launched processes will import them."""
    dirs: list[Path] = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"package {name} is not importable here (pip install -e .)")
        dirs.extend(Path(p) for p in spec.submodule_search_locations)
    return dirs


def compile_launched_code(packages: Sequence[str] = LAUNCHED_PACKAGES) -> bool:
    """Write the bytecode of ``packages`` (what is already up to date is left); True if all compiled."""
    return all(compileall.compile_dir(d, quiet=1) for d in package_dirs(packages))
