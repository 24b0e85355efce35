"""`otel-train bench auto-cost --replay K`: what running detection's bodies in batches would save.

A probe of a design, not a mode of the package (`docs/design.md`, "Next: settling the step
machine in batches"). Inside a `deferred` block, the places automatic mode's hooks call into
detection (`forward.forward_begin` / `forward_end`, `backward.backward_run`, `data.fetch`,
`optimizer.optimizer_begin` / `optimizer_end`, `optimizer.zero_grad_run`) only append the call
to a list, after running the user's own function where they wrap one; every K steps (at a
batch fetch) and at the block's end the list is run through the real bodies in order, with the
wrapped functions replaced by ones that return what the real call returned. The bodies do the
same work as in a run (the same records, give or take the `train.other` gaps: the replayed
times are the replay's, so gaps come out shorter), but their code and state are cold once a
batch instead of once a call. What the design would add (a C append instead of a Python call
per event, the times given to the bodies, the reads that settle first) is not in it.

Timed against plain and per-call automatic blocks in the same rounds (each round's three blocks
in an order drawn at random), with the worker held, as `auto_cost._measure` times its two.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from otel_train.bench.harness import print_ci, print_figure
from otel_train.bench.stats import ci95_of

#: The entry points deferred: (module name under `otel_train.detect`, attribute).
ENTRY_POINTS = (("forward", "forward_begin"), ("forward", "forward_end"), ("backward", "backward_run"),
                ("data", "fetch"), ("optimizer", "optimizer_begin"), ("optimizer", "optimizer_end"),
                ("optimizer", "zero_grad_run"))
#: Calls into detection a step of the auto-cost loop (two micro-batches: a fetch, a forward's
#: two hooks and a backward each; the optimizer's two hooks and zero_grad).
CALLS_PER_STEP = 11


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def _returning(value: Any) -> Callable[..., Any]:
    return lambda *args, **kwargs: value


@contextlib.contextmanager
def deferred(steps: int) -> Iterator[list[tuple[Any, ...]]]:
    """Detection's entry points deferred inside the block and run `steps` steps at a time (see
    the module's docstring); yields the list of calls waiting. Every entry point is put back
    after, the calls still waiting run first, even when the block raises."""
    from otel_train.detect import backward, data, forward, optimizer

    modules = {"forward": forward, "backward": backward, "data": data, "optimizer": optimizer}
    real = {name: getattr(modules[mod], name) for mod, name in ENTRY_POINTS}
    calls: list[tuple[Any, ...]] = []
    append = calls.append
    limit = CALLS_PER_STEP * steps

    def run() -> None:
        for call in calls:
            name = call[0]
            if name == "backward_run":
                real[name](_none, (), None)
            elif name == "fetch":
                real[name](_returning(call[2]), call[1])
            elif name == "zero_grad_run":
                real[name](call[1], call[2], _none, (), {})
            else:
                real[name](*call[1:])
        calls.clear()

    def forward_begin(module: Any) -> None:
        append(("forward_begin", module))

    def forward_end(module: Any) -> None:
        append(("forward_end", module))

    def backward_run(original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        out = original(*args, **(kwargs or {}))
        append(("backward_run",))
        return out

    def fetch(original: Callable[..., Any], iterator: Any) -> Any:
        if len(calls) >= limit:
            run()
        batch = original(iterator)
        append(("fetch", iterator, batch))
        return batch

    def optimizer_begin(opt: Any, args: Any, kwargs: Any) -> None:
        append(("optimizer_begin", opt, args, kwargs))

    def optimizer_end(opt: Any, args: Any, kwargs: Any) -> None:
        append(("optimizer_end", opt, args, kwargs))

    def zero_grad_run(r: Any, s: Any, original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        append(("zero_grad_run", r, s))
        return out

    stand_ins = {"forward_begin": forward_begin, "forward_end": forward_end, "backward_run": backward_run,
                 "fetch": fetch, "optimizer_begin": optimizer_begin, "optimizer_end": optimizer_end,
                 "zero_grad_run": zero_grad_run}
    for mod, name in ENTRY_POINTS:
        setattr(modules[mod], name, stand_ins[name])
    try:
        yield calls
    finally:
        for mod, name in ENTRY_POINTS:
            setattr(modules[mod], name, real[name])
        run()


def _records() -> int:
    """The recorder's next sequence number (one is taken): records made so far."""
    from otel_train.record import recorder
    return next(recorder.seq)


def measure(loop: Any, steps: int, rounds: int, block_steps: int, plain: Callable[[], Any],
            between: Callable[[], Any], after: Callable[[], None]) -> None:
    """Print plain, per-call automatic and replayed (`deferred(steps)`) blocks' figures."""
    epoch = loop.steps_per_epoch
    per_step: dict[str, float] = {}
    with between():
        for name, block in (("auto", contextlib.nullcontext), ("replay", lambda: deferred(steps))):
            first = _records()
            with block():
                for _ in range(epoch):
                    loop.step()
            per_step[name] = (_records() - first - 1) / epoch
    after()
    print_figure("replay_steps", steps)
    print_figure("records_per_step_auto", per_step["auto"])
    print_figure("records_per_step_replay", per_step["replay"])
    variants: dict[str, Callable[[], Any]] = {"plain": plain, "auto": contextlib.nullcontext,
                                              "replay": lambda: deferred(steps)}
    rng = random.Random(0)
    plain_us: list[float] = []
    added: dict[str, list[float]] = {"auto": [], "replay": [], "auto_minus_replay": []}
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        ns: dict[str, int] = {}
        with between():
            for name in order:
                t0 = time.perf_counter_ns()
                with variants[name]():  # the replay's last batch runs at its block's end: timed
                    for _ in range(block_steps):
                        loop.step()
                ns[name] = time.perf_counter_ns() - t0
        after()
        plain_us.append(ns["plain"] / block_steps / 1e3)
        added["auto"].append((ns["auto"] - ns["plain"]) / block_steps / 1e3)
        added["replay"].append((ns["replay"] - ns["plain"]) / block_steps / 1e3)
        added["auto_minus_replay"].append((ns["auto"] - ns["replay"]) / block_steps / 1e3)
    print_figure("rounds", rounds)
    print_figure("block_steps", block_steps)
    print_figure("step_us_plain", statistics.median(plain_us))
    for name, values in added.items():
        print_figure(f"{name}_us_per_step", statistics.median(values))
        print_ci(f"{name}_us_per_step", ci95_of(values))
