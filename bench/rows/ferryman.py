"""Row ``ferryman``: the exactly-once pair, ``ferryman-wrapper`` and ``ferryman-deduper`` processes."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from ferryman.status import deduper_status
from ferryman_local import reserve_port

from bench.crossing import Placement
from bench.rows.base import Row, RowContext, RowUnavailableError

#: The console scripts live next to the interpreter (``pip install -e .`` puts them there).
_BIN = Path(sys.executable).parent
#: Source cluster alias; with the prefix naming policy destination topics are ``source.<topic>``.
_SOURCE_ALIAS = "source"


class FerrymanRow(Row):
    """Wrapper(s) on the source side, deduper(s) on the destination side, joined by the control link."""

    name = "ferryman"
    exactly_once = True
    #: Keeps a variant's flow (staging topic, groups, state) and destination topics apart from the other
    #: Ferryman rows of the same round ("" for this row: its names as they always were).
    variant = ""

    def __init__(self, ctx: RowContext) -> None:
        super().__init__(ctx)
        self._deduper_addresses: list[str] = []

    @property
    def procs(self) -> tuple[int, int]:
        """(wrapper, deduper) processes: ``--wrapper-procs`` and ``--deduper-procs``."""
        return self.ctx.options.wrapper_procs, self.ctx.options.deduper_procs

    @property
    def alias(self) -> str:
        """Destination topics are ``source.<topic>`` (prefix policy; ``source-rN.<topic>`` in round N).

        A variant's are ``source-<variant>.<topic>``.
        """
        return _SOURCE_ALIAS + self.variant + self.ctx.round_tag

    def placement(self) -> Placement:
        """The wrapper next to the source, the dedupers next to the destination.

        What crosses: the wrapper's traffic with the destination's brokers (the staging
        writes, compressed as ``--compression`` says, and its discovery and commits there)
        and the control link the wrapper dials to the dedupers.
        """
        return Placement(
            "destination",
            {"ferryman-wrapper": "source", "ferryman-deduper": "destination"},
            crossing_compression=f"staging batches: {self.ctx.options.compression}",
        )

    def check(self) -> None:
        """The console scripts must be installed."""
        missing = [s for s in ("ferryman-wrapper", "ferryman-deduper") if not (_BIN / s).exists()]
        if missing:
            raise RowUnavailableError(f"{', '.join(missing)} not installed in {_BIN} (pip install -e .)")

    def _config(self, deduper_addresses: list[str]) -> dict[str, Any]:
        opts = self.ctx.options
        # A free metrics port per process (several run side by side); the endpoint runs as installed.
        deduper: dict[str, Any] = {"metrics_address": "127.0.0.1:0"}
        if opts.ferryman_txn_ms is not None:
            deduper["transaction_interval_ms"] = opts.ferryman_txn_ms
        flow: dict[str, Any] = {
            "name": f"bench-{self.ctx.run_id}{self.variant}",
            "source": self.alias,
            "target": "destination",
            "topics": ["^(" + "|".join(re.escape(t) for t in self.ctx.topics) + ")$"],
            "naming": {"policy": "prefix"},
        }
        if opts.staging_partitions is not None:
            # Staging partitions are the unit of deduper parallelism, not a copy of the source's partition count:
            # each one a deduper owns costs a state and an offset-map write in every transaction (see README).
            flow["staging_partitions"] = opts.staging_partitions
        return {
            "clusters": {
                self.alias: {"bootstrap_servers": self.ctx.source},
                "destination": {"bootstrap_servers": self.ctx.destination},
            },
            "flows": [flow],
            "wrapper": {
                "listen_address": "127.0.0.1:0",
                "metrics_address": "127.0.0.1:0",
                "compression_type": opts.compression,
                "deduper_addresses": deduper_addresses,
            },
            "deduper": deduper,
        }

    def launch(self) -> None:
        """Start the dedupers first (the wrappers connect to them), then the wrappers."""
        wrappers, dedupers = self.procs
        self._deduper_addresses = [f"127.0.0.1:{reserve_port()}" for _ in range(dedupers)]
        path = self.ctx.work_dir / "ferryman.yaml"
        path.write_text(yaml.safe_dump(self._config(self._deduper_addresses), sort_keys=False))
        for i, address in enumerate(self._deduper_addresses):
            self._spawn(
                [
                    str(_BIN / "ferryman-deduper"),
                    "--config",
                    str(path),
                    "--instance-id",
                    f"d{i}",
                    "--listen",
                    address,
                ],
                f"deduper-{i}.log",
            )
        for i in range(wrappers):
            self._spawn(
                [str(_BIN / "ferryman-wrapper"), "--config", str(path), "--instance-id", f"w{i}"], f"wrapper-{i}.log"
            )

    def counters(self) -> Mapping[str, float]:
        """The dedupers' transaction commits so far: how many, and their wall time and flush time in seconds.

        Raises:
            grpc.RpcError: a deduper did not answer its status call.
        """
        totals = {"commits": 0.0, "commit_s": 0.0, "commit_flush_s": 0.0}
        for address in self._deduper_addresses:
            status = deduper_status(address)
            totals["commits"] += status.transactions_committed
            totals["commit_s"] += status.commit_seconds_total
            totals["commit_flush_s"] += status.commit_flush_seconds_total
        return totals

    def settings(self) -> Mapping[str, object]:
        """Process counts and the deduper's transaction interval."""
        opts = self.ctx.options
        wrappers, dedupers = self.procs
        return {
            "wrapper_procs": wrappers,
            "deduper_procs": dedupers,
            "transaction_interval_ms": opts.ferryman_txn_ms or "service default",
            "staging_compression": opts.compression,
            "staging_partitions": opts.staging_partitions or "service default",
        }


class FerrymanOnePairRow(FerrymanRow):
    """One wrapper and one deduper whatever ``--wrapper-procs`` and ``--deduper-procs`` say.

    The baseline of the scale-out scenario, in the same run: ``--scenario scale-out --rows
    ferryman,ferryman-one-pair``. A flow of its own (``variant``), like the observed rows.
    """

    name = "ferryman-one-pair"
    variant = "-onepair"

    @property
    def procs(self) -> tuple[int, int]:
        """One of each."""
        return 1, 1
