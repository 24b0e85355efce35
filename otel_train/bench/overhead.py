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
caught up while plain steps run, whose slowdown is the block's (`_catch_up`). The small step
also runs instrumented blocks with the worker held off (`*_hot_path`): the training thread's
own share; where the C hot path is built (`hot_path_in_c: 1`), its pure-Python fallback is
timed beside it (`*_python`). Also the export pipeline's CPU per span stage by stage, measured alone
(`export_*_us_per_span*`), fast path against general path. Overheads are the median over
rounds of each round's own ratio (its blocks ran back to back, in alternating order), with a
distribution-free 95 % confidence interval for that median (`*_ci95_lo`, `*_ci95_hi`): a
target is shown met only when the interval's upper end is within it. `--targets-only` runs just
the blocks the step targets are judged on (more rounds in the same time). `step_noise_pct*` is
the baseline's spread between rounds (IQR / median), the machine's noise. `--design groups`
measures the step targets alone another way, precise enough for this host
(`bench_steps_grouped`): plain and instrumented steps alternate one by one, the records wait
in the buffer, and each group of ~200 steps is caught up and exported as one. Output: one
`name: value` line per figure.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from otel_train import semconv

_PHASE_ATTR = semconv.TRAIN_MICRO_BATCH
_CLIP_SPAN = "bench.clip_grad_norm"  # a user span: the ninth region of the small step


