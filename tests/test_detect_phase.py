"""The optimizer phase (otel_train.detect.phase, optimizer, sites): one `train.optimizer` per
update, zero_grad placed where it is written, closures nested when re-evaluated (issue 26 #2, #3, #5).

Real torch loops, in-process, timed by a fake clock (support/detect_loop.py).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from support.detect_loop import BWD, DATA, FWD, OPT, ZG, Net, Run, Ticking, ticking_sgd  # noqa: E402
from support.detect_loop import run  # noqa: E402,F401 - the fixture
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import otel_train  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.detect import optimizer  # noqa: E402

CALLS = semconv.TRAIN_OPTIMIZER_CALLS


def _calls(view: Any) -> list[list[str]]:
    return [list(c["attributes"][CALLS]) for c in view.named(semconv.SPAN_OPTIMIZER)]


def test_clip_step_and_zero_grad_are_one_span_from_the_first_to_the_last(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(3):
        nn.functional.mse_loss(model(x), y).backward()
        clock.advance(2_000)  # the script's own code before the update (unscale_, logging)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        clock.advance(3_000)  # between clipping and the step: part of the update
        opt.step()  # 100 us (ticking_sgd)
        clock.advance(4_000)  # scaler.update() and the like: part of the update
        opt.zero_grad()
    t = run.finish()
    assert len(t.steps) == 3
    for view in t.steps.values():
        assert view.shape() == [(FWD, 0), (BWD, 0), (OPT, None)]
        assert _calls(view) == [["clip_grad_norm_", "step", "zero_grad"]]
        (update,) = view.named(semconv.SPAN_OPTIMIZER)
        backward = view.phases()[1]
        assert update["start_ns"] == backward["end_ns"] + 2_000  # from the clipping's start ...
        assert update["end_ns"] - update["start_ns"] == 3_000 + 100_000 + 4_000  # ... to zero_grad's end
        assert view.span["end_ns"] == update["end_ns"]


class SpanningSGD(torch.optim.SGD):
    """An optimizer whose step() records a span of the user's own."""

    def step(self, closure: Any = None) -> Any:
        with otel_train.span("user.in_step"):
            return super().step(closure)


