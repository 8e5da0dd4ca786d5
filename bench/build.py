"""Build the bench's compiled reader (``bench/_readcols.pyx``) in place: ``python -m bench.build``.

``scripts/bootstrap`` runs it. The bench is run from a checkout and is not part
of the installed package, so its extension is not in ``setup.py``: a ``pip
install .`` of Ferryman must not ship a stray ``bench`` module. setuptools
compiles the ``.pyx`` with Cython (a dev dependency) and rebuilds only when the
source changed. Without a C compiler the build fails, this says so, and the
bench reads through ``consume()`` (``bench.readcols.WHY_NOT`` says why).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.errors import CompileError, PlatformError

_ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    """Build; 0 when built or up to date, 1 when it could not be (the bench still runs)."""
    os.chdir(_ROOT)  # setuptools takes the sources relative to the project
    try:
        setup(
            name="ferryman-bench-reader",
            ext_modules=[Extension("bench._readcols", ["bench/_readcols.pyx"])],
            script_args=["--quiet", "build_ext", "--inplace", "--build-temp", str(_ROOT / "build" / "bench")],
        )
    except (CompileError, PlatformError, SystemExit) as exc:
        print(f"bench.build: the compiled reader was not built ({exc}); the bench reads through consume()")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
