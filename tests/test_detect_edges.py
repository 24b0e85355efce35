"""Step edges and coverage (otel_train.detect.machine, eval, coverage; issue 26 #3, #4, #7).

Where a step starts and ends around evaluations and checkpoints, how much of it its spans
cover (`train.step.uncovered_s`, `train.other`), and where an event recorded between steps is
shown. Real torch loops, in-process, timed by a fake clock (support/detect_loop.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support.detect_loop import BWD, FWD, OPT, Net, Run, ticking_sgd  # noqa: E402
from support.detect_loop import run  # noqa: E402,F401 - the fixture
from torch import nn  # noqa: E402

import otel_train  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.detect import coverage  # noqa: E402

UNCOVERED = semconv.TRAIN_STEP_UNCOVERED_S


def _evaluate(model: nn.Module, x: torch.Tensor, clock: object, passes: int = 2, between_ns: int = 0) -> None:
    model.eval()
    with torch.no_grad():
        for _ in range(passes):
            model(x)
            clock.advance(between_ns)  # e.g. an RL environment's step between policy forwards
    model.train()


def test_an_evaluation_before_the_first_step_joins_the_first_steps_trace(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    _evaluate(model, x, clock)  # nanoGPT's estimate_loss() at iteration 0, an RL rollout
    clock.advance(7_000)
    for _ in range(2):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    t = run.finish()
    (evaluation,) = t.siblings_named(semconv.SPAN_EVAL)
    assert evaluation["attributes"][semconv.TRAIN_STEP] == 0
    assert evaluation["trace_id"] == t.steps[0].span["trace_id"]
    assert "eval" in t.steps[0].tags
    # ... before it, not inside it: the step starts where the evaluation ended.
    assert evaluation["end_ns"] == t.steps[0].span["start_ns"]
    assert t.steps[0].shape() == [(FWD, 0), (BWD, 0), (OPT, None)]


def test_a_checkpoint_before_the_first_step_joins_the_first_steps_trace(run: Run, tmp_path: Path) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    torch.save(model.state_dict(), tmp_path / "init.pt")
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    t = run.finish()
    (save,) = t.siblings_named(semconv.SPAN_CHECKPOINT)
    assert save["attributes"][semconv.TRAIN_STEP] == 0 and "checkpoint" in t.steps[0].tags
    assert save["trace_id"] == t.steps[0].span["trace_id"]


def test_an_evaluation_ends_with_its_last_forward_not_at_the_next_training_one(run: Run) -> None:
    """An RL rollout under no_grad: policy forwards with the environment's steps between them
    are one pass; the advantage computation after it, until the update's forward, is not."""
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(3):
        _evaluate(model, x, clock, passes=3, between_ns=20_000)
        clock.advance(300_000)  # the script's own code: advantages, logging
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    t = run.finish()
    evals = t.siblings_named(semconv.SPAN_EVAL)
    assert [e["attributes"][semconv.TRAIN_STEP] for e in evals] == [0, 0, 1]
    for evaluation in evals:
        assert evaluation["end_ns"] - evaluation["start_ns"] == 3 * 10_000 + 2 * 20_000
    for n in (1, 2):
        # The next step starts where the pass ended; the 300 us (and the environment's step
        # after the last forward) are its own code, before its forward.
        step = t.steps[n]
        (other,) = step.named(semconv.SPAN_OTHER)
        assert step.span["start_ns"] == evals[n]["end_ns"] == other["start_ns"]
        assert other["end_ns"] - other["start_ns"] == 20_000 + 300_000


