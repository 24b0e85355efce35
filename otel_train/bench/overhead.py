"""`otel-train bench overhead`: what instrumentation costs, as ratios against a baseline
measured in the same process and run, interleaved (this machine is shared and noisy).

Regions: (a) two `perf_counter_ns` calls (the floor), (b) `otel_train.span`, (c) an OTel SDK
span (`start_as_current_span` + `BatchSpanProcessor` + OTLP exporter), and the disabled
`otel_train.span`, each timed back to back (warm caches) and once right after a training step
(`region_ns_cold_*`: what a region between framework ops costs). Steps: a ~20 ms
transformer-like step and a ~2.5 ms step with gradient accumulation 2 (9 regions), plain vs
instrumented with the explicit API, vs hand-written SDK spans, and vs automatic
instrumentation (`TorchTrainingInstrumentor`), exporting over OTLP gRPC to a live local
receiver in its own process (at nice +19, replying without parsing: it stands in for a
collector on another machine). Background costs are charged to the instrumented blocks: the
worker and the exporter run during them, and what they have left at the end of a block is
caught up while plain steps run, whose slowdown is the block's (`blocks.catch_up`). The small step
also runs instrumented blocks with the worker held off (`*_hot_path`): the training thread's
own share; where the C hot path is built (`hot_path_in_c: 1`), its pure-Python fallback is
timed beside it (`*_python`). Overheads are the median over
rounds of each round's own ratio (its blocks ran back to back, in alternating order), with a
distribution-free 95 % confidence interval for that median (`*_ci95_lo`, `*_ci95_hi`): a
target is shown met only when the interval's upper end is within it. `--targets-only` runs just
the blocks the step targets are judged on (more rounds in the same time). `step_noise_pct*` is
the baseline's spread between rounds (IQR / median), the machine's noise. Output: one
`name: value` line per figure. (The project's other designs and stage-by-stage figures, not
installed: `python -m benchmarks.grouped`, `python -m benchmarks.export_cpu`.)

Where each part is: the steps timed (`workload`), region costs (`regions`), the block design
(`blocks`), the paired statistics (`stats`), the live receiver and the output (`harness`);
this module runs them in order (`run_overhead`).
"""

from __future__ import annotations

import os

from otel_train.bench.blocks import bench_spare_core, bench_steps
from otel_train.bench.harness import Receiver, init_mode, print_figure, print_steps, sdk_tracer
from otel_train.bench.regions import bench_cold_regions, bench_regions
from otel_train.bench.workload import Workload


def run_overhead(quick: bool = False, modes: tuple[str, ...] = ("process", "thread"), rounds: int = 15,
                 steps: tuple[str, ...] = ("large", "small"), targets_only: bool = False,
                 block_steps: int | None = None) -> int:
    """Every figure (module docstring), or with `targets_only` only the step overheads the
    targets are judged on: plain against instrumented and automatic blocks, nothing else
    between them, so more rounds fit in a run."""
    import torch

    import otel_train
    from otel_train import _runtime
    from otel_train.record import recorder as _recorder

    # Blocks of about two and a half seconds (large step) and two (small), at the default drain
    # and export intervals: what the export pipeline holds at the end of an instrumented block
    # is caught up while plain steps run (`catch_up`), and what it costs them is the block's.
    block, region_n, region_rounds = (5, 1000, 3) if quick else (120, 2000, 25)
    block = block_steps or block
    rounds = 3 if quick else rounds
    receiver = Receiver()
    provider, tracer = sdk_tracer(receiver.endpoint)
    try:
        print_figure("torch_threads", torch.get_num_threads())
        print_figure("hot_path_in_c", int(_recorder.Region is not _recorder._PyRegion))  # else the Python fallback
        print_figure("load_avg_1m", os.getloadavg()[0])
        print_figure("block_steps", block)
        print_figure("block_steps_small", block * 6)
        for index, mode in enumerate(modes):
            suffix = "" if index == 0 else f"_{mode}"
            init_mode(receiver, mode)
            if index == 0 and not targets_only:
                cfg = _runtime.state().cfg  # type: ignore[union-attr]
                print_figure("flush_interval_ms", cfg.flush_interval_ms)
                print_figure("export_delay_ms", cfg.export_delay_ms)
                figures = bench_regions(tracer, provider.force_flush, region_n, region_rounds)
                figures.update(bench_cold_regions(tracer, 20 if quick else 300))
                for name, value in figures.items():
                    print_figure(name, value)
            # (Automatic instrumentation: first mode only; SDK and hot-path figures: first mode
            # only and not with `targets_only`; no suffix on any of them.)
            if "large" in steps:
                print_steps(suffix, bench_steps(Workload("large"), rounds, block, auto=index == 0))
            if "small" in steps:
                extras = index == 0 and not targets_only
                print_steps(f"_small{suffix}", bench_steps(Workload("small"), rounds, block * 6,
                                                            tracer if extras else None,
                                                            lambda: provider.force_flush(), hot_path=extras,
                                                            auto=index == 0))
            if index == 0:
                spare = bench_spare_core(rounds, block * 6) if "small" in steps and not targets_only else None
                if spare is not None:
                    print_figure("torch_threads_spare_core", torch.get_num_threads() - 1)
                    print_steps("_small_spare_core", spare)
            otel_train.shutdown()
        provider.shutdown()
        print_figure("receiver_spans", receiver.spans())
    finally:
        receiver.close()
        _runtime.shutdown()
    return 0