# --- the live receiver ------------------------------------------------------------------
class _Receiver:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "otel_train.bench.receiver"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())  # type: ignore[union-attr]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def spans(self) -> int:
        self.proc.stdin.write("count\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return int(self.proc.stdout.readline())  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=10)


# --- regions ------------------------------------------------------------------------------
def _per_iteration_ns(body: Callable[[int], None], empty: Callable[[int], None], n: int) -> float:
    pc = time.perf_counter_ns
    t0 = pc()
    body(n)
    t1 = pc()
    empty(n)
    t2 = pc()
    return max(0.0, ((t1 - t0) - (t2 - t1)) / n)


def _empty(n: int) -> None:
    for _ in range(n):
        pass


def _floor(n: int) -> None:
    pc = time.perf_counter_ns
    for _ in range(n):
        pc()
        pc()


def _regions(factory: Callable[..., Any]) -> Callable[[int], None]:
    def body(n: int) -> None:
        for _ in range(n):
            with factory("bench.region"):
                pass
    return body


def _region_factories(sdk_tracer: Any) -> dict[str, Callable[..., Any]]:
    """What each region figure times, by the name's ending: `region_ns_<name>`."""
    import otel_train
    from otel_train.record import recorder as _recorder

    factories = {"otel_train": otel_train._span, "otel_sdk": sdk_tracer.start_as_current_span,
                 "disabled": _recorder.noop_span}
    if otel_train._span is not _recorder._PyRegion:  # the C hot path is in force: time its fallback too
        factories["otel_train_python"] = _recorder._PyRegion
    return factories


def _sdk_over_otel_train(out: dict[str, float], prefix: str) -> float:
    return out[f"{prefix}otel_sdk"] / max(out[f"{prefix}otel_train"], 1e-9)


def bench_regions(sdk_tracer: Any, sdk_flush: Callable[[], Any], n: int, rounds: int) -> dict[str, float]:
    """The caller's cost per region. Background export is settled (untimed) after every variant,
    so each one is timed with its own worker idle, as in a loop that makes regions at a
    training rate; what export costs a training loop is the step benchmark's to say."""
    from otel_train import _runtime

    worker = _runtime.state().worker  # type: ignore[union-attr]
    settle = {"region_ns_otel_train": worker.flush, "region_ns_otel_sdk": sdk_flush}

    variants = {"region_ns_floor": _floor, **{f"region_ns_{name}": _regions(factory)
                                              for name, factory in _region_factories(sdk_tracer).items()}}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, body in variants.items():
            samples[name].append(_per_iteration_ns(body, _empty, n))
            if name in settle:
                settle[name]()
    out = {name: statistics.median(values) for name, values in samples.items()}
    out["sdk_over_otel_train"] = _sdk_over_otel_train(out, "region_ns_")
    return out


def bench_cold_regions(sdk_tracer: Any, samples: int) -> dict[str, float]:
    """The caller's cost of one region entered right after a training step (the ~2.5 ms one).

    `bench_regions` times regions back to back, with the code and data they touch in the
    CPU's caches. In a training loop a region is entered between framework ops, which have
    evicted most of that: each sample here runs a plain step, then times one region (or, for
    the floor, two `perf_counter_ns` calls) between two clock reads. Less the same two reads
    with nothing between them after a step (their own cold cost), the median is the region's."""
    work = _Workload("small")
    pc = time.perf_counter_ns

    def regions(factory: Callable[..., Any]) -> Callable[[], int]:
        def one() -> int:
            t0 = pc()
            with factory("bench.region"):
                pass
            return pc() - t0
        return one

    def floor() -> int:
        t0 = pc()
        pc()
        pc()
        return pc() - t0

    def empty() -> int:
        t0 = pc()
        return pc() - t0

    variants = {"empty": empty, "region_ns_cold_floor": floor,
                **{f"region_ns_cold_{name}": regions(factory)
                   for name, factory in _region_factories(sdk_tracer).items()}}
    order = list(variants.items())
    found: dict[str, list[int]] = {name: [] for name in variants}
    for _ in range(3):
        work.plain()
    for i in range(samples):
        for name, one in order[i % len(order):] + order[:i % len(order)]:  # each in every place
            work.plain()
            found[name].append(one())
    base = statistics.median(found.pop("empty"))
    out = {name: max(0.0, statistics.median(values) - base) for name, values in found.items()}
    out["sdk_over_otel_train_cold"] = _sdk_over_otel_train(out, "region_ns_cold_")
    return out


# --- steps --------------------------------------------------------------------------------
class _Workload:
    """A model, optimizer and cycling batches; `plain()` / `instrumented()` run one step."""

    def __init__(self, size: str, seed: int = 0) -> None:
        import torch
        from torch import nn

        torch.manual_seed(seed)
        if size == "large":  # ~20 ms per step here
            vocab, d, layers, batch, seq, self.accum = 512, 128, 2, 8, 64, 1
        else:  # ~2.5 ms per step with accumulation 2
            vocab, d, layers, batch, seq, self.accum = 64, 32, 1, 4, 8, 2
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.model = nn.Sequential(nn.Embedding(vocab, d), nn.TransformerEncoder(layer, layers,
                                                                                 enable_nested_tensor=False),
                                   nn.Linear(d, vocab))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.loss = nn.CrossEntropyLoss()
        self.vocab = vocab
        batches = [(torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq)))
                   for _ in range(8)]
        self._batches = batches
        self.data = self._cycle()

    def _cycle(self) -> Iterator[Any]:
        while True:
            yield from self._batches

    def plain(self) -> None:
        for _ in range(self.accum):
            x, y = next(self.data)
            out = self.model(x)
            loss = self.loss(out.reshape(-1, self.vocab), y.reshape(-1)) / self.accum
            loss.backward()
        import torch
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def instrumented(self, span: Callable[..., Any] | None = None) -> None:
        import otel_train
        self._spanned(span or otel_train._span, otel_train.step)

    def sdk(self, tracer: Any) -> None:
        def span(name: str, **attrs: Any) -> Any:
            return tracer.start_as_current_span(name, attributes=attrs or None)
        self._spanned(span, lambda: span(semconv.SPAN_STEP))

    def _spanned(self, span: Callable[..., Any], step: Callable[[], Any]) -> None:
        """The plain step with 5 regions (accumulation 1) or 9 (accumulation 2) around its phases."""
        import torch
        with step():
            for mb in range(self.accum):
                with span(semconv.SPAN_DATA, **{_PHASE_ATTR: mb}):
                    x, y = next(self.data)
                with span(semconv.SPAN_FORWARD, **{_PHASE_ATTR: mb}):
                    out = self.model(x)
                    loss = self.loss(out.reshape(-1, self.vocab), y.reshape(-1)) / self.accum
                with span(semconv.SPAN_BACKWARD, **{_PHASE_ATTR: mb}):
                    loss.backward()
            with span(semconv.SPAN_OPTIMIZER):
                with span(_CLIP_SPAN):
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)


