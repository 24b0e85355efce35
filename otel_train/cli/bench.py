"""`otel-train bench overhead`, `device`, `startup` and `latency`: the benchmarks a user runs on
their own hardware (`otel_train.bench`). `latency`'s flags: `bench_latency`. The project's
research tools (auto-cost, callgrind, the grouped design, the exporter's CPU, soak, scale) are in
the repository's `benchmarks/`, which is not installed. Each imports its benchmark (and torch)
when it runs, not when the CLI starts."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from otel_train.cli import bench_latency


def add_parser(sub: Any) -> None:
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
                               "automatic), so more rounds fit in the same time: no region, SDK, "
                               "hot-path or spare-core figures")
    overhead.add_argument("--block-steps", type=int, default=None,
                          help="steps per timed block of the ~20 ms step (default 120, ~2.5 s; the small "
                               "step's blocks are 6 times as many steps). Shorter blocks pair more closely "
                               "in time on a noisy machine; each still pays one export call when it is "
                               "caught up")
    overhead.add_argument("--device-path", type=int, nargs="?", const=3, default=0, metavar="ROUNDS",
                          help="instead: the device-timing path's cost on a launch-bound loop (ROUNDS rounds "
                               "of fresh processes, default 3): on a GPU the real loop (plain, automatic, "
                               "device timing off, explicit, SDK spans); without one, a proxy device whose "
                               "event calls cost what CUDA's do, beside the host path (bench/device_path.py)")
    device = bench_sub.add_parser("device", help="device timing: synchronisations and device durations")
    device.add_argument("--steps", type=int, default=50, help="training steps per variant (default 50)")
    startup = bench_sub.add_parser(
        "startup", help="the first steps' time with and without otel_train's start",
        description="Time the first steps of fresh processes, plain and instrumented, in alternating "
                    "order: each step, their total, the training thread's own CPU time, init()'s time. "
                    "Wall-clock figures: run it on a quiet machine.")
    startup.add_argument("--steps", type=int, default=10, help="steps timed from the start (default 10)")
    startup.add_argument("--step-ms", type=float, default=25.0, help="CPU work per step, ms (default 25)")
    startup.add_argument("--rounds", type=int, default=5, help="fresh process pairs (default 5)")
    startup.add_argument("--loop", choices=("explicit", "auto", "auto-manual"), default="explicit",
                         help="explicit spans on fixed work (default), or an unmodified torch loop under "
                              "import otel_train.auto (auto-manual: weights updated by hand)")
    startup.add_argument("--quick", action="store_true",
                         help="one round of 3 steps of 2 ms (a smoke run, not a measurement)")
    startup.set_defaults(startup_parser=startup)  # bad flags are reported with this parser's usage
    bench_latency.add_parser(bench_sub)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.bench == "overhead" and args.device_path:
        from otel_train.bench.device_path import run_device_path
        import torch
        steps = (100 if args.quick else 1000) if torch.cuda.is_available() else (150 if args.quick else 1500)
        return run_device_path(rounds=args.device_path, steps=steps)
    if args.bench == "overhead":
        from otel_train.bench.overhead import run_overhead
        if args.rounds < 3:
            parser.error("--rounds must be an integer >= 3")
        if args.block_steps is not None and args.block_steps < 5:
            parser.error("--block-steps must be an integer >= 5")
        modes = ("process", "idle", "thread") if args.mode == "all" else (args.mode,)
        steps = ("large", "small") if args.step == "both" else (args.step,)
        return run_overhead(quick=args.quick, modes=modes, rounds=args.rounds, steps=steps,
                            targets_only=args.targets_only, block_steps=args.block_steps)
    if args.bench == "device":
        if args.steps < 1:
            parser.error("--steps must be a positive integer")
        from otel_train.bench.device import run_device_bench
        for name, value in run_device_bench(args.steps).items():
            print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")
        return 0
    if args.bench == "startup":
        return _startup(args, args.startup_parser)
    if args.bench == "latency":
        return bench_latency.run(args, args.latency_parser)
    parser.error(f"unknown benchmark {args.bench!r}")
    return 2


def _startup(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.quick:
        args.steps, args.step_ms, args.rounds = 3, 2.0, 1
    if args.steps < 1:
        parser.error(f"--steps must be a positive integer (got {args.steps})")
    if args.rounds < 1:
        parser.error(f"--rounds must be a positive integer (got {args.rounds})")
    if not args.step_ms > 0:  # NaN too
        parser.error(f"--step-ms must be a positive number of milliseconds (got {args.step_ms})")
    from otel_train.bench.harness import print_figure
    from otel_train.bench.startup import ChildFailed, run_startup
    try:
        figures = run_startup(args.steps, args.step_ms, args.rounds, args.loop)
    except ChildFailed as err:
        print(f"otel-train bench startup: {err}", file=sys.stderr)
        return 1
    for name, value in figures.items():
        print_figure(name, value)
    return 0
