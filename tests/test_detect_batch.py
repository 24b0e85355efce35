"""Detection's calls batched (`otel_train.detect.batch`): noted at the call, run a few steps later
through the same bodies, the records as if each had run at its call.

Time comes from a FakeClock that the data, the model and the optimizer advance by hand, so the
batched run's spans can be held to the per-call run's to the nanosecond.
"""

from __future__ import annotations

import gc
import logging
import sys
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from support.detect_loop import (Net, Run, Ticking, run, started, stepping, stop,  # noqa: E402,F401 - `run`: a fixture
                                 ticking_sgd)
import torch
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import otel_train  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.detect import batch  # noqa: E402

def _spans(r: Run) -> list[tuple[Any, ...]]:
    """Every span as (name, start, end, parent's name, attributes), in start order."""
    spans = r.exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    out = []
    for s in spans:
        parent = by_id.get(s.parent.span_id) if s.parent is not None else None
        out.append((s.name, s.start_time, s.end_time, parent.name if parent is not None else None,
                    sorted((k, str(v)) for k, v in s.attributes.items())))
    return sorted(out, key=lambda x: (x[1], x[0], x[2]))


def _accumulating_loop(r: Run, steps: int = 10, eval_every: int = 4) -> None:
    """Two micro-batches a step, clipping, an evaluation pass and a user's span now and then, a GC pause once."""
    clock = r.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    loader = DataLoader(Ticking(clock, n=4 * steps), batch_size=2)
    it = iter(loader)
    for n in range(steps):
        for _ in range(2):
            x, y = next(it)
            loss = nn.functional.mse_loss(model(x), y) / 2
            loss.backward()
            clock.advance(3_000)
        if n == 5:
            gc.collect()  # a pause noted among the calls waiting: a span of its own
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        clock.advance(7_000)
        if n % eval_every == eval_every - 1:
            model.eval()
            with torch.no_grad():
                model(torch.randn(2, 4))
            model.train()
            with otel_train.span("user.log"):
                clock.advance(2_000)


def _both_ways(loop: Callable[[Run], None]) -> tuple[list[Any], list[Any], int]:
    """The loop's spans batched and per call, and how many calls waited to run in the first."""
    runs = []
    waited = 0
    for batched in (True, False):
        r = started()
        gc.disable()  # a collection in one run and not the other would be a span more
        try:
            batch.b.on = batched and batch.b.on
            loop(r)
            if batched:
                waited = batch.b.taken + len(batch.b.notes)  # every note made, run or waiting
            r.finish()
            runs.append(_spans(r))
        finally:
            gc.enable()
            stop(r)
    return runs[0], runs[1], waited


def test_batched_calls_make_the_per_call_records_to_the_nanosecond() -> None:
    batched, per_call, waited = _both_ways(_accumulating_loop)
    assert waited > 50  # the calls really waited
    names = [s[0] for s in per_call]
    assert names.count("train.step") == 10 and "train.eval" in names and "user.log" in names
    assert names.count(semconv.SPAN_GC) == 1
    assert batched == per_call


def test_a_span_in_the_forward_nests_under_it_while_calls_wait(run: Run) -> None:
    clock = run.clock

    class Spanning(Net):
        def forward(self, x: Any) -> Any:
            with otel_train.span("user.inside"):
                clock.advance(500)
            return super().forward(x)

    model = Spanning(clock)
    opt = ticking_sgd(model, clock)
    for x, y in DataLoader(Ticking(clock, n=16), batch_size=4):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    t = run.finish()
    assert len(t.steps) == 4
    spans = run.exporter.get_finished_spans()
    forwards = {s.context.span_id for s in spans if s.name == semconv.SPAN_FORWARD}
    users = [s for s in spans if s.name == "user.inside"]
    assert len(users) == 4 and all(u.parent is not None and u.parent.span_id in forwards for u in users)


