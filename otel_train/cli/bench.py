"""`otel-train bench overhead`, `auto-cost`, `startup`, `soak`, `scale`, `device` and `latency`: the
benchmarks (`otel_train.bench`), run by users on their own hardware. `latency`'s flags: `bench_latency`."""

from __future__ import annotations

import argparse
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
    overhead.add_argument("--device-path", type=int, nargs="?", const=3, default=0, metavar="ROUNDS",
                          help="instead: the device-timing path's cost on a launch-bound loop (ROUNDS rounds "
                               "of fresh processes, default 3): on a GPU the real loop (plain, automatic, "
                               "device timing off, explicit, SDK spans); without one, a proxy device whose "
                               "event calls cost what CUDA's do, beside the host path (bench/device_path.py)")
    startup = bench_sub.add_parser("startup", help="the first steps' time with and without otel_train's start")
    startup.add_argument("--steps", type=int, default=10, help="steps timed from the start (default 10)")
    startup.add_argument("--step-ms", type=float, default=25.0, help="CPU work per step, ms (default 25)")
    startup.add_argument("--rounds", type=int, default=5, help="fresh process pairs, alternating (default 5)")
    soak = bench_sub.add_parser("soak", help="a long run to a live receiver: RSS, threads, fds; every step delivered")
    soak.add_argument("--minutes", type=float, default=20.0, help="how long the run lasts (default 20)")
    soak.add_argument("--step-ms", type=float, default=2.0, help="sleep per step, ms (default 2)")
    soak.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples (default 5)")
    scale = bench_sub.add_parser("scale", help="one step's spans at 1k and 10k simulated ranks, with rank sampling")
    scale.add_argument("--ranks", default="1024,10240",
                       help="comma-separated simulated world sizes (default 1024,10240)")
    scale.add_argument("--settings", default="all,first-per-node,sample:16,sample:64,sample:64/all",
                       help="comma-separated settings to compare, each OTEL_TRAIN_RANKS or "
                            "OTEL_TRAIN_RANKS/OTEL_TRAIN_STEP_SPANS (default all,first-per-node,sample:16,"
                            "sample:64,sample:64/all; first-per-node assumes 8 ranks a node)")
    scale.add_argument("--micro-batches", type=int, default=2, help="micro-batches a step (default 2)")
    scale.add_argument("--collectives", type=int, default=8, help="collectives a step (default 8)")
    scale.add_argument("--endpoint", default=None,
                       help="an OTLP/gRPC receiver to send to (default: a local one this command starts)")
    scale.add_argument("--json", action="store_true", help="one JSON object per line")
    auto = bench_sub.add_parser("auto-cost", help="automatic instrumentation's own cost a step on a small "
                                "CPU loop: µs (plain vs automatic, interleaved), Python calls, instructions")
    auto.add_argument("--rounds", type=int, default=40, help="rounds of a plain and an automatic block (default 40)")
    auto.add_argument("--block-steps", type=int, default=32,
                      help="steps per timed block (default 32: an epoch, about one batch of detection's notes)")
    auto.add_argument("--callgrind", type=int, default=0, metavar="N",
                      help="under valgrind --tool=callgrind: count instructions (and, with its --cache-sim "
                           "and --branch-sim, misses) over N plain and N automatic steps instead of timing")
    auto.add_argument("--floor", action="store_true",
                      help="no-op hooks at the places automatic mode hooks in (no otel_train) against plain "
                           "steps: what hooking in costs before anything is done there")
    auto.add_argument("--per-call", action="store_true",
                      help="also time automatic mode with batched detection's notes in Python, and with each "
                           "of detection's calls run at once (no batching), in the same rounds")
    auto.add_argument("--parts", action="store_true",
                      help="where automatic mode's cost lies: its hooks alone (stub entry points), its calls "
                           "noted but not replayed, and all of it, against plain steps in the same rounds")
    auto.add_argument("--batch-calls", type=int, default=0, metavar="N",
                      help="also time automatic mode with batches of N detection notes (the shipped size: "
                           "detect.batch.BATCH_CALLS) in the same rounds")
    auto.add_argument("--root-hooks", action="store_true",
                      help="also time automatic mode with the root modules' forwards timed by hooks (as once "
                           "torch.compile may trace) rather than from their slots, in the same rounds")
    device = bench_sub.add_parser("device", help="device timing: synchronisations and device durations")
    device.add_argument("--steps", type=int, default=50, help="training steps per variant (default 50)")
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
        if args.block_steps is not None and args.design == "groups":
            parser.error("--block-steps is for --design blocks; the grouped design's blocks are one step")
        modes = ("process", "idle", "thread") if args.mode == "all" else (args.mode,)
        steps = ("large", "small") if args.step == "both" else (args.step,)
        return run_overhead(quick=args.quick, modes=modes, rounds=args.rounds, steps=steps,
                            targets_only=args.targets_only, block_steps=args.block_steps,
                            design=args.design)
    if args.bench == "startup":
        if args.steps < 1 or args.rounds < 1 or args.step_ms <= 0:
            parser.error("--steps and --rounds must be positive integers, --step-ms a positive number")
        from otel_train.bench.startup import run_startup
        for name, value in run_startup(args.steps, args.step_ms, args.rounds).items():
            print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")
        return 0
    if args.bench == "soak":
        if args.minutes <= 0 or args.step_ms < 0 or args.sample_s <= 0:
            parser.error("--minutes and --sample-s must be positive numbers, --step-ms >= 0")
        from otel_train.bench.soak import run_soak
        result = run_soak(args.minutes, args.step_ms, args.sample_s)
        for name, value in result.items():
            print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")
        return 0 if result["spans_delivered"] == result["spans_made"] else 1
    if args.bench == "scale":
        from otel_train.bench.scale import Shape, run_scale
        from otel_train.wire.sampling import STEP_SPANS, parse_ranks
        try:
            ranks = [int(x) for x in args.ranks.split(",")]
            settings = []
            for item in args.settings.split(","):
                choice, slash, spans = item.partition("/")
                if slash and spans not in STEP_SPANS:
                    raise ValueError(f"OTEL_TRAIN_STEP_SPANS is one of {', '.join(STEP_SPANS)}")
                settings.append(parse_ranks(choice) + slash + spans)
        except ValueError as err:
            parser.error(f"--ranks takes positive integers, --settings OTEL_TRAIN_RANKS[/OTEL_TRAIN_STEP_SPANS] "
                         f"values ({err})")
        if min(ranks) < 1 or args.micro_batches < 0 or args.collectives < 0:
            parser.error("--ranks must be positive, --micro-batches and --collectives at least 0")
        run_scale(ranks, settings, Shape(args.micro_batches, args.collectives), args.endpoint, args.json)
        return 0
    if args.bench == "auto-cost":
        if args.rounds < 3 or args.block_steps < 1 or args.callgrind < 0:
            parser.error("--rounds must be >= 3, --block-steps >= 1 and --callgrind >= 0")
        if args.batch_calls:
            from otel_train.detect.batch import SMALL_BATCH  # imports torch, which the bench runs anyway

            if args.batch_calls < SMALL_BATCH:
                parser.error(f"--batch-calls must be at least {SMALL_BATCH}: smaller batches turn batching off "
                             "for the rest of the run (detect.batch.SMALL_BATCH)")
        given = [flag for flag, on in (("--per-call", args.per_call), ("--parts", args.parts),
                                       ("--batch-calls", args.batch_calls), ("--root-hooks", args.root_hooks),
                                       ("--callgrind", args.callgrind), ("--floor", args.floor)) if on]
        if len(given) > 1 and (args.per_call or args.parts or args.batch_calls or args.root_hooks):
            parser.error(f"{' with '.join(given)}: --per-call, --parts, --batch-calls and --root-hooks each time "
                         "their own variants, alone (not with --callgrind, --floor or each other)")
        from otel_train.bench.auto_cost import run_auto_cost
        return run_auto_cost(rounds=args.rounds, block_steps=args.block_steps, callgrind_steps=args.callgrind,
                             floor=args.floor, per_call=args.per_call, parts=args.parts,
                             batch_calls=args.batch_calls, root_hooks=args.root_hooks)
    if args.bench == "device":
        if args.steps < 1:
            parser.error("--steps must be a positive integer")
        from otel_train.bench.device import run_device_bench
        for name, value in run_device_bench(args.steps).items():
            print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")
        return 0
    if args.bench == "latency":
        return bench_latency.run(args, args.latency_parser)
    parser.error(f"unknown benchmark {args.bench!r}")
    return 2
