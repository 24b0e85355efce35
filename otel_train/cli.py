"""The `otel-train` command line.

    otel-train run train.py [args...]      run a script instrumented (like opentelemetry-instrument)
    otel-train bench overhead [--quick] [--rounds N] [--step large|small|both] [--mode M]
                              [--targets-only] [--block-steps N]
                                           what instrumentation costs, against a baseline in the same run
    otel-train bench device [--steps N]    device timing: synchronisations added, device vs profiler time
    otel-train bench latency MODULE:FUNCTION [--seq-len N | --input-shape ...] [--warmup N --iters N]
                                           forward and forward+backward latency on synthetic batches
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-train", description="OpenTelemetry for PyTorch training.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run a training script instrumented, unmodified",
                         description="Run SCRIPT with automatic instrumentation (arguments pass through).")
    run.add_argument("script", help="the training script (or -m module)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    bench = sub.add_parser("bench", help="benchmarks (ratios against a baseline in the same run)")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    overhead = bench_sub.add_parser("overhead", help="hot-path region and training-step overhead")
    overhead.add_argument("--quick", action="store_true", help="few rounds (a smoke run, not a measurement)")
    overhead.add_argument("--mode", choices=("process", "idle", "thread", "all"), default="all",
                          help="export mode(s) to measure: the exporter process (default priority), the "
                               "exporter process at idle priority, the worker thread, or all (default), "
                               "process first")
    overhead.add_argument("--rounds", type=int, default=15,
                          help="rounds of interleaved blocks per step benchmark (default 15; more narrow "
                               "the confidence intervals on a noisy machine)")
    overhead.add_argument("--step", choices=("large", "small", "both"), default="both",
                          help="which step benchmarks to run, each with its automatic-instrumentation "
                               "variant (and the small one's spare-core variant): the ~20 ms step, the "
                               "~2.5 ms one, or both (default)")
    overhead.add_argument("--targets-only", action="store_true",
                          help="only the blocks the step targets are judged on (plain, instrumented, "
                               "automatic), so more rounds fit in the same time: no region, export, SDK, "
                               "hot-path or spare-core figures")
    overhead.add_argument("--block-steps", type=int, default=None,
                          help="steps per timed block of the ~20 ms step (default 120, ~2.5 s; the small "
                               "step's blocks are 6 times as many steps). Shorter blocks pair more closely "
                               "in time on a noisy machine; each still pays one export call when it is "
                               "caught up")
    overhead.add_argument("--design", choices=("blocks", "groups"), default="blocks",
                          help="blocks (default): every figure, steps in long blocks paired by round; "
                               "groups: the step overheads alone, plain steps alternating one by "
                               "one with instrumented ones (or, every other group, automatic ones), "
                               "judged by group of 200 steps (--rounds groups; no --block-steps)")
    device = bench_sub.add_parser("device", help="device timing: synchronisations and device durations")
    device.add_argument("--steps", type=int, default=50, help="training steps per variant (default 50)")
    from otel_train.bench.latency_cli import add_parser as add_latency
    add_latency(bench_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv[:1] == ["run"]:
        # Everything after the script belongs to the script, flags included.
        if len(argv) < 2 or argv[1] in ("-h", "--help"):
            parser.parse_args(argv)
            return 2
        from otel_train.run import main as run_main
        return run_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "bench" and args.bench == "overhead":
        from otel_train._bench import run_overhead
        if args.rounds < 3:
            parser.error("--rounds must be an integer >= 3")
        if args.block_steps is not None and args.block_steps < 5:
            parser.error("--block-steps must be an integer >= 5")
        if args.block_steps is not None and args.design == "groups":
            parser.error("--block-steps is for --design blocks; the grouped design's blocks are one step")
        modes = ("process", "idle", "thread") if args.mode == "all" else (args.mode,)
        steps = ("large", "small") if args.step == "both" else (args.step,)
        return run_overhead(quick=args.quick, modes=modes, rounds=args.rounds, steps=steps,
                            targets_only=args.targets_only, block_steps=args.block_steps,
                            design=args.design)
    if args.command == "bench" and args.bench == "device":
        if args.steps < 1:
            parser.error("--steps must be a positive integer")
        from otel_train._bench_device import run_device_bench
        for name, value in run_device_bench(args.steps).items():
            print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")
        return 0
    if args.command == "bench" and args.bench == "latency":
        from otel_train.bench.latency_cli import main as latency_main
        return latency_main(args, args.latency_parser)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
