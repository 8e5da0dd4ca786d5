"""Process entry-point plumbing shared by the two services.

Parses the common flags, loads the configuration at the edge, sets up logging,
turns SIGTERM/SIGINT into a graceful shutdown and maps errors to exit codes:

* 0: stopped on request after draining;
* 2: configuration error;
* 3: fenced by another instance with the same identity;
* 4: source data lost (refused to skip);
* 5: a cluster did not answer within the start-up deadline (``startup_timeout_s``);
* 1: any other failure, or a process still held 15 s after its drain (its threads' stacks on stderr);
* killed by SIGALRM (142 in a shell): a drain still running 120 s after the SIGTERM (``DRAIN_KILL_S``).

Once running, a service waits out transient faults (broker restarts, outages)
instead of exiting: exit codes are for what a restart cannot fix.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from confluent_kafka import KafkaException

from ferryman.config import FerrymanConfig, FlowConfig, load_config
from ferryman.errors import ClusterUnreachableError, ConfigError, FencedError, FerrymanError, SourceDataLostError
from ferryman.kafka_errors import ErrorClass, authorization_error, classify
from ferryman.signals import on_signals

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_FENCED = 3
EXIT_DATA_LOST = 4
EXIT_UNREACHABLE = 5

_log = logging.getLogger(__name__)

#: After a SIGTERM, a drain still running this long writes every thread's stack to stderr, once: each
#: step of a drain is bounded (closes, flushes, the gRPC grace), so a longer one is a defect to read.
DRAIN_REPORT_S = 45.0
#: After a SIGTERM, a drain still running this long ends the process by SIGALRM, whose default action needs
#: no GIL: a client's C call that waits for ever holding it (librdkafka #4884, see ``ferryman.group_close``)
#: keeps every deadline in Python from firing. As after kill -9, the coordinator aborts the open transaction
#: and a replacement re-reads from the last commit. Above the longest bounded drain (a wrapper flushing for
#: ``shutdown_timeout_s``, 30 s, a commit, a consumer's settle and close, 5 + 15 s).
DRAIN_KILL_S = 120.0
#: After the drain, the process must be gone within this long. Something left holding it (a
#: non-daemon thread, a client's destructor) gets its stacks written to stderr and the process
#: exits 1: everything was committed or aborted by then, and a replacement can start.
EXIT_DEADLINE_S = 15.0

#: Gen-0 threshold of the cyclic GC in the services (CPython's default is 700).
#: Every consumed record allocates tracked objects (the timestamp tuple, list
#: slots), so at 700 a collection ran every couple of hundred records; with the
#: start-up heap (grpc, protobuf, the config) rescanned by the older generations it
#: cost ~550 ns per record in the wrapper's packing loop, as much as the packing.
#: The bench's copy loop and its reader are given the same setting.
GC_GEN0_THRESHOLD = 50_000


class Service(Protocol):
    """What the entry point needs from a service."""

    def run(self) -> None:
        """Block until shut down."""

    def shutdown(self) -> None:
        """Begin a graceful stop (signal-safe)."""


def tune_gc() -> None:
    """Keep the cyclic GC off the hot path (call once start-up is done), and on.

    Objects alive at this point (modules, config, the service) are frozen into
    the permanent generation, which collections never scan again, and young
    collections run every GC_GEN0_THRESHOLD allocations. The hot paths create
    no reference cycles, so memory is unaffected.

    No collection runs first: start-up leaves next to no cyclic garbage (under
    a thousand objects, measured), and a full collection of the start-up heap
    cost ~16 ms of CPU. The services' entry points (``cli.main``) switch the GC
    off before their modules load, which saves another ~30 ms: loading them is
    most of a service's start-up, and it creates objects, not garbage. Hence
    those modules import the service in functions, not at the top. This turns
    the GC back on.
    """
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)
    gc.enable()


def common_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """Argument parser with the flags every service takes."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ["FERRYMAN_CONFIG"]) if os.environ.get("FERRYMAN_CONFIG") else None,
        help="YAML configuration file (env FERRYMAN_CONFIG); without it the KAFKA_CLUSTERS_* "
        "variables describe a one-topic flow",
    )
    parser.add_argument("--flow", default=os.environ.get("FERRYMAN_FLOW"), help="flow to run (env FERRYMAN_FLOW)")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("FERRYMAN_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (env FERRYMAN_LOG_LEVEL)",
    )
    return parser


