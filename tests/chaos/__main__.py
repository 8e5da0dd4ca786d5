"""``python -m tests.chaos [--long] [--seed N] [--out DIR]``: one chaos run, its report, exit 1 unless clean."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.runner import BREAKAGES, ChaosRun, broken_deduper_env
from tests.chaos.schedule import CI, LONG, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--long", action="store_true", help="the long schedule (>= 1 M records, 120 faults)")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: the time)")
    parser.add_argument("--out", type=Path, default=None, help="where the report and the logs go")
    parser.add_argument("--plan", action="store_true", help="print the schedule and exit")
    parser.add_argument("--faults", type=int, default=None, help="apply only the schedule's first N faults")
    parser.add_argument(
        "--break-deduper",
        choices=BREAKAGES,
        default=None,
        help="run a deliberately broken deduper (tests/helpers/break_deduper): the verdict must be FAILED",
    )
    parser.add_argument(
        "--cpu-per-process",
        type=float,
        default=None,
        metavar="CORES",
        help="cap each service process at CORES (a cgroup each, needs root): slow services widen race windows",
    )
    args = parser.parse_args(argv)
    profile = LONG if args.long else CI
    seed = args.seed if args.seed is not None else int(time.time())
    out = args.out or Path(tempfile.mkdtemp(prefix=f"ferryman-chaos-{seed}-"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    run = ChaosRun(
        seed,
        profile,
        out,
        service_env=broken_deduper_env(args.break_deduper) if args.break_deduper else None,
        cpu_per_process=args.cpu_per_process,
    )
    if args.faults is not None:
        run.schedule = run.schedule[: args.faults]
    if args.plan:
        for f in run.schedule:
            print(f.to_json())
        print(counts(run.schedule))
        return 0
    # SIGTERM (a CI job's cancel, kill PID) unwinds like Ctrl-C: the services run in sessions of their
    # own and would outlive this process (they did, spinning against dead clusters) without the cleanup.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    report = run.run()
    js, txt = report.write(out)
    print(report.summary())
    print(f"report: {js} and {txt}; logs under {out}")
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
