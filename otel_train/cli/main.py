"""The `otel-train` command line: one parser, a subcommand per module.

    otel-train run train.py [args...]      run a script instrumented (like opentelemetry-instrument)
    otel-train bench overhead [--quick] [--rounds N] [--step large|small|both] [--mode M]
                              [--targets-only] [--block-steps N]
                                           what instrumentation costs, against a baseline in the same run
    otel-train bench device [--steps N]    device timing: synchronisations added, device vs profiler time
    otel-train bench startup [--loop explicit|auto|auto-manual] [--steps N] [--rounds N] [--quick]
                                           the first steps' time with and without otel_train's start
    otel-train bench latency MODULE:FUNCTION [--seq-len N | --input-shape ... | --example F] [--warmup N --iters N]
                                           forward and forward+backward latency on synthetic batches
    otel-train diagnose PATH [--json]      stragglers, clock skew, slow steps, goodput
    otel-train report PATH [-o FILE]       a self-contained HTML report of a run
    otel-train export --format perfetto|jaeger PATH [-o FILE]   trace JSON for Perfetto / Jaeger UI

Each command is a module here with `add_parser(subparsers)` and `run(args, parser) -> int`
(`run.py`, `bench.py`, `analysis.py`, which has three); a new command adds its module to `COMMANDS`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from otel_train.cli import analysis, bench, run

#: The commands, in `--help` order.
COMMANDS = {"run": run, "bench": bench, "diagnose": analysis, "report": analysis, "export": analysis}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-train", description="OpenTelemetry for PyTorch training.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in dict.fromkeys(COMMANDS.values()):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv[:1] == ["run"]:
        return run.run_argv(argv[1:], parser)  # everything after the script belongs to the script
    args = parser.parse_args(argv)
    return COMMANDS[args.command].run(args, parser)


if __name__ == "__main__":
    sys.exit(main())
