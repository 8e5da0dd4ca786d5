"""Broker jars from Maven Central, cached outside git.

``ensure_kafka_jars()`` resolves the pinned Apache Kafka release (and, on
request, MirrorMaker 2) with ``mvn dependency:copy-dependencies`` into
``$FERRYMAN_CACHE_DIR`` (default ``~/.cache/ferryman``), one directory per
Kafka version and flavour, suffixed with a hash of the pom so that editing the
pom resolves again instead of reusing stale jars. A marker file written last makes later calls return
at once; an ``fcntl`` lock keeps parallel processes from resolving twice or
reading a half-filled directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from ferryman_local._errors import JarResolutionError, ToolMissingError

KAFKA_VERSION = "4.1.1"
"""The Apache Kafka release the poms pin (keep in step with ``kafka/*.xml``)."""

_DONE_MARKER = ".complete"
_OUTPUT_TAIL_CHARS = 4000
# Cold resolution downloads ~55 MB (~110 MB with MirrorMaker); warm it takes ~10 s.
_RESOLVE_TIMEOUT_S = 900.0


def cache_dir() -> Path:
    """Root of Ferryman's download cache: ``$FERRYMAN_CACHE_DIR`` or ``~/.cache/ferryman``."""
    configured = os.environ.get("FERRYMAN_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "ferryman"


def require_tool(name: str) -> str:
    """Absolute path of an executable on ``PATH``.

    Raises:
        ToolMissingError: it is not there.
    """
    found = shutil.which(name)
    if found is None:
        raise ToolMissingError(f"{name} is not on PATH; install a JDK (17+) and Maven 3 (scripts/bootstrap does)")
    return found


def ensure_kafka_jars(*, with_mirrormaker: bool = False) -> Path:
    """Directory holding the broker jars (and MirrorMaker 2's, if asked), resolving them once.

    Args:
        with_mirrormaker: also resolve ``connect-mirror`` and ``connect-runtime``
            (a separate, larger cache directory).

    Returns:
        A directory of jars, usable as the Java class path ``<dir>/*``.

    Raises:
        ToolMissingError: ``java`` (or, when resolving, ``mvn``) is not on ``PATH``.
        JarResolutionError: Maven failed; the message ends with its output.
    """
    require_tool("java")
    flavour = "mirrormaker" if with_mirrormaker else "broker"
    pom_name = "mirrormaker-pom.xml" if with_mirrormaker else "pom.xml"
    pom_hash = hashlib.sha256(_pom(pom_name).read_bytes()).hexdigest()[:12]
    target = cache_dir() / f"kafka-{KAFKA_VERSION}-{flavour}-{pom_hash}"
    if (target / _DONE_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (target / _DONE_MARKER).exists():  # another process finished while we waited
            return target
        _resolve(pom_name, target)
    return target


def _pom(name: str) -> Traversable:
    return resources.files("ferryman_local").joinpath("kafka", name)


def _resolve(pom_name: str, target: Path) -> None:
    mvn = require_tool("mvn")
    target.mkdir(parents=True, exist_ok=True)
    with resources.as_file(_pom(pom_name)) as pom:
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={target}",
            "-DincludeScope=runtime",
        ]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=_RESOLVE_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise JarResolutionError(
                f"Maven did not resolve Kafka {KAFKA_VERSION} ({pom_name}) within {_RESOLVE_TIMEOUT_S:.0f}s"
            ) from exc
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-_OUTPUT_TAIL_CHARS:]
        raise JarResolutionError(
            f"Maven could not resolve Kafka {KAFKA_VERSION} ({pom_name}, exit {result.returncode}); "
            f"command: {' '.join(cmd)}\n{tail}"
        )
    if not any(target.glob("kafka_2.13-*.jar")):
        raise JarResolutionError(f"Maven succeeded but {target} holds no kafka_2.13 jar")
    # Written last, atomically: its presence means the directory is complete.
    partial = target / f"{_DONE_MARKER}.tmp"
    partial.write_text(f"{KAFKA_VERSION}\n")
    partial.replace(target / _DONE_MARKER)