def test_code_between_a_step_and_its_evaluation_is_other_time_between_them(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(2):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        clock.advance(40_000)  # logging, then the evaluation
        _evaluate(model, x, clock)
    t = run.finish()
    evals = t.siblings_named(semconv.SPAN_EVAL)
    assert [(o["attributes"][semconv.TRAIN_STEP], o["start_ns"], o["end_ns"]) for o in t.between] == [
        (n, t.steps[n].span["end_ns"], evals[n]["start_ns"]) for n in (0, 1)]
    assert all(evals[n]["start_ns"] - t.steps[n].span["end_ns"] == 40_000 for n in (0, 1))


def test_forwards_after_the_last_update_are_no_step(run: Run) -> None:
    """A `predict()` with gradients in train mode after the run's last update (forward-forward's
    end), in a loop without a DataLoader: no update follows its forwards, so they open no step.
    They are an evaluation pass after the last step (it says `eval`), holding those forwards."""
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(2):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    for _ in range(3):
        clock.advance(5_000)
        model(x)  # the prediction: grad enabled, train mode
    t = run.finish(check=False)  # the pass has no step of its own to join (docs/step-semantics.md)
    assert list(t.steps) == [0, 1]
    assert all(view.named(semconv.SPAN_OPTIMIZER) for view in t.steps.values())
    (prediction,) = t.siblings_named(semconv.SPAN_EVAL)
    assert prediction["start_ns"] == t.steps[1].span["end_ns"] and "eval" in t.steps[1].tags
    inside = [s for s in t.others if s["parent_span_id"] == prediction["span_id"]]
    assert [s["name"] for s in inside if s["name"] != semconv.SPAN_OTHER] == [semconv.SPAN_FORWARD] * 3
    assert all(prediction["start_ns"] <= s["start_ns"] <= s["end_ns"] <= prediction["end_ns"] for s in inside)


def test_every_step_says_how_much_of_it_no_span_covers(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for n in range(3):
        out = model(x)
        clock.advance(300)  # the loss: too short to be a span of its own
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        clock.advance(200 if n != 1 else 60_000)  # between backward and update
        opt.step()
        clock.advance(100)
    t = run.finish()
    # Step 0: 500 ns of 110.5 us uncovered, under 0.5 %: no `train.other`, all of it said.
    # Step 1: a 60 us gap is `train.other`; what is left (the loss, and the 100 ns after the
    # last step's update that became this step's start) is said.
    # Step 2: as step 0, plus the 100 ns before it.
    assert [v.attrs[UNCOVERED] for v in t.steps.values()] == pytest.approx([500e-9, 400e-9, 600e-9])
    assert [len(v.named(semconv.SPAN_OTHER)) for v in t.steps.values()] == [0, 1, 0]
    (other,) = t.steps[1].named(semconv.SPAN_OTHER)
    assert other["end_ns"] - other["start_ns"] == 60_000
    for view in t.steps.values():  # the uncovered time is the step less the union of its spans
        covered = sum(c["end_ns"] - c["start_ns"] for c in view.children)
        assert (view.span["end_ns"] - view.span["start_ns"] - covered) / 1e9 == pytest.approx(view.attrs[UNCOVERED])


def test_largest_gaps_become_spans_until_at_most_the_allowed_share_is_left(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(2):
        clock.advance(5_000)  # get_batch()
        out = model(x)
        clock.advance(2_000)  # the loss
        nn.functional.mse_loss(out, y).backward()
        clock.advance(1_500)
        opt.step()
    t = run.finish()
    for view in t.steps.values():
        duration = view.span["end_ns"] - view.span["start_ns"]
        gaps = sorted(c["end_ns"] - c["start_ns"] for c in view.named(semconv.SPAN_OTHER))
        # (the first step starts at its first phase: the get_batch() before it is before training)
        assert gaps == ([1_500, 2_000] if view.n == 0 else [1_500, 2_000, 5_000])
        assert view.attrs[UNCOVERED] * 1e9 <= duration * coverage.MAX_UNCOVERED


def test_an_event_after_its_step_ended_is_shown_at_the_steps_end_saying_how_late(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for n in range(2):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if n == 0:
            _evaluate(model, x, clock)  # closes step 0
            clock.advance(3_000)
            otel_train.event("eval.done", loss=0.5)
    t = run.finish()
    (event,) = [e for e in run.exporter.get_finished_spans() if e.name == semconv.SPAN_STEP
                and e.attributes[semconv.TRAIN_STEP] == 0][0].events
    assert event.name == "eval.done"
    assert event.timestamp == t.steps[0].span["end_ns"]  # inside the span, where a viewer shows it
    (evaluation,) = t.siblings_named(semconv.SPAN_EVAL)
    late = evaluation["end_ns"] + 3_000 - t.steps[0].span["end_ns"]
    assert event.attributes[semconv.EVENT_LATE_S] == pytest.approx(late / 1e9)
    assert event.attributes["loss"] == 0.5
