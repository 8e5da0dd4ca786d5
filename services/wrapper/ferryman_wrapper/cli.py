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
    """Console script entry point.

    The cyclic GC is off until the service has started (``tune_gc()`` freezes
    what start-up built and turns it back on): loading the modules is most of
    a service's start-up, and it creates objects, not garbage. So the service's
    modules load after ``gc.disable()`` (here and in ``_build``), not at the top
    of this module.
    """
    gc.disable()
    from ferryman.service import main_for  # noqa: PLC0415

    return main_for(
        "ferryman-wrapper",
        "Read source topics and write envelopes to the staging topic on the destination cluster.",
        _build,
        _add_args,
        argv,
    )
