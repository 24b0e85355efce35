"""A real torch loop under automatic detection, in-process, timed by a fake clock.

Spans go to an in-memory exporter; time comes from a FakeClock that the data, the model and
the optimizer advance by hand, so step boundaries can be asserted to the nanosecond.
`started()` gives a `Run` (the `run` fixture of tests/test_detect*.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import torch
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch import nn
from torch.utils.data import Dataset

import otel_train
from otel_train import detect as _detect
from otel_train.record.clock import FakeClock
from support.span_tree import Tree, check_invariants, tree

DATA, FWD, BWD, OPT, ZG, OTHER = "data", "forward", "backward", "optimizer", "zero_grad", "other"


class Run:
    """One instrumented run: the clock to move and, once finished, the span tree."""

    def __init__(self, exporter: InMemorySpanExporter, clock: FakeClock) -> None:
        self.exporter = exporter
        self.clock = clock
        self.done = False

    def finish(self, check: bool = True) -> Tree:
        if not self.done:
            self.done = True
            _detect.uninstall()
            otel_train.shutdown()
        t = tree(self.exporter.get_finished_spans())
        if check:
            check_invariants(t)
        return t


def started() -> Run:
    """otel_train initialised with a fake clock and an in-memory exporter, detection installed."""
    exporter = InMemorySpanExporter()
    clock = FakeClock()
    otel_train.init(span_processors=[SimpleSpanProcessor(exporter)], export_mode="thread", clock=clock,
                    traces_exporter="none", metrics_exporter="none", flush_interval_ms=10)
    _detect.install()
    return Run(exporter, clock)


def stop(r: Run) -> None:
    if not r.done:
        _detect.uninstall()
        otel_train.shutdown()


class Ticking(Dataset):
    """Each item costs 1 us of fake time to fetch."""

    def __init__(self, clock: FakeClock, n: int = 16) -> None:
        self.clock = clock
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        self.clock.advance(1_000)
        return self.x[i], self.y[i]


class Net(nn.Module):
    """A forward costs 10 us of fake time (and calls submodules, which must not become spans)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x: Any) -> Any:
        self.clock.advance(10_000)
        return self.body(x)


def ticking_sgd(model: nn.Module, clock: FakeClock, **kw: Any) -> Any:
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, **kw)
    opt.register_step_pre_hook(lambda *a: None if clock.advance(100_000) else None)  # inside our span
    return opt


def timed_by(module: nn.Module) -> str | None:
    """How detection times the module's forward: "slot" (`torch_hooks.slot`), "hooks" (ours in
    its hook tables), or None."""
    from otel_train.detect import torch_hooks
    if torch_hooks.is_slot(vars(module).get("_compiled_call_impl")):
        return "slot"
    if torch_hooks.ours(module._forward_pre_hooks) or torch_hooks.ours(module._forward_hooks):
        return "hooks"
    return None


def stepping(model: nn.Module, opt: Any, batches: Iterator[Any]) -> Callable[[], None]:
    """One training step a call: the next of `batches`, the forward and backward, the update,
    zero_grad."""
    def step() -> None:
        x, y = next(batches)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return step


@pytest.fixture
def run() -> Iterator[Run]:
    """A started run, stopped after the test (`started`, `stop`)."""
    r = started()
    try:
        yield r
    finally:
        stop(r)