class _Block:
    """One timed block: `steps` steps in `elapsed_ns`, then `catch_steps` plain steps in
    `catch_ns` while the block's leftover background work finished (`_catch_up`), on a helper
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


def _timed_block(step: Callable[[], None], steps: int, flush: Callable[[], Any] | None = None,
                 then: Callable[[], None] | None = None, plain: Callable[[], None] | None = None) -> _Block:
    """`steps` timed steps; with `flush`, then (after `then()`, untimed) the leftover
    background work caught up while `plain` steps run (`_catch_up`)."""
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        step()
    block = _Block(steps, time.perf_counter_ns() - t0)
    if then is not None:
        then()
    if flush is not None:
        block.catch_ns, block.catch_steps, block.helper_cpu_ns = _catch_up(flush, plain or step)
    return block


def _catch_up(flush: Callable[[], Any], plain: Callable[[], None]) -> tuple[int, int, int]:
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


def _charged(blocks: list[_Block], plain: list[float]) -> list[float]:
    """ms per step of each block, charged against its round's plain block."""
    return [block.ms_per_step(p) for block, p in zip(blocks, plain)]


def bench_steps(work: _Workload, rounds: int, block_steps: int, sdk_tracer: Any | None = None,
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
    from otel_train.record import recorder as _recorder
    from otel_train.instrumentation import TorchTrainingInstrumentor

    worker = _runtime.state().worker  # type: ignore[union-attr]
    exporter_cpu = getattr(worker.sink, "cpu_ns", lambda: 0)
    for _ in range(3):  # warm up every path
        work.plain()
        work.instrumented()
    worker.flush()
    plain: list[float] = []
    inst: list[_Block] = []
    sdk: list[_Block] = []
    hot: list[float] = []
    hot_python: list[float] = []
    auto_blocks: list[_Block] = []
    instrumentor = TorchTrainingInstrumentor()
    worker_cpu = child_cpu = inst_steps = 0
    def run_plain() -> None:
        plain.append(_timed_block(work.plain, block_steps).plain_ms_per_step())

    def run_instrumented() -> None:
        nonlocal worker_cpu, child_cpu, inst_steps
        w0, c0 = worker.cpu_ns(), exporter_cpu()
        block = _timed_block(work.instrumented, block_steps, worker.flush, plain=work.plain)
        inst.append(block)
        worker_cpu += worker.cpu_ns() - w0 + block.helper_cpu_ns
        child_cpu += exporter_cpu() - c0
        inst_steps += block_steps

    def run_auto() -> None:
        instrumentor.instrument()
        for _ in range(2):  # one-time work (first detection decisions) is not a per-step cost
            work.plain()
        auto_blocks.append(_timed_block(work.plain, block_steps, worker.flush, then=instrumentor.uninstrument))

    def run_sdk() -> None:
        sdk.append(_timed_block(lambda: work.sdk(sdk_tracer), block_steps, sdk_flush, plain=work.plain))

    def hot_path_with(found: list[float], span: Callable[..., Any] | None) -> Callable[[], None]:
        def run() -> None:
            with worker.held():
                found.append(_timed_block(lambda: work.instrumented(span), block_steps).plain_ms_per_step())
            worker.flush()
        return run

    hot_blocks = []
    if hot_path:
        hot_blocks.append(hot_path_with(hot, None))
        if _recorder._Region is not _recorder._PyRegion:  # the C regions: the Python ones beside them
            hot_blocks.append(hot_path_with(hot_python, _recorder._PyRegion))
    _run_alternating(rounds, [run_plain, run_instrumented] + ([run_auto] if auto else [])
                     + ([run_sdk] if sdk_tracer is not None else []) + hot_blocks)
    charged = _charged(inst, plain)
    out: dict[str, Any] = {
        "plain": statistics.median(plain), "instrumented": statistics.median(charged),
        "overhead_pct": _paired_overhead_pct(plain, charged),
        "overhead_ci95_pct": _paired_ci95_pct(plain, charged),
        "noise_pct": _noise_pct(plain),
        "worker_cpu_us_per_step": worker_cpu / inst_steps / 1e3,
        "exporter_cpu_us_per_step": child_cpu / inst_steps / 1e3,
        "catch_up_steps": statistics.median(block.catch_steps for block in inst),
    }
    if auto_blocks:
        auto_charged = _charged(auto_blocks, plain)
        out["auto"] = statistics.median(auto_charged)
        out["auto_overhead_pct"] = _paired_overhead_pct(plain, auto_charged)
        out["auto_ci95_pct"] = _paired_ci95_pct(plain, auto_charged)
    if sdk:
        sdk_charged = _charged(sdk, plain)
        out["sdk"] = statistics.median(sdk_charged)
        out["sdk_overhead_pct"] = _paired_overhead_pct(plain, sdk_charged)
    if hot:
        out["hot_path_overhead_pct"] = _paired_overhead_pct(plain, hot)
        out["hot_path_ci95_pct"] = _paired_ci95_pct(plain, hot)
    if hot_python:
        out["hot_path_python_overhead_pct"] = _paired_overhead_pct(plain, hot_python)
        out["hot_path_python_ci95_pct"] = _paired_ci95_pct(plain, hot_python)
    return out


#: Untimed steps that begin each automatic group of the grouped design: the steps a fresh install
#: discovers its root modules in (under global module hooks), and the one whose first forward
#: settles the hooks onto those roots. A run pays this once (and again for as long every
#: `_Roots.REDISCOVER_EVERY` steps, which the timed steps do pay when their count gets there).
_AUTO_WARM_UP = 3
#: Plain steps on each side of a group's catch-up that give the plain rate it is charged against.
_REFERENCE_STEPS = 10


def bench_steps_grouped(work: _Workload, groups: int, block_steps: int, group_steps: int,
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
    automatic instrumentation once and begins with `_AUTO_WARM_UP` untimed steps (their share
    of the group's records is taken off its catch-up's cost); its plain blocks run with every
    hook and patch removed (`_detect.paused()`, untimed), so the automatic steps run as in a
    run: on the roots discovery found, each closing the step before it. Rounds run in alternating order, with the
    worker held off: the records wait in the buffer. At the group's end they are drained,
    assembled, encoded and exported (`Worker.flush`, one export call) on a helper thread while
    plain steps run, and what that cost those steps beyond the plain rate just before and just
    after it is the group's. So a variant's background work competes with training as in a
    run, at a run's rate of export calls: a group holds about as many steps as a run of the
    small step makes between two calls (a full request of 2,048 spans) and as the ~20 ms step
    makes in the 5 s between them; one drain a group is more often than a run's one every 2 s.
    The overhead is the median over groups of each group's ratio, with `_paired_ci95_pct`'s
    interval; `in_step_pct` is that median without the catch-up (the training thread's own
    share), `noise_pct` the spread of a group's plain rate, `pair_noise_pct` that of one
    plain block against the next."""
    from otel_train import _runtime
    from otel_train.detect import hooks as _detect
    from otel_train.instrumentation import TorchTrainingInstrumentor

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
        with worker.held():
            if variant == "auto":
                instrumentor.instrument()
                r0 = worker.pending()
                for _ in range(_AUTO_WARM_UP):
                    work.plain()
                other_records += worker.pending() - r0
            for r in range(rounds):
                for kind in ("plain", variant) if r % 2 == 0 else (variant, "plain"):
                    if kind == "plain":
                        with _detect.paused():  # nothing to pause in an explicit group
                            block = _timed_block(work.plain, block_steps)
                        plain_ns += block.elapsed_ns
                        recent_plain.append(block.plain_ms_per_step())
                        pair_plain.append(recent_plain[-1])
                        continue
                    before = worker.pending()
                    block = _timed_block(work.instrumented if kind == "instrumented" else work.plain, block_steps)
                    timed_records += worker.pending() - before
                    variant_ns += block.elapsed_ns
            if variant == "auto":
                # The last step's record: the first timed step recorded the last warm-up step's.
                r0 = worker.pending()
                instrumentor.uninstrument()
                other_records += worker.pending() - r0
        catch_ns, catch_steps, helper_cpu = _catch_up(worker.flush, work.plain)
        catch_ups.append(catch_steps)
        # The plain rate around the catch-up: the last _REFERENCE_STEPS plain steps before it
        # and as many after it.
        reference = -(-_REFERENCE_STEPS // block_steps)
        before_ms = statistics.fmean(recent_plain[-reference:])
        after_ms = _timed_block(work.plain, reference * block_steps).plain_ms_per_step()
        in_step[variant].append(100 * (variant_ns / plain_ns - 1))
        variant_ns += _group_charge_ns(catch_ns, catch_steps, (before_ms + after_ms) / 2,
                                       timed_records, other_records)
        worker_cpu += worker.cpu_ns() - w0 + helper_cpu
        child_cpu += exporter_cpu() - c0
        steps = rounds * block_steps
        variant_steps += steps
        group_plain.append(plain_ns / steps / 1e6)
        per_step[variant].append(variant_ns / steps / 1e6)
        ratios[variant].append(100 * (variant_ns / plain_ns - 1))
    out: dict[str, Any] = {"plain": statistics.median(group_plain), "noise_pct": _noise_pct(group_plain),
                           "pair_noise_pct": _pair_noise_pct(pair_plain),
                           "worker_cpu_us_per_step": worker_cpu / variant_steps / 1e3,
                           "exporter_cpu_us_per_step": child_cpu / variant_steps / 1e3,
                           "catch_up_steps": statistics.median(catch_ups), "groups": len(ratios["instrumented"])}
    out["instrumented"] = statistics.median(per_step["instrumented"])
    out["overhead_pct"] = statistics.median(ratios["instrumented"])
    out["overhead_ci95_pct"] = _ci95_of(ratios["instrumented"])
    out["in_step_pct"] = statistics.median(in_step["instrumented"])
    if ratios["auto"]:
        out["auto_in_step_pct"] = statistics.median(in_step["auto"])
        out["auto"] = statistics.median(per_step["auto"])
        out["auto_overhead_pct"] = statistics.median(ratios["auto"])
        out["auto_ci95_pct"] = _ci95_of(ratios["auto"])
        out["auto_groups"] = len(ratios["auto"])
    return out


def _group_charge_ns(catch_ns: int, catch_steps: int, plain_ms: float, timed_records: int,
                     other_records: int) -> float:
    """What a group's catch-up cost its plain steps beyond `plain_ms` each (the plain rate just
    before and after it), the share of it that the timed blocks' records make of all the
    group's records (an automatic block's untimed first steps record too)."""
    extra = catch_ns - catch_steps * plain_ms * 1e6
    return extra * timed_records / max(1, timed_records + other_records)


def _pair_noise_pct(plain: list[float]) -> float:
    """Spread of one round's plain block against the next one's (IQR of their ratio, %)."""
    ratios = [100 * (b / a - 1) for a, b in zip(plain[0::2], plain[1::2])]
    if len(ratios) < 2:
        return 0.0
    q = statistics.quantiles(ratios, n=4)
    return q[2] - q[0]


def _paired_overhead_pct(plain: list[float], other: list[float]) -> float:
    """Median over rounds of (other / plain - 1): each round's blocks ran back to back, so a
    slow patch of the machine hits both sides of a pair instead of one side of the medians."""
    return 100 * statistics.median(o / p - 1 for p, o in zip(plain, other))


def _run_alternating(rounds: int, blocks: list[Callable[[], None]]) -> None:
    """Run `rounds` rounds of `blocks`, in forward order on even rounds and reversed on odd
    ones: a machine that slows down or speeds up over a round then favours neither side of a pair."""
    for r in range(rounds):
        for block in blocks if r % 2 == 0 else blocks[::-1]:
            block()


def _paired_ci95_pct(plain: list[float], other: list[float]) -> tuple[float, float]:
    """A distribution-free 95 % confidence interval for the median of the rounds' ratios (in %):
    the order statistics that the binomial distribution puts around the median. It assumes
    only that rounds are independent; with fewer than 6 rounds it is the whole range."""
    return _ci95_of([100 * (o / p - 1) for p, o in zip(plain, other)])


def _ci95_of(values: list[float]) -> tuple[float, float]:
    """`_paired_ci95_pct`'s interval for the median of `values` themselves."""
    ratios = sorted(values)
    n = len(ratios)
    j = 0  # the most order statistics to leave out on each side: P(Binomial(n, 1/2) < j) <= 2.5 %
    while j < n // 2 and sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n <= 0.025:
        j += 1
    return (ratios[j - 1], ratios[n - j]) if j else (ratios[0], ratios[-1])


