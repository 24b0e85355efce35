"""`otel-train run script.py args...`: run a training script, unmodified, instrumented.

The work is `otel_train.run.main` (also `python -m otel_train.run`, and under torchrun); this
is its place in the command line.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run a training script instrumented, unmodified",
                         description="Run SCRIPT with automatic instrumentation (arguments pass through).")
    run.add_argument("script", help="the training script (or -m module)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def run_argv(argv: list[str], parser: argparse.ArgumentParser) -> int:
    """`otel-train run ARGV...`: every argument after the script is the script's, flags included,
    so they are not parsed here."""
    if not argv or argv[0] in ("-h", "--help"):
        parser.parse_args(["run", *argv])
        return 2
    from otel_train.run import main as run_main  # the launcher, only for this command
    return run_main(argv)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return run_argv([args.script, *args.args], parser)