def test_spans_in_the_updates_calls_nest_under_it_and_those_between_them_do_not(run: Run) -> None:
    """The phase is current while each of its calls runs (`phase.part_begin`), and only then."""
    clock = run.clock
    model = Net(clock)
    opt = SpanningSGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(3):
        nn.functional.mse_loss(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with otel_train.span("user.between"):  # between clipping and the step: inside the update's time
            clock.advance(1_000)
        opt.step()
        opt.zero_grad()
    t = run.finish()
    assert len(t.steps) == 3
    by_name: dict[str, list[Any]] = {}
    for span in run.exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    updates = {f"{u.context.span_id:016x}" for u in by_name[semconv.SPAN_OPTIMIZER]}
    steps = {f"{u.context.span_id:016x}" for u in by_name[semconv.SPAN_STEP]}
    parents = {name: [f"{s.parent.span_id:016x}" for s in by_name[name]]
               for name in ("user.in_step", "user.between")}
    assert len(parents["user.in_step"]) == 3 and set(parents["user.in_step"]) == updates
    assert len(parents["user.between"]) == 3 and set(parents["user.between"]) == steps
    for view in t.steps.values():
        assert _calls(view) == [["clip_grad_norm_", "step", "zero_grad"]]


def test_zero_grad_at_the_top_of_a_loop_without_batches_goes_to_the_next_step(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(4):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        clock.advance(50_000)  # the tail of the iteration: logging
    t = run.finish()
    assert len(t.steps) == 4
    for view in t.steps.values():
        assert view.shape() == [(ZG, None), (FWD, 0), (BWD, 0), (OPT, None)]
        assert _calls(view) == [["step"]]
        assert view.span["end_ns"] == view.named(semconv.SPAN_OPTIMIZER)[0]["end_ns"]
    # The tail of an iteration is the next step's, before its zero_grad: the script's own code.
    for n in range(1, 4):
        (other,) = t.steps[n].named(semconv.SPAN_OTHER)
        assert other["end_ns"] - other["start_ns"] == 50_000
        assert other["start_ns"] == t.steps[n].span["start_ns"] == t.steps[n - 1].span["end_ns"]


def test_zero_grad_at_the_end_of_a_loop_without_batches_joins_the_update(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(4):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    t = run.finish()
    assert len(t.steps) == 4
    for view in t.steps.values():
        assert view.shape() == [(FWD, 0), (BWD, 0), (OPT, None)]
        assert _calls(view) == [["step", "zero_grad"]]


def test_zero_grad_at_the_top_of_a_helper_called_each_iteration_goes_to_the_next_step(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)

    def train_step() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(3):
        train_step()
    t = run.finish()
    assert [v.shape() for v in t.steps.values()] == [[(ZG, None), (FWD, 0), (BWD, 0), (OPT, None)]] * 3


def test_a_step_function_s_locals_go_when_it_returns(run: Run) -> None:
    """Where the update was called from is remembered, to place a later zero_grad (`sites`),
    without holding the caller's frame: the locals of a function run once a step (its batch,
    the model's output) are freed when it returns, not one step later."""
    import weakref
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    outputs: list[Any] = []

    def train_step() -> None:
        x, y = torch.randn(4, 4), torch.randn(4, 1)
        out = model(x)
        outputs.append(weakref.ref(out))
        nn.functional.mse_loss(out, y).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(4):
        train_step()
        assert outputs[-1]() is None
    t = run.finish()
    assert [_calls(v) for v in t.steps.values()] == [[["step", "zero_grad"]]] * 4


def test_zero_grad_between_forward_and_backward_is_its_own_span_in_the_step(run: Run) -> None:
    """PPO's order: forward, zero_grad, backward, clip, step."""
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(3):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    t = run.finish()
    for view in t.steps.values():
        assert view.shape() == [(FWD, 0), (ZG, None), (BWD, 0), (OPT, None)]
        assert _calls(view) == [["clip_grad_norm_", "step"]]


def test_lbfgs_closure_evaluations_nest_under_the_one_update(run: Run) -> None:
    clock = run.clock
    torch.manual_seed(0)
    model = Net(clock)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    evaluations = []

    def closure() -> Any:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        evaluations[-1] += 1
        return loss

    for _ in range(3):
        evaluations.append(0)
        opt.step(closure)
        with torch.no_grad():  # a prediction after each step: an evaluation pass
            model(x)
    t = run.finish()
    assert len(t.steps) == 3 and all(n > 1 for n in evaluations)
    for view, n in zip(t.steps.values(), evaluations):
        assert view.shape() == [(OPT, None)]  # no micro-batch outside the update
        (update,) = view.named(semconv.SPAN_OPTIMIZER)
        assert _calls(view) == [["step"]]
        nested = [s for s in run.exporter.get_finished_spans()
                  if s.parent is not None and f"{s.parent.span_id:016x}" == update["span_id"]]
        assert [s.name for s in nested] == [semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD] * n
        assert all(semconv.TRAIN_MICRO_BATCH not in s.attributes for s in nested)  # evaluations, not micro-batches
        assert all(update["start_ns"] <= s.start_time and s.end_time <= update["end_ns"] for s in nested)
    assert len(t.siblings_named(semconv.SPAN_EVAL)) == 3


class TwiceSGD(torch.optim.SGD):
    """An optimizer of the user's own that evaluates its closure twice (a line search)."""

    def step(self, closure: Any = None) -> Any:
        closure()
        return super().step(closure)


def test_an_optimizer_seen_re_evaluating_its_closure_nests_its_evaluations_from_then_on(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = TwiceSGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 4), torch.randn(4, 1)

    def closure() -> Any:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    try:
        for _ in range(3):
            opt.step(closure)
        t = run.finish()
    finally:
        optimizer._reevaluating.discard(TwiceSGD)
    # The first step: its first evaluation is the step's micro-batch, the second nests under the
    # update that began after it (as it happens). From the second step on: every evaluation nests.
    assert t.steps[0].shape() == [(FWD, 0), (BWD, 0), (OPT, None)]
    assert [t.steps[n].shape() for n in (1, 2)] == [[(OPT, None)]] * 2


def test_single_evaluation_closures_keep_forward_and_backward_outside_the_update(run: Run) -> None:
    """What Lightning's automatic optimisation passes to SGD or Adam: the closure's one
    evaluation is the step's micro-batch, the update after it is `train.optimizer`."""
    clock = run.clock
    model = Net(clock)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    opt.register_step_post_hook(lambda *a: clock.advance(30_000))  # after the closure: the update's
    for x, y in DataLoader(Ticking(clock), batch_size=4):
        def closure() -> Any:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        opt.step(closure)
    t = run.finish()
    for view in t.steps.values():
        assert view.shape() == [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)]
        update = view.children[-1]
        assert update["start_ns"] == view.phases()[-2]["end_ns"]  # the update begins after the backward
        assert update["end_ns"] - update["start_ns"] == 30_000


def test_an_update_that_raises_leaves_nothing_current(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    boom = opt.register_step_pre_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(RuntimeError):
        opt.step()
    boom.remove()
    for _ in range(2):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    t = run.finish()
    # An update that raised is no update: the step goes on (its next forward is a micro-batch of
    # it), and nothing is left nested under the update that raised.
    assert len(t.steps) == 2
    assert t.steps[0].shape() == [(FWD, 0), (BWD, 0), (OPT, None), (FWD, 1), (BWD, 1), (OPT, None)]
    assert t.steps[1].shape() == [(FWD, 0), (BWD, 0), (OPT, None)]