def _noise_pct(plain: list[float]) -> float:
    """Spread of the baseline between rounds (interquartile range / median): the machine's noise."""
    q = statistics.quantiles(plain, n=4)
    return 100 * (q[2] - q[0]) / statistics.median(plain)


# --- the export pipeline in isolation ---------------------------------------------------------
def _small_step_records(steps: int) -> list[Any]:
    """The hot-path tuples of `steps` small-benchmark steps (9 regions each), recorded by a
    private recorder with empty region bodies."""
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import SystemClock

    recorder = _recorder.Recorder(steps * 16, SystemClock())
    previous = _recorder.active()
    _recorder.install(recorder)
    try:
        for n in range(steps):
            with _recorder._Step(n, None):
                for mb in range(2):
                    for name in (semconv.SPAN_DATA, semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD):
                        with _recorder._Region(name, **{_PHASE_ATTR: mb}):
                            pass
                with _recorder._Region(semconv.SPAN_OPTIMIZER):
                    with _recorder._Region(_CLIP_SPAN):
                        pass
    finally:
        _recorder.install(previous)
    return list(recorder.buf)


def bench_export_cpu(steps: int, rounds: int) -> dict[str, float]:
    """CPU per span of each stage between the buffer and the wire, measured alone (best of
    `rounds`): the worker's pickling, in the training process, and in the exporter process the
    unpickling, span assembly with metrics, and OTLP encoding, on the fast path (its region
    loop in C where `_encode` was built, and then its Python fallback too: `*_fast_python`)
    and on the general path (what a record with an exception, an event or device time takes,
    and what every record took before the fast path). Inside a real run the exporter shares cores
    with training and pays about twice this (`exporter_cpu_us_per_step*`)."""
    import gc

    from otel_train.record.clock import SystemClock, wall_offset

    records = _small_step_records(steps)
    offset = wall_offset(SystemClock())
    # As in the exporter process (`gc.freeze()` after its setup): this process's heap (models,
    # the SDK) is not what a collection triggered here would have to scan there.
    gc.collect()
    gc.freeze()
    try:
        return _export_cpu(records, offset, rounds)
    finally:
        gc.unfreeze()


