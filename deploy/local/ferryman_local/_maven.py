"""Broker jars from Maven Central, cached outside git.

``ensure_kafka_jars()`` resolves the pinned Apache Kafka release (and, on
request, MirrorMaker 2) with ``mvn dependency:copy-dependencies`` into
``$FERRYMAN_CACHE_DIR`` (default ``~/.cache/ferryman``) once; later calls
return at once. A file lock keeps parallel processes from racing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from ferryman_local._errors import HarnessError

KAFKA_VERSION = "4.1.1"
_DONE_MARKER = ".complete"


def cache_dir() -> Path:
    """Root of Ferryman's download cache."""
    return Path(os.environ.get("FERRYMAN_CACHE_DIR") or Path.home() / ".cache" / "ferryman")


def ensure_kafka_jars(*, with_mirrormaker: bool = False) -> Path:
    """Directory holding the broker (and optionally MirrorMaker 2) jars.

    Raises:
        HarnessError: java or mvn is missing, or Maven could not resolve the jars.
    """
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise HarnessError(f"{tool} is not on PATH; install a JDK (17+) and Maven (scripts/bootstrap does)")
    flavour = "mirrormaker" if with_mirrormaker else "broker"
    target = cache_dir() / f"kafka-{KAFKA_VERSION}-{flavour}"
    if (target / _DONE_MARKER).exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    pom_name = "mirrormaker-pom.xml" if with_mirrormaker else "pom.xml"
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _DONE_MARKER).exists():
            return target
        with resources.as_file(resources.files("ferryman_local") / "kafka" / pom_name) as pom:
            result = subprocess.run(
                [
                    "mvn",
                    "-q",
                    "-B",
                    "-f",
                    str(pom),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={target}",
                    "-DincludeScope=runtime",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
        if result.returncode != 0:
            tail = (result.stdout + result.stderr)[-3000:]
            raise HarnessError(f"Maven could not resolve Kafka {KAFKA_VERSION} ({pom_name}):\n{tail}")
        (target / _DONE_MARKER).write_text(KAFKA_VERSION)
    return target
