"""The block design: plain and instrumented steps in long blocks, paired by round (every figure)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from otel_train.bench.stats import noise_pct, paired_ci95_pct, paired_overhead_pct, run_alternating
from otel_train.bench.workload import Workload


class Block:
    """One timed block: `steps` steps in `elapsed_ns`, then `catch_steps` plain steps in
    `catch_ns` while the block's leftover background work finished (`catch_up`), on a helper
    thread that used `helper_cpu_ns`."""

    __slots__ = ("steps", "elapsed_ns", "catch_steps", "catch_ns", "helper_cpu_ns")

    def __init__(self, steps: int, elapsed_ns: int) -> None:
        self.steps, self.elapsed_ns = steps, elapsed_ns
        self.catch_steps = self.catch_ns = self.helper_cpu_ns = 0

    def plain_ms_per_step(self) -> float:
        """ms per step of the timed steps alone (a plain block: nothing to catch up)."""
        return self.elapsed_ns / self.steps / 1e6

    def ms_per_step(self, plain_ms: float) -> float:
        """The block's steps charged with what its leftover work cost the plain steps after
        it: their time beyond `plain_ms` a step (the same round's plain block)."""
        extra = self.catch_ns - self.catch_steps * plain_ms * 1e6
        return (self.elapsed_ns + extra) / self.steps / 1e6


def timed_block(step: Callable[[], None], steps: int, flush: Callable[[], Any] | None = None,
                 then: Callable[[], None] | None = None, plain: Callable[[], None] | None = None) -> Block:
    """`steps` timed steps; with `flush`, then (after `then()`, untimed) the leftover
    background work caught up while `plain` steps run (`catch_up`)."""
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        step()
    block = Block(steps, time.perf_counter_ns() - t0)
    if then is not None:
        then()
    if flush is not None:
        block.catch_ns, block.catch_steps, block.helper_cpu_ns = catch_up(flush, plain or step)
    return block


def catch_up(flush: Callable[[], Any], plain: Callable[[], None]) -> tuple[int, int, int]:
    """Finish a block's leftover background work the way a training loop lives with it: `flush`
    (drain the buffer, have the exporter export it all and wait for that) runs on a helper
    thread, as the worker thread and the exporter would, while this thread goes on with plain
    steps. Returns the ns and number of those steps (what the work cost beyond them is the
    block's) and the helper's CPU ns (the drain it did is the worker thread's work).

    Charging the work at its CPU time, waiting for it idle, would count it once, where work
    that competes with training costs a step about twice its CPU time (the GIL, and intra-op
    threads that wait for the slowest one); only blocks much longer than the drain interval
    kept that tail small. The helper's own cost is the drain a flush brings forward and one
    export call a block, a little more than a real run pays, never less."""
    done = threading.Event()
    helper_cpu = [0]

    def run() -> None:
        t0 = time.thread_time_ns()
        try:
            flush()
        finally:
            helper_cpu[0] = time.thread_time_ns() - t0
            done.set()

    helper = threading.Thread(target=run, name="bench-catch-up", daemon=True)
    steps = 0
    t0 = time.perf_counter_ns()
    helper.start()
    while not done.is_set():
        plain()
        steps += 1
    elapsed = time.perf_counter_ns() - t0
    helper.join()
    return elapsed, steps, helper_cpu[0]


def charged(blocks: list[Block], plain: list[float]) -> list[float]:
    """ms per step of each block, charged against its round's plain block."""
    return [block.ms_per_step(p) for block, p in zip(blocks, plain)]


def bench_steps(work: Workload, rounds: int, block_steps: int, sdk_tracer: Any | None = None,
                sdk_flush: Callable[[], Any] | None = None, hot_path: bool = False,
                auto: bool = False) -> dict[str, Any]:
    """Plain against instrumented blocks (and hand-written SDK spans, with `sdk_tracer`). With
    `hot_path`, also instrumented blocks with the worker held off: their records wait in the
    buffer and are drained and exported after the block, untimed, so what such a block costs
    is the training thread's own work alone. With `auto`, also the plain step under automatic
    instrumentation (hooks installed only for those blocks; their catch-up steps run without
    them), in the same rounds: explicit and automatic are judged against the same plain blocks,
    at the same moments (measured in a later pass of its own, the automatic figure read a
    busier or quieter machine than the explicit one)."""
    from otel_train import _runtime
    from otel_train.instrumentation import TorchTrainingInstrumentor
    from otel_train.record import recorder as _recorder
    from otel_train.bench.switches import held

    worker = _runtime.state().worker  # type: ignore[union-attr]
    exporter_cpu = getattr(worker.sink, "cpu_ns", lambda: 0)
    for _ in range(3):  # warm up every path
        work.plain()
        work.instrumented()
    worker.flush()
    plain: list[float] = []
    inst: list[Block] = []
    sdk: list[Block] = []
    hot: list[float] = []
    hot_python: list[float] = []
    auto_blocks: list[Block] = []
    instrumentor = TorchTrainingInstrumentor()
    worker_cpu = child_cpu = inst_steps = 0
    def run_plain() -> None:
        plain.append(timed_block(work.plain, block_steps).plain_ms_per_step())

    def run_instrumented() -> None:
        nonlocal worker_cpu, child_cpu, inst_steps
        w0, c0 = worker.cpu_ns(), exporter_cpu()
        block = timed_block(work.instrumented, block_steps, worker.flush, plain=work.plain)
        inst.append(block)
        worker_cpu += worker.cpu_ns() - w0 + block.helper_cpu_ns
        child_cpu += exporter_cpu() - c0
        inst_steps += block_steps

    def run_auto() -> None:
        instrumentor.instrument()
        for _ in range(2):  # one-time work (first detection decisions) is not a per-step cost
            work.plain()
        auto_blocks.append(timed_block(work.plain, block_steps, worker.flush, then=instrumentor.uninstrument))

    def run_sdk() -> None:
        sdk.append(timed_block(lambda: work.sdk(sdk_tracer), block_steps, sdk_flush, plain=work.plain))

    def hot_path_with(found: list[float], span: Callable[..., Any] | None) -> Callable[[], None]:
        def run() -> None:
            with held(worker):
                found.append(timed_block(lambda: work.instrumented(span), block_steps).plain_ms_per_step())
            worker.flush()
        return run

    hot_blocks = []
    if hot_path:
        hot_blocks.append(hot_path_with(hot, None))
        if _recorder.Region is not _recorder._PyRegion:  # the C regions: the Python ones beside them
            hot_blocks.append(hot_path_with(hot_python, _recorder._PyRegion))
    run_alternating(rounds, [run_plain, run_instrumented] + ([run_auto] if auto else [])
                     + ([run_sdk] if sdk_tracer is not None else []) + hot_blocks)
    inst_charged = charged(inst, plain)
    out: dict[str, Any] = {
        "plain": statistics.median(plain), "instrumented": statistics.median(inst_charged),
        "overhead_pct": paired_overhead_pct(plain, inst_charged),
        "overhead_ci95_pct": paired_ci95_pct(plain, inst_charged),
        "noise_pct": noise_pct(plain),
        "worker_cpu_us_per_step": worker_cpu / inst_steps / 1e3,
        "exporter_cpu_us_per_step": child_cpu / inst_steps / 1e3,
        "catch_up_steps": statistics.median(block.catch_steps for block in inst),
    }
    if auto_blocks:
        auto_charged = charged(auto_blocks, plain)
        out["auto"] = statistics.median(auto_charged)
        out["auto_overhead_pct"] = paired_overhead_pct(plain, auto_charged)
        out["auto_ci95_pct"] = paired_ci95_pct(plain, auto_charged)
    if sdk:
        sdk_charged = charged(sdk, plain)
        out["sdk"] = statistics.median(sdk_charged)
        out["sdk_overhead_pct"] = paired_overhead_pct(plain, sdk_charged)
    if hot:
        out["hot_path_overhead_pct"] = paired_overhead_pct(plain, hot)
        out["hot_path_ci95_pct"] = paired_ci95_pct(plain, hot)
    if hot_python:
        out["hot_path_python_overhead_pct"] = paired_overhead_pct(plain, hot_python)
        out["hot_path_python_ci95_pct"] = paired_ci95_pct(plain, hot_python)
    return out


#: Untimed steps that begin each automatic group of the grouped design: the steps a fresh install
#: discovers its root modules in (under global module hooks), and the one whose first forward
#: settles the hooks onto those roots. A run pays this once (and again for as long every


def bench_spare_core(rounds: int, block_steps: int) -> dict[str, Any] | None:
    """The small step again with torch's intra-op threads one fewer than the cores it had
    (None with a single thread).

    With every core an intra-op thread, each parallel op waits for its slowest thread, so
    any other CPU work (the exporter, the worker, anything) costs the step about twice its own
    time; a node that leaves a core to such work (as GPU nodes do) sees about its CPU cost."""
    import torch

    threads = torch.get_num_threads()
    if threads < 2:
        return None
    torch.set_num_threads(threads - 1)
    try:
        return bench_steps(Workload("small"), rounds, block_steps)
    finally:
        torch.set_num_threads(threads)