def _export_cpu(records: list[Any], offset: int, rounds: int) -> dict[str, float]:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource

    from otel_train._distributed import RunInfo
    from otel_train.export.metrics import TrainMetrics
    from otel_train.export.otlp import LeanEncoder
    from otel_train.export.spans import AttributeCleaner, SpanAssembler
    from otel_train.export.worker import _SLICE, _dumps, loads

    resource = {"service.name": "bench", "ml.run.id": "bench", "ml.rank": 0}
    cpu = time.process_time_ns
    best: dict[str, float] = {}

    def keep(name: str, ns: int, count: int) -> None:
        best[name] = min(best.get(name, float("inf")), ns / count / 1e3)

    for _ in range(rounds):
        t0 = cpu()
        payloads = [_dumps(("batch", [(False, records[i:i + _SLICE])], offset, {}))
                    for i in range(0, len(records), _SLICE)]
        keep("export_pickle_us_per_span", cpu() - t0, len(records))
        from otel_train.export.spans import _encode
        variants = [("fast", True, True)] + ([("fast_python", True, False)] if _encode is not None else []) \
            + [("general", False, False)]
        for label, fast, c_encode in variants:
            encoder = LeanEncoder(resource, semconv.SCOPE_NAME, "bench")
            metrics = TrainMetrics(Resource(resource), None, 60_000, [InMemoryMetricReader()])
            out: list[Any] = []
            assembler = SpanAssembler(RunInfo(run_id="bench"), 1, Resource(resource), AttributeCleaner(2048),
                                      out.extend, metrics=metrics, encoder=encoder)
            assembler.fast, assembler.c_encode = fast, c_encode
            t0 = cpu()
            messages = [loads(payload) for payload in payloads]
            t1 = cpu()
            for message in messages:
                assembler.feed_raw(message[1][0][1], offset)
            assembler.flush()
            t2 = cpu()
            encoder.batches(out, 2048, 1 << 20)
            t3 = cpu()
            keep("export_unpickle_us_per_span", t1 - t0, len(records))
            keep(f"export_assemble_us_per_span_{label}", t2 - t1, len(records))
            keep(f"export_encode_us_per_span_{label}", t3 - t2, len(records))
            keep(f"export_total_us_per_span_{label}", t3 - t0, len(records))
    return best


