"""``ferryman-deduper``: run the deduper of one flow."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ferryman.config import FerrymanConfig, FlowConfig
from ferryman.service import Service, main_for

from ferryman_deduper._deduper import Deduper


def _build(config: FerrymanConfig, flow: FlowConfig, args: argparse.Namespace) -> Service:
    return Deduper(config, flow, instance_id=args.instance_id, listen_address=args.listen)


def _add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", default=None, help="gRPC listen address host:port (default deduper.listen_address, [::]:7460)"
    )
    parser.add_argument(
        "--instance-id",
        default=None,
        help="stable identity of this deduper (transactional.id suffix); default deduper.instance_id or hostname",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console script entry point."""
    return main_for(
        "ferryman-deduper",
        "Deduplicate staging envelopes and write the original records to the destination, exactly once.",
        _build,
        _add_args,
        argv,
    )