def _flow_to_run(config: FerrymanConfig, name: str | None) -> FlowConfig:
    """The flow named by --flow: from the configuration, else from the flow stores (created by the API).

    Raises:
        ConfigError: in neither.
    """
    if name is None or any(f.name == name for f in config.flows):
        return config.flow(name)
    from ferryman.flows import from_stores  # noqa: PLC0415 (Kafka clients only on this path)

    return from_stores(config.clusters, name, client_id="ferryman-flow-lookup")


def run_service(
    name: str,
    args: argparse.Namespace,
    factory: Callable[[FerrymanConfig, FlowConfig, argparse.Namespace], Service],
) -> int:
    """Load config, build the service, run it with signal handling; return the exit code."""
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s %(levelname)s {name} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = load_config(args.config)
        flow = _flow_to_run(config, args.flow)
        service = factory(config, flow, args)
    except ConfigError as exc:
        print(f"{name}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    draining = False

    def on_signal(signum: int) -> None:  # on the relay's thread (`ferryman.signals`), never in a handler
        nonlocal draining
        _log.info("received %s: draining", signal.Signals(signum).name)
        if not draining:  # a second signal does not push the deadlines back
            draining = True
            arm_drain_deadlines()
        service.shutdown()

    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the drain's last deadline (`arm_drain_deadlines`)
    on_signals(on_signal)
    tune_gc()
    try:
        service.run()
    except FencedError as exc:
        _log.error("fenced: %s", exc)
        return EXIT_FENCED
    except SourceDataLostError as exc:
        _log.error("source data lost: %s", exc)
        return EXIT_DATA_LOST
    except ConfigError as exc:
        _log.error("configuration error: %s", exc)
        return EXIT_CONFIG
    except ClusterUnreachableError as exc:
        _log.error("%s", exc)
        return EXIT_UNREACHABLE
    except FerrymanError as exc:
        _log.error("%s failed: %s", name, exc)
        return EXIT_FAILURE
    except KafkaException as exc:
        denied = authorization_error(exc, operation=f"run the {name}")
        if denied is not None:
            _log.error("configuration error: %s", denied)
            return EXIT_CONFIG
        if classify(exc) is ErrorClass.FENCED:
            _log.error("fenced: %s", exc, exc_info=True)
            return EXIT_FENCED
        _log.error("%s failed on an unrecoverable Kafka error: %s", name, exc)
        return EXIT_FAILURE
    return EXIT_OK


def main_for(
    prog: str,
    description: str,
    factory: Callable[[FerrymanConfig, FlowConfig, argparse.Namespace], Service],
    add_args: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: Sequence[str] | None = None,
) -> int:
    """Full console-script main: parse argv and run the service."""
    parser = common_parser(prog, description)
    if add_args is not None:
        add_args(parser)
    code = run_service(prog, parser.parse_args(argv), factory)
    exit_within(EXIT_DEADLINE_S)
    return code


def arm_drain_deadlines(report_s: float = DRAIN_REPORT_S, kill_s: float = DRAIN_KILL_S) -> None:
    """At report_s every thread's stack goes to stderr, at kill_s the process ends by SIGALRM.

    Both fire without the GIL: faulthandler's timer is a C thread, and SIGALRM's default action (which
    ``run_service`` makes sure of) is the kernel's. Only for a process's main, as ``exit_within``; any thread.
    """
    faulthandler.dump_traceback_later(report_s)
    signal.setitimer(signal.ITIMER_REAL, kill_s)


def exit_within(deadline_s: float) -> None:
    """Make sure the process is gone deadline_s from now: else stacks to stderr and exit 1.

    Interpreter exit joins non-daemon threads and runs Kafka clients' destructors, and either can
    wait for ever on a wedged call. faulthandler's timer is a C thread: it needs no GIL to dump
    every thread's stack and ``_exit``. Only for a process's main: it would end a test runner too.
    """
    signal.setitimer(signal.ITIMER_REAL, 0)  # the drain is over: this deadline replaces DRAIN_KILL_S
    faulthandler.cancel_dump_traceback_later()
    faulthandler.dump_traceback_later(deadline_s, exit=True)