# --- the command --------------------------------------------------------------------------
def _print(name: str, value: float | int | str) -> None:
    if isinstance(value, float):
        value = f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    print(f"{name}: {value}", flush=True)


def _print_ci(name: str, ci: tuple[float, float]) -> None:
    _print(f"{name}_ci95_lo", ci[0])
    _print(f"{name}_ci95_hi", ci[1])


def _sdk_tracer(endpoint: str) -> tuple[Any, Any]:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "otel-train-bench-sdk"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    return provider, provider.get_tracer("bench")


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
        return bench_steps(_Workload("small"), rounds, block_steps)
    finally:
        torch.set_num_threads(threads)


def _init_mode(receiver: _Receiver, mode: str, **overrides: Any) -> None:
    """`otel_train.init` for one export mode of the benchmark (process, idle or thread),
    exporting to `receiver` over gRPC; `overrides` on top."""
    import otel_train

    otel_train.init(endpoint=receiver.endpoint, protocol="grpc",
                    export_mode="thread" if mode == "thread" else "process",
                    exporter_priority="idle" if mode == "idle" else "low",
                    run_id=f"bench-{os.getpid()}-{mode}", metric_interval_ms=60000, **overrides)


#: The grouped design: blocks of one step (plain steps alternate with instrumented or automatic
#: ones), and the timed steps of a variant per group, about what a run makes between two export
#: calls at either step rate.
_GROUP_BLOCK, _GROUP_STEPS = 1, 200


