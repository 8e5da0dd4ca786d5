"""``ferryman-wrapper``: run the wrapper of one flow."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ferryman.config import FerrymanConfig, FlowConfig
from ferryman.service import Service, main_for

from ferryman_wrapper._wrapper import Wrapper


def _build(config: FerrymanConfig, flow: FlowConfig, args: argparse.Namespace) -> Service:
    return Wrapper(config, flow, instance_id=args.instance_id, listen_address=args.listen)


def _add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", default=None, help="gRPC listen address host:port (default wrapper.listen_address, [::]:7450)"
    )
    parser.add_argument("--instance-id", default=None, help="wrapper identity in envelopes (default host-pid-random)")


def main(argv: Sequence[str] | None = None) -> int:
    """Console script entry point."""
    return main_for(
        "ferryman-wrapper",
        "Read source topics and write envelopes to the staging topic on the destination cluster.",
        _build,
        _add_args,
        argv,
    )
