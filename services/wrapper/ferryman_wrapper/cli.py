"""``ferryman-wrapper``: run the wrapper of one flow."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ferryman.config import FerrymanConfig, FlowConfig
    from ferryman.service import Service


def _build(config: FerrymanConfig, flow: FlowConfig, args: argparse.Namespace) -> Service:
    from ferryman_wrapper._wrapper import Wrapper  # noqa: PLC0415 (after gc.disable(), see main())

    return Wrapper(config, flow, instance_id=args.instance_id, listen_address=args.listen)


def _add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", default=None, help="gRPC listen address host:port (default wrapper.listen_address, [::]:7450)"
    )
    parser.add_argument("--instance-id", default=None, help="wrapper identity in envelopes (default host-pid-random)")


def main(argv: Sequence[str] | None = None) -> int:
    """Console script entry point; the service's modules load with the GC off (``ferryman.service.tune_gc``)."""
    gc.disable()
    from ferryman.service import main_for  # noqa: PLC0415

    return main_for(
        "ferryman-wrapper",
        "Read source topics and write envelopes to the staging topic on the destination cluster.",
        _build,
        _add_args,
        argv,
    )
