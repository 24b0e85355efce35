"""The grouped design: plain steps alternate one by one with instrumented (or automatic) ones,
judged by group (`python -m benchmarks.grouped`)."""

from __future__ import annotations

import os
import statistics
from typing import Any

from otel_train.bench.blocks import catch_up, timed_block
from otel_train.bench.harness import Receiver, init_mode, print_figure, print_steps
from otel_train.bench.stats import ci95_of, noise_pct, pair_noise_pct
from otel_train.bench.workload import Workload

#: `_Roots.REDISCOVER_EVERY` steps, which the timed steps do pay when their count gets there).
AUTO_WARM_UP = 3
#: Plain steps on each side of a group's catch-up that give the plain rate it is charged against.
REFERENCE_STEPS = 10


def bench_steps_grouped(work: Workload, groups: int, block_steps: int, group_steps: int,
                        auto: bool = False) -> dict[str, Any]:
    """Plain against instrumented (and automatic) steps in short blocks, judged by group.

    This host's speed wanders by tens of percent within tenths of a second, at every time
    scale: one plain step against the next differs by ~10 % (IQR of their ratio), two blocks
    of 320 steps by ~15 %. Pairs of long blocks are therefore hardly closer than pairs of
    single steps, and there are far fewer of them: over a minute of plain small steps, the
    median of the pairs' ratios is known to ±0.12 % from single steps and to ±3.3 % from
    320-step blocks. So a group is `group_steps // block_steps` rounds of a plain and an
    instrumented block (`block_steps` 1: the two alternate step by step), or with `auto`,
    every other group, of a plain and an automatic block. An automatic group installs
    automatic instrumentation once and begins with `AUTO_WARM_UP` untimed steps (their share
    of the group's records is taken off its catch-up's cost); its plain blocks run with every
    hook and patch removed (`otel_train.bench.switches.paused_detection()`, untimed), so the automatic steps run as in a
    run: on the roots discovery found, each closing the step before it. Rounds run in alternating order, with the
    worker held off: the records wait in the buffer. At the group's end they are drained,
    assembled, encoded and exported (`Worker.flush`, one export call) on a helper thread while
    plain steps run, and what that cost those steps beyond the plain rate just before and just
    after it is the group's. So a variant's background work competes with training as in a
    run, at a run's rate of export calls: a group holds about as many steps as a run of the
    small step makes between two calls (a full request of 2,048 spans) and as the ~20 ms step
    makes in the 5 s between them; one drain a group is more often than a run's one every 2 s.
    The overhead is the median over groups of each group's ratio, with `paired_ci95_pct`'s
    interval; `in_step_pct` is that median without the catch-up (the training thread's own
    share), `noise_pct` the spread of a group's plain rate, `pair_noise_pct` that of one
    plain block against the next."""
    from otel_train import _runtime
    from otel_train.instrumentation import TorchTrainingInstrumentor
    from otel_train.bench.switches import held, paused_detection

    worker = _runtime.state().worker  # type: ignore[union-attr]
    exporter_cpu = getattr(worker.sink, "cpu_ns", lambda: 0)
    for _ in range(3):
        work.plain()
        work.instrumented()
    worker.flush()
    instrumentor = TorchTrainingInstrumentor()
    ratios: dict[str, list[float]] = {"instrumented": [], "auto": []}
    per_step: dict[str, list[float]] = {"instrumented": [], "auto": []}
    in_step: dict[str, list[float]] = {"instrumented": [], "auto": []}  # ratios without the catch-up
    group_plain: list[float] = []
    pair_plain: list[float] = []
    catch_ups: list[int] = []
    worker_cpu = child_cpu = variant_steps = 0
    for g in range(groups):
        variant = "auto" if auto and g % 2 else "instrumented"
        rounds = max(1, group_steps // block_steps)
        plain_ns = variant_ns = 0
        timed_records = other_records = 0
        recent_plain: list[float] = []  # ms per step of the group's plain blocks, latest last
        w0, c0 = worker.cpu_ns(), exporter_cpu()
        with held(worker):
            if variant == "auto":
                instrumentor.instrument()
                r0 = worker.pending()
                for _ in range(AUTO_WARM_UP):
                    work.plain()
                other_records += worker.pending() - r0
            for r in range(rounds):
                for kind in ("plain", variant) if r % 2 == 0 else (variant, "plain"):
                    if kind == "plain":
                        with paused_detection():  # nothing to pause in an explicit group
                            block = timed_block(work.plain, block_steps)
                        plain_ns += block.elapsed_ns
                        recent_plain.append(block.plain_ms_per_step())
                        pair_plain.append(recent_plain[-1])
                        continue
                    before = worker.pending()
                    block = timed_block(work.instrumented if kind == "instrumented" else work.plain, block_steps)
                    timed_records += worker.pending() - before
                    variant_ns += block.elapsed_ns
            if variant == "auto":
                # The last step's record: the first timed step recorded the last warm-up step's.
                r0 = worker.pending()
                instrumentor.uninstrument()
                other_records += worker.pending() - r0
        catch_ns, catch_steps, helper_cpu = catch_up(worker.flush, work.plain)
        catch_ups.append(catch_steps)
        # The plain rate around the catch-up: the last REFERENCE_STEPS plain steps before it
        # and as many after it.
        reference = -(-REFERENCE_STEPS // block_steps)
        before_ms = statistics.fmean(recent_plain[-reference:])
        after_ms = timed_block(work.plain, reference * block_steps).plain_ms_per_step()
        in_step[variant].append(100 * (variant_ns / plain_ns - 1))
        variant_ns += group_charge_ns(catch_ns, catch_steps, (before_ms + after_ms) / 2,
                                       timed_records, other_records)
        worker_cpu += worker.cpu_ns() - w0 + helper_cpu
        child_cpu += exporter_cpu() - c0
        steps = rounds * block_steps
        variant_steps += steps
        group_plain.append(plain_ns / steps / 1e6)
        per_step[variant].append(variant_ns / steps / 1e6)
        ratios[variant].append(100 * (variant_ns / plain_ns - 1))
    out: dict[str, Any] = {"plain": statistics.median(group_plain), "noise_pct": noise_pct(group_plain),
                           "pair_noise_pct": pair_noise_pct(pair_plain),
                           "worker_cpu_us_per_step": worker_cpu / variant_steps / 1e3,
                           "exporter_cpu_us_per_step": child_cpu / variant_steps / 1e3,
                           "catch_up_steps": statistics.median(catch_ups), "groups": len(ratios["instrumented"])}
    out["instrumented"] = statistics.median(per_step["instrumented"])
    out["overhead_pct"] = statistics.median(ratios["instrumented"])
    out["overhead_ci95_pct"] = ci95_of(ratios["instrumented"])
    out["in_step_pct"] = statistics.median(in_step["instrumented"])
    if ratios["auto"]:
        out["auto_in_step_pct"] = statistics.median(in_step["auto"])
        out["auto"] = statistics.median(per_step["auto"])
        out["auto_overhead_pct"] = statistics.median(ratios["auto"])
        out["auto_ci95_pct"] = ci95_of(ratios["auto"])
        out["auto_groups"] = len(ratios["auto"])
    return out


def group_charge_ns(catch_ns: int, catch_steps: int, plain_ms: float, timed_records: int,
                     other_records: int) -> float:
    """What a group's catch-up cost its plain steps beyond `plain_ms` each (the plain rate just
    before and after it), the share of it that the timed blocks' records make of all the
    group's records (an automatic block's untimed first steps record too)."""
    extra = catch_ns - catch_steps * plain_ms * 1e6
    return extra * timed_records / max(1, timed_records + other_records)


#: ones), and the timed steps of a variant per group, about what a run makes between two export
#: calls at either step rate.
GROUP_BLOCK, GROUP_STEPS = 1, 200


def run_grouped(modes: tuple[str, ...], groups: int, steps: tuple[str, ...]) -> int:
    """The step overheads by `bench_steps_grouped`, the exporter exporting only when asked: at
    each group's end, in one request (8,192 spans hold a group's)."""
    import otel_train
    from otel_train import _runtime

    receiver = Receiver()
    try:
        print_figure("design", "groups")
        print_figure("load_avg_1m", os.getloadavg()[0])
        print_figure("group_steps", GROUP_STEPS)
        print_figure("block_steps", GROUP_BLOCK)
        print_figure("auto_warm_up_steps", AUTO_WARM_UP)
        print_figure("groups", groups)
        for index, mode in enumerate(modes):
            suffix = "" if index == 0 else f"_{mode}"
            init_mode(receiver, mode, export_delay_ms=3_600_000, export_batch_size=8192)
            for size, label in (("large", ""), ("small", "_small")):
                if size in steps:
                    res = bench_steps_grouped(Workload(size), groups, GROUP_BLOCK, GROUP_STEPS, auto=index == 0)
                    print_steps(f"{label}{suffix}", res)
                    print_figure(f"step_pair_noise_pct{label}{suffix}", res["pair_noise_pct"])
                    print_figure(f"step_overhead_pct{label}{suffix}_in_step", res["in_step_pct"])
                    if "auto_in_step_pct" in res:
                        print_figure(f"step_overhead_pct_auto{label}{suffix}_in_step", res["auto_in_step_pct"])
            otel_train.shutdown()
        print_figure("receiver_spans", receiver.spans())
    finally:
        receiver.close()
        _runtime.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.grouped [--quick] [--rounds N] [--mode M] [--step S]`."""
    import argparse

    grouped = argparse.ArgumentParser(prog="python -m benchmarks.grouped",
                                      description="the step overheads alone, plain steps alternating one by one "
                                                  "with instrumented ones (or, every other group, automatic "
                                                  "ones), judged by group of 200 steps")
    grouped.add_argument("--quick", action="store_true", help="two groups (a smoke run, not a measurement)")
    grouped.add_argument("--rounds", type=int, default=15, help="groups per step benchmark (default 15)")
    grouped.add_argument("--mode", choices=("process", "idle", "thread", "all"), default="all",
                         help="export mode(s), as `otel-train bench overhead --mode`")
    grouped.add_argument("--step", choices=("large", "small", "both"), default="both",
                         help="which step benchmarks to run, as `otel-train bench overhead --step`")
    args = grouped.parse_args(argv)
    if args.rounds < 3:
        grouped.error("--rounds must be an integer >= 3")
    modes = ("process", "idle", "thread") if args.mode == "all" else (args.mode,)
    steps = ("large", "small") if args.step == "both" else (args.step,)
    return run_grouped(modes, 2 if args.quick else args.rounds, steps)


if __name__ == "__main__":
    raise SystemExit(main())