def test_a_backward_that_raises_is_recorded_and_the_error_left_as_it_was(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    loader = iter(DataLoader(Ticking(clock, n=16), batch_size=4))
    step = stepping(model, opt, loader)
    for _ in range(2):
        step()
    x, y = next(loader)
    loss = nn.functional.mse_loss(model(x), y)
    with pytest.raises(RuntimeError) as caught:
        loss.detach().backward()  # nothing to differentiate: torch raises
    before = traceback.format_exception(caught.value)
    assert batch.b.notes  # its call waits, with the error
    batch.settle()
    assert not batch.b.notes
    assert traceback.format_exception(caught.value) == before  # no frame of ours added
    run.finish()
    spans = run.exporter.get_finished_spans()
    errors = [s for s in spans if s.name == "train.backward" and not s.status.is_ok]
    assert len(errors) == 1 and "RuntimeError" in (errors[0].status.description or "") + str(errors[0].events)


def test_a_finished_steps_frames_and_locals_are_not_kept_while_calls_wait(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    loader = iter(DataLoader(Ticking(clock, n=16), batch_size=4))
    kept: list[weakref.ref[Any]] = []

    class Marker:
        pass

    def one_step() -> None:
        marker = Marker()  # a local of the user's per-step function
        kept.append(weakref.ref(marker))
        x, y = next(loader)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(4):  # the first steps, while roots are discovered, run each call at once
        one_step()
    assert batch.b.notes  # the update's calls wait ...
    assert kept[-1]() is None  # ... and keep nothing of the function that made them
    run.finish()


def test_a_replay_that_fails_is_said_once_and_calls_run_at_once_after(run: Run, caplog: pytest.LogCaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    real = batch.b.real["forward_end"]
    calls = {"n": 0}

    def failing(module: Any) -> None:
        if batch.b.replaying:
            calls["n"] += 1
            if calls["n"] == 2:
                raise ValueError("a bug of ours")
        return real(module)

    monkeypatch.setitem(batch.b.real, "forward_end", failing)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for x, y in DataLoader(Ticking(clock, n=32), batch_size=4):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        batch.settle()
    said = [rec for rec in caplog.records if "replaying detection's calls failed" in rec.getMessage()]
    assert len(said) == 1 and batch.b.failed and batch.b.dropped > 0
    assert not batch.b.notes  # from then on, each call ran at once
    t = run.finish(check=False)  # the dropped batch's steps are cut short: no invariants
    assert len(t.steps) >= 1


def test_bench_parts_note_without_replaying_and_stub_without_noting(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """`benchmarks.switches.notes_dropped` and `entry_points_stubbed` (`benchmarks.auto_cost --parts`): inside the
    first, the forwards are noted and no batch runs them through their body; inside the second,
    nothing is noted and no body runs, and the model still trains; after each, the entry points
    and the replay are as installed and the steps go on being recorded."""
    from otel_train.detect import backward, data, forward, optimizer
    from benchmarks.switches import entry_points_stubbed, notes_dropped

    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    installed = [(module, name, getattr(module, name)) for module, name in (
        (forward, "forward_begin"), (backward, "backward_run"), (data, "fetch"), (optimizer, "optimizer_begin"),
        (optimizer, "zero_grad_run"))]
    replay = batch._batch
    bodies = {"n": 0}
    body = batch.b.real["forward_begin"]

    def counted(module: nn.Module) -> None:
        bodies["n"] += 1
        return body(module)

    step = stepping(model, opt, iter(DataLoader(Ticking(clock, n=128), batch_size=4)))
    for _ in range(8):  # past the discovery of the model's outermost module
        step()
    batch.settle()
    monkeypatch.setitem(batch.b.real, "forward_begin", counted)
    for _ in range(3):
        step()
    batch.settle()
    assert bodies["n"] == 3  # each forward's body ran, in a replay
    taken = batch.b.taken
    with notes_dropped():
        for _ in range(3):
            step()
        assert batch.b.notes  # noted as usual
        batch.settle()
        assert batch.b.taken > taken and not batch.b.notes  # taken, and run nowhere
    assert bodies["n"] == 3
    weight = model.body[0].weight.detach().clone()
    with entry_points_stubbed():
        for _ in range(3):
            step()
        assert not batch.b.notes
    assert bodies["n"] == 3 and not torch.equal(weight, model.body[0].weight)  # trained, unseen
    assert [(module, name, getattr(module, name)) for module, name, _ in installed] == installed
    assert batch._batch is replay
    for _ in range(2):
        step()
    batch.settle()
    assert bodies["n"] == 5
    assert len(run.finish(check=False).steps) >= 8


def test_a_timed_bench_block_runs_the_calls_it_left_waiting_in_its_time(run: Run) -> None:
    """`benchmarks.auto_cost` times a block of fewer steps than a batch of notes: its replay must fall
    inside the block's time, not the untimed flush after the round."""
    from benchmarks.auto_cost import _timed

    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    step = stepping(model, opt, iter(DataLoader(Ticking(clock, n=16), batch_size=4)))
    taken = batch.b.taken
    _timed(step, 3)
    assert batch.b.taken > taken and not batch.b.notes


def test_the_notes_hold_nothing_once_replayed() -> None:
    """Made and replayed in C, each of ~7,000 notes lets go of what it held: the process's memory
    grows no more over the same steps than with each call run at once, unnoted (one reference
    kept a note would be thousands of blocks more)."""
    from otel_train import _runtime

    grown: dict[bool, list[int]] = {True: [], False: []}
    for batched in (True, False, True, False):
        r = started()
        try:
            batch.b.on = batched and batch.b.on
            model = Net(r.clock)
            loader = iter(DataLoader(Ticking(r.clock, n=4 * 1100), batch_size=4))
            step = stepping(model, ticking_sgd(model, r.clock), loader)
            for n in range(1100):
                if n == 100:  # warm: every path taken once
                    batch.settle()
                    _runtime.state().worker.flush()  # type: ignore[union-attr]
                    gc.collect()
                    before = sys.getallocatedblocks()
                step()
            batch.settle()
            _runtime.state().worker.flush()  # type: ignore[union-attr]
            gc.collect()
            grown[batched].append(sys.getallocatedblocks() - before)
        finally:
            stop(r)
    assert min(grown[True]) - max(grown[False]) < 1_000, grown


def test_note_kinds_and_fields_are_numbered_once_in_c() -> None:
    """`_batch.c` numbers the note kinds and a wrapped note's fields; `batch.py` takes its numbers."""
    _batch = pytest.importorskip("otel_train.detect._batch")
    kinds = ("FWD_BEGIN", "FWD_END", "BACKWARD", "FETCH", "OPT_BEGIN", "OPT_END", "ZERO_GRAD", "GC", "CLIP")
    assert {name: getattr(batch, name) for name in kinds + ("T1", "INDEX", "INNER", "ERROR")} == {
        name: getattr(_batch, name) for name in kinds + ("T1", "INDEX", "INNER", "ERROR")}
    assert len({getattr(_batch, name) for name in kinds}) == len(kinds)
