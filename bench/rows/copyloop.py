"""Row ``copyloop``: the bare at-least-once copy loop (``bench.copyloop``), one process."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ferryman.client_config import STREAMING_CONSUMER_DEFAULTS
from ferryman.service import GC_GEN0_THRESHOLD

from bench.crossing import Placement
from bench.loader import LOAD_COMPRESSION
from bench.rows.base import Row
from bench.topics import create_topics

#: librdkafka's default linger: batches fill in ~5 ms at full speed and add at most 5 ms at low rates.
_LINGER_MS = 5
#: The directory that holds the ``bench`` package, for the child's import path.
_REPO_ROOT = Path(__file__).resolve().parents[2]


class CopyLoopRow(Row):
    """One Python process: batched consume, positional produce, commit after flush."""

    name = "copyloop"
    exactly_once = False

    @property
    def alias(self) -> str:
        """Destination topics are ``copyloop.<topic>`` (``copyloop-rN.<topic>`` in round N)."""
        return "copyloop" + self.ctx.round_tag

    def placement(self) -> Placement:
        """Next to the destination, like MirrorMaker 2: what crosses is its traffic with the source's brokers.

        Those are the source's fetch responses, compressed as the source's producers wrote them (the
        bench's load: ``LOAD_COMPRESSION``); the loop's own compression only applies on the destination's side.
        """
        return Placement("destination", crossing_compression=f"source batches as written: {LOAD_COMPRESSION}")

    def prepare(self) -> None:
        """Create the destination topics: unlike MirrorMaker 2 and Ferryman, a bare loop does not."""
        create_topics(self.ctx.destination, [self.destination_topic(t) for t in self.ctx.topics], self.ctx.partitions)

    def argv(self) -> list[str]:
        """The loop's command line: ``python -m bench.copyloop`` on every topic of the row."""
        return [
            sys.executable,
            "-m",
            "bench.copyloop",
            "--source",
            self.ctx.source,
            "--destination",
            self.ctx.destination,
            "--prefix",
            self.alias,
            "--group",
            f"bench-copyloop-{self.ctx.run_id}",
            "--linger-ms",
            str(_LINGER_MS),
            "--compression",
            self.ctx.options.compression,
            # The services' streaming consumer settings, passed so the loop need not import ferryman.
            *(f"--consumer-property={k}={v}" for k, v in STREAMING_CONSUMER_DEFAULTS.items()),
            # ...and their cyclic-GC setting: the ceiling of one process gets what the services get.
            f"--gc-gen0-threshold={GC_GEN0_THRESHOLD}",
            *self.ctx.topics,
        ]

    def launch(self) -> None:
        """Start the loop (``argv()``)."""
        self._spawn(
            self.argv(),
            "copyloop.log",
            env={"PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")]))},
        )

    def settings(self) -> Mapping[str, object]:
        """Process count and the knobs that matter."""
        return {
            "processes": 1,
            "linger_ms": _LINGER_MS,
            "compression": self.ctx.options.compression,
            "commit": "flush, then async, 1 s",
            "gc": f"start-up heap frozen, young collections every {GC_GEN0_THRESHOLD:,} allocations (as the services)",
        }
