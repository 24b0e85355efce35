"""Models that appear after discovery settled (otel_train.detect.roots, checkpoint; issue 26 zoo).

A script that builds a fresh model per training loop (accelerate's own test script), or reloads
its best model with `torch.load` for a final test (pytorch/examples' word_language_model), must
not lose that model's forwards until the next rediscovery, hundreds of steps later. Real torch
loops, in-process, timed by a fake clock (support/detect_loop.py).
"""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from support.detect_loop import BWD, FWD, OPT, Net, Run, ticking_sgd  # noqa: E402
from support.detect_loop import run  # noqa: E402,F401 - the fixture
from torch import nn  # noqa: E402

from otel_train import semconv  # noqa: E402
from otel_train.detect.roots import roots  # noqa: E402


def _train(model: nn.Module, clock: object, steps: int) -> None:
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(steps):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def test_a_model_built_after_discovery_is_seen_from_its_second_step(run: Run) -> None:
    clock = run.clock
    _train(Net(clock), clock, 4)  # discovery settles on this model's root
    assert not roots.discovering
    _train(Net(clock), clock, 4)  # a fresh model: its first step's backward has no forward seen
    t = run.finish()
    shapes = [v.shape() for v in t.steps.values()]
    assert shapes[:4] == [[(FWD, 0), (BWD, 0), (OPT, None)]] * 4
    # Its first step shows what could be seen (its forward is script time, `train.other`) ...
    assert shapes[4] == [(BWD, 0), (OPT, None)]
    # ... and that step restarts discovery, which finds the new model from the next step on.
    assert shapes[5:] == [[(FWD, 0), (BWD, 0), (OPT, None)]] * 3


def test_a_whole_model_loaded_with_torch_load_gets_its_forwards_seen(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    _train(model, clock, 4)
    assert not roots.discovering
    buffer = io.BytesIO()
    torch.save(model, buffer)  # pickles carry none of our hooks: the loaded copy has none
    buffer.seek(0)
    best = torch.load(buffer, weights_only=False)
    best.eval()
    with torch.no_grad():
        best(torch.randn(4, 4))  # the final test on the best model: an evaluation pass
    t = run.finish()
    assert [s["attributes"][semconv.TRAIN_STEP] for s in t.siblings_named(semconv.SPAN_EVAL)] == [3]
    assert len(t.siblings_named(semconv.SPAN_CHECKPOINT)) == 1  # the save; a load is no checkpoint span


class _Flaky(Net):
    """A forward that raises while `fail` is set."""

    fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise ValueError("a bad batch")
        return super().forward(x)


class _Nested(Net):
    """A forward that calls the module itself once more, inside."""

    def forward(self, x: torch.Tensor, again: bool = True) -> torch.Tensor:
        out = super().forward(x)
        if not again:
            return out
        out = self(x, again=False) + out
        self.clock.advance(5_000)  # the outer call ends after the inner one
        return out


def _raising(model: nn.Module, clock: object) -> None:
    _train(model, clock, 4)
    model.fail = True
    with pytest.raises(ValueError):
        model(torch.randn(4, 4))
    model.fail = False
    _train(model, clock, 3)


def _updates_per_batch(model: nn.Module, clock: object) -> None:
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(4):
        for _ in range(2):  # the step closes at the next forward's pre-hook, inside the root's call
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()


@pytest.mark.parametrize(("model", "loop"), [(_Flaky, _raising), (_Nested, _updates_per_batch), (Net, _updates_per_batch)],
                         ids=["forward-raises", "nested-call-while-settling", "settling-inside-a-forward"])
def test_the_slot_gives_the_spans_the_hooks_give(model: type[nn.Module], loop: object,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A root timed from its slot (`torch_hooks.slot`) gives the spans its hooks give, to the
    nanosecond of the fake clock: when its
    forward raises, when discovery settles inside the root's call (the step closing at the
    next forward), and when the root calls itself inside that call."""
    from otel_train.detect import torch_hooks
    from support.detect_loop import started, stop, timed_by

    shapes = {}
    for form in ("slot", "hooks"):
        with monkeypatch.context() as patched:
            if form == "hooks":
                patched.setattr(torch_hooks, "slot", lambda *args: None)
            run = started()
            try:
                built = model(run.clock)
                loop(built, run.clock)  # type: ignore[operator]
                assert timed_by(built) == form
                shapes[form] = [[(c["name"], c["start_ns"], c["end_ns"]) for c in v.children]
                                for v in run.finish().steps.values()]
            finally:
                stop(run)
    assert shapes["slot"] == shapes["hooks"]
    assert sum(name == semconv.SPAN_FORWARD for step in shapes["slot"] for name, _, _ in step) >= 4