def _run_grouped(modes: tuple[str, ...], groups: int, steps: tuple[str, ...]) -> int:
    """The step overheads by `bench_steps_grouped`, the exporter exporting only when asked: at
    each group's end, in one request (8,192 spans hold a group's)."""
    import otel_train
    from otel_train import _runtime

    receiver = _Receiver()
    try:
        _print("design", "groups")
        _print("load_avg_1m", os.getloadavg()[0])
        _print("group_steps", _GROUP_STEPS)
        _print("block_steps", _GROUP_BLOCK)
        _print("auto_warm_up_steps", _AUTO_WARM_UP)
        _print("groups", groups)
        for index, mode in enumerate(modes):
            suffix = "" if index == 0 else f"_{mode}"
            _init_mode(receiver, mode, export_delay_ms=3_600_000, export_batch_size=8192)
            for size, label in (("large", ""), ("small", "_small")):
                if size in steps:
                    res = bench_steps_grouped(_Workload(size), groups, _GROUP_BLOCK, _GROUP_STEPS, auto=index == 0)
                    _print_steps(f"{label}{suffix}", res)
                    _print(f"step_pair_noise_pct{label}{suffix}", res["pair_noise_pct"])
                    _print(f"step_overhead_pct{label}{suffix}_in_step", res["in_step_pct"])
                    if "auto_in_step_pct" in res:
                        _print(f"step_overhead_pct_auto{label}{suffix}_in_step", res["auto_in_step_pct"])
            otel_train.shutdown()
        _print("receiver_spans", receiver.spans())
    finally:
        receiver.close()
        _runtime.shutdown()
    return 0


def _print_steps(label: str, res: dict[str, Any]) -> None:
    """`bench_steps`' figures, each name ending in `label`."""
    _print(f"step_ms_plain{label}", res["plain"])
    _print(f"step_ms_instrumented{label}", res["instrumented"])
    _print(f"step_overhead_pct{label}", res["overhead_pct"])
    _print_ci(f"step_overhead_pct{label}", res["overhead_ci95_pct"])
    _print(f"step_noise_pct{label}", res["noise_pct"])
    _print(f"worker_cpu_us_per_step{label}", res["worker_cpu_us_per_step"])
    _print(f"exporter_cpu_us_per_step{label}", res["exporter_cpu_us_per_step"])
    _print(f"catch_up_steps{label}", res["catch_up_steps"])
    if "auto" in res:
        _print(f"step_ms_auto{label}", res["auto"])
        _print(f"step_overhead_pct_auto{label}", res["auto_overhead_pct"])
        _print_ci(f"step_overhead_pct_auto{label}", res["auto_ci95_pct"])
    if "sdk" in res:
        _print(f"step_ms_sdk{label}", res["sdk"])
        _print(f"step_overhead_pct_sdk{label}", res["sdk_overhead_pct"])
    if "hot_path_overhead_pct" in res:
        _print(f"step_overhead_pct{label}_hot_path", res["hot_path_overhead_pct"])
        _print_ci(f"step_overhead_pct{label}_hot_path", res["hot_path_ci95_pct"])
    if "hot_path_python_overhead_pct" in res:
        _print(f"step_overhead_pct{label}_hot_path_python", res["hot_path_python_overhead_pct"])
        _print_ci(f"step_overhead_pct{label}_hot_path_python", res["hot_path_python_ci95_pct"])


