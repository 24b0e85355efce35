"""What one region costs its caller: back to back (warm caches) and right after a training step (cold)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

from otel_train.bench.workload import Workload


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


def _regions(factory: Callable[..., Any], mode: Callable[[], Any]) -> Callable[[int], None]:
    def body(n: int) -> None:
        with mode():
            for _ in range(n):
                with factory("bench.region"):
                    pass
    return body


def _region_factories(sdk_tracer: Any) -> dict[str, tuple[Callable[..., Any], Callable[[], Any]]]:
    """What each region figure times, by the name's ending (`region_ns_<name>`): the factory,
    and the mode it runs in (a context manager factory)."""
    import otel_train
    from otel_train.record import recorder as _recorder
    from otel_train.bench.switches import spans_disabled

    plain = contextlib.nullcontext
    factories = {"otel_train": (otel_train.span, plain), "otel_sdk": (sdk_tracer.start_as_current_span, plain),
                 "disabled": (otel_train.span, spans_disabled)}
    if otel_train.span is not _recorder._PyRegion:  # the C hot path is in force: time its fallback too
        factories["otel_train_python"] = (_recorder._PyRegion, plain)
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

    variants = {"region_ns_floor": _floor, **{f"region_ns_{name}": _regions(factory, mode)
                                              for name, (factory, mode) in _region_factories(sdk_tracer).items()}}
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
    work = Workload("small")
    pc = time.perf_counter_ns

    def regions(factory: Callable[..., Any]) -> Callable[[], int]:
        def one() -> int:
            t0 = pc()
            with factory("bench.region"):
                pass
            return pc() - t0
        return one

    modes: dict[str, Callable[[], Any]] = {}

    def floor() -> int:
        t0 = pc()
        pc()
        pc()
        return pc() - t0

    def empty() -> int:
        t0 = pc()
        return pc() - t0

    variants = {"empty": empty, "region_ns_cold_floor": floor}
    for name, (factory, mode) in _region_factories(sdk_tracer).items():
        variants[f"region_ns_cold_{name}"] = regions(factory)
        modes[f"region_ns_cold_{name}"] = mode
    order = list(variants.items())
    found: dict[str, list[int]] = {name: [] for name in variants}
    for _ in range(3):
        work.plain()
    for i in range(samples):
        for name, one in order[i % len(order):] + order[:i % len(order)]:  # each in every place
            with modes.get(name, contextlib.nullcontext)():  # set before the step: the region stays cold
                work.plain()
                found[name].append(one())
    base = statistics.median(found.pop("empty"))
    out = {name: max(0.0, statistics.median(values) - base) for name, values in found.items()}
    out["sdk_over_otel_train_cold"] = _sdk_over_otel_train(out, "region_ns_cold_")
    return out