def run_overhead(quick: bool = False, modes: tuple[str, ...] = ("process", "thread"), rounds: int = 15,
                 steps: tuple[str, ...] = ("large", "small"), targets_only: bool = False,
                 block_steps: int | None = None, design: str = "blocks") -> int:
    """Every figure (module docstring), or with `targets_only` only the step overheads the
    targets are judged on: plain against instrumented and automatic blocks, nothing else
    between them, so more rounds fit in a run. With `design` "groups", the step overheads
    alone, by `bench_steps_grouped` (`rounds` groups each)."""
    if design == "groups":
        return _run_grouped(modes, 2 if quick else rounds, steps)
    import torch

    import otel_train
    from otel_train import _runtime
    from otel_train.record import recorder as _recorder
    from otel_train.export import spans as _spans

    # Blocks of about two and a half seconds (large step) and two (small), at the default drain
    # and export intervals: what the export pipeline holds at the end of an instrumented block
    # is caught up while plain steps run (`_catch_up`), and what it costs them is the block's.
    block, region_n, region_rounds = (5, 1000, 3) if quick else (120, 2000, 25)
    block = block_steps or block
    rounds = 3 if quick else rounds
    receiver = _Receiver()
    provider, tracer = _sdk_tracer(receiver.endpoint)
    try:
        _print("torch_threads", torch.get_num_threads())
        _print("hot_path_in_c", int(_recorder._Region is not _recorder._PyRegion))  # else the Python fallback
        _print("export_fast_path_in_c", int(_spans._encode is not None))  # else its Python loop
        _print("load_avg_1m", os.getloadavg()[0])
        _print("block_steps", block)
        _print("block_steps_small", block * 6)
        for index, mode in enumerate(modes):
            suffix = "" if index == 0 else f"_{mode}"
            _init_mode(receiver, mode)
            if index == 0 and not targets_only:
                cfg = _runtime.state().cfg  # type: ignore[union-attr]
                _print("flush_interval_ms", cfg.flush_interval_ms)
                _print("export_delay_ms", cfg.export_delay_ms)
                figures = bench_regions(tracer, provider.force_flush, region_n, region_rounds)
                figures.update(bench_cold_regions(tracer, 20 if quick else 300))
                figures.update(bench_export_cpu(100 if quick else 2000, 2 if quick else 5))
                for name, value in figures.items():
                    _print(name, value)
            # (Automatic instrumentation: first mode only; SDK and hot-path figures: first mode
            # only and not with `targets_only`; no suffix on any of them.)
            if "large" in steps:
                _print_steps(suffix, bench_steps(_Workload("large"), rounds, block, auto=index == 0))
            if "small" in steps:
                extras = index == 0 and not targets_only
                _print_steps(f"_small{suffix}", bench_steps(_Workload("small"), rounds, block * 6,
                                                            tracer if extras else None,
                                                            lambda: provider.force_flush(), hot_path=extras,
                                                            auto=index == 0))
            if index == 0:
                spare = bench_spare_core(rounds, block * 6) if "small" in steps and not targets_only else None
                if spare is not None:
                    _print("torch_threads_spare_core", torch.get_num_threads() - 1)
                    _print_steps("_small_spare_core", spare)
            otel_train.shutdown()
        provider.shutdown()
        _print("receiver_spans", receiver.spans())
    finally:
        receiver.close()
        _runtime.shutdown()
    return 0
