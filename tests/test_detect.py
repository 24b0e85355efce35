"""Step and phase detection (otel_train.detect), driven in-process by real torch loops.

Spans go to an in-memory exporter; time comes from a FakeClock that the data, the model and
the optimizer advance by hand, so step boundaries can be asserted to the nanosecond.
"""

from __future__ import annotations

import gc
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from support.detect_loop import (BWD, DATA, FWD, OPT, ZG, Net, Run, Ticking,  # noqa: E402
                                 stepping, ticking_sgd, timed_by)
from support.detect_loop import run  # noqa: E402,F401 - the fixture
from support.span_tree import plain_tags  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import otel_train  # noqa: E402
from otel_train import _imports, _runtime, semconv  # noqa: E402
from otel_train import detect as _detect  # noqa: E402
from otel_train.detect import compile, data, forward, gc_pauses, roots, state  # noqa: E402
from otel_train.bench.switches import paused_detection  # noqa: E402


def test_plain_loop_one_step_per_update_with_exact_boundaries(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    loader = DataLoader(Ticking(clock), batch_size=4)
    updates = 0
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            updates += 1
        clock.advance(5_000_000)  # end of epoch work, outside any phase
    t = run.finish()
    assert len(t.steps) == updates == 8
    for view in t.steps.values():
        # optimizer.step() and the zero_grad() after it: one optimizer phase, one span.
        assert view.shape() == [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)]
        assert list(view.children[-1]["attributes"][semconv.TRAIN_OPTIMIZER_CALLS]) == ["step", "zero_grad"]
        assert view.attrs[semconv.TRAIN_EPOCH] == view.n // 4
        assert view.attrs[semconv.TRAIN_MICRO_BATCHES] == 1
        assert plain_tags(view) == set()
        # The step ends with its update (optimizer.step, then zero_grad) ...
        assert view.span["end_ns"] == view.children[-1]["end_ns"]
        data = view.phases()[0]
        assert data["end_ns"] - data["start_ns"] == 4 * 1_000  # four items fetched
        # Its phases cover it all, but for the end-of-epoch work before the next epoch's first
        # fetch, which is the script's own code: `train.other`, at the start of the step after it.
        assert view.attrs[semconv.TRAIN_STEP_UNCOVERED_S] == 0.0
        others = [(c["start_ns"] - view.span["start_ns"], c["end_ns"] - c["start_ns"])
                  for c in view.named(semconv.SPAN_OTHER)]
        assert others == ([(0, 5_000_000)] if view.n == 4 else [])
    # ... and the next one starts right there, backdated to that boundary.
    for n in range(1, 8):
        assert t.steps[n].span["start_ns"] == t.steps[n - 1].span["end_ns"]
    # The first step starts when its first batch was asked for.
    assert t.steps[0].span["start_ns"] == t.steps[0].children[0]["start_ns"]
    assert t.others == [] and t.between == []


@pytest.fixture
def accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if torch had a device to copy batches to (this CPU build has none)."""
    monkeypatch.setattr(data, "_accelerator_present", lambda: True)


def test_data_span_covers_the_fetch_and_the_batch_copies_after_it(accelerator: None, run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    for x, y in DataLoader(Ticking(clock), batch_size=4):
        clock.advance(2_000)
        x, y = x.to(torch.float32), y.to(torch.float32)  # the host-to-device copy, on a GPU
        clock.advance(500)  # not a copy: after the last one
        nn.functional.mse_loss(model(x), y).backward()
        y.to(torch.float64)  # after the forward: not the batch's copy
        opt.step()
    t = run.finish()
    for view in t.steps.values():
        data_span = view.children[0]
        assert data_span["name"] == semconv.SPAN_DATA
        assert data_span["end_ns"] - data_span["start_ns"] == 4 * 1_000 + 2_000


def test_without_an_accelerator_data_is_the_fetch_and_tensor_to_is_never_patched(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "_accelerator_present", lambda: False)  # as on this CPU build, on any
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    seen = []
    for x, y in DataLoader(Ticking(clock), batch_size=4):
        seen.append("to" in vars(torch.Tensor))
        clock.advance(2_000)
        x = x.to(torch.float32)  # no device to copy to: a conversion, part of the step
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert seen and not any(seen) and data.copy_edge.needed is False
    t = run.finish()
    for view in t.steps.values():
        data_span = view.children[0]
        assert data_span["name"] == semconv.SPAN_DATA
        assert data_span["end_ns"] - data_span["start_ns"] == 4 * 1_000


def test_tensor_to_is_patched_once_at_the_first_fetch_and_kept(accelerator: None, run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    before = vars(torch.Tensor).get("to")
    assert before is None  # nothing patched before the first batch
    seen = []
    for x, y in DataLoader(Ticking(clock), batch_size=4):
        seen.append(vars(torch.Tensor).get("to"))
        x = x.to(torch.float32)
        loss = nn.functional.mse_loss(model(x), y)
        seen.append(vars(torch.Tensor).get("to"))
        loss.backward()
        opt.step()
    assert seen and seen[0] is not None and all(f is seen[0] for f in seen)  # one patch, never rewritten
    t = run.finish()
    assert all(view.children[0]["name"] == semconv.SPAN_DATA for view in t.steps.values())


def test_a_tensor_to_patched_over_ours_is_left_alone_and_said_once(accelerator: None, run: Run,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    theirs = []
    for i, (x, y) in enumerate(DataLoader(Ticking(clock), batch_size=4)):
        if i == 1:  # patched by the first fetch: another library wraps Tensor.to over ours
            ours = vars(torch.Tensor)["to"]
            theirs.append(lambda self, *a, **k: ours(self, *a, **k))
            torch.Tensor.to = theirs[0]
        clock.advance(2_000)
        x = x.to(torch.float32)  # through their wrapper and ours: still the batch's copy
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    try:
        t = run.finish()  # uninstalls
        assert vars(torch.Tensor)["to"] is theirs[0]  # never taken away
        assert sum("Tensor.to was patched again" in r.getMessage() for r in caplog.records) == 1
        assert all(view.children[0]["end_ns"] - view.children[0]["start_ns"] == 4 * 1_000 + 2_000
                   for view in t.steps.values())
    finally:
        del torch.Tensor.to


def test_gradient_accumulation_gives_one_step_with_k_micro_batches(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    for i, (x, y) in enumerate(DataLoader(Ticking(clock), batch_size=2)):
        (nn.functional.mse_loss(model(x), y) / 4).backward()
        if (i + 1) % 4 == 0:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    t = run.finish()
    assert len(t.steps) == 2
    for view in t.steps.values():
        expected = [p for k in range(4) for p in ((DATA, k), (FWD, k), (BWD, k))] + [(OPT, None)]
        assert view.shape() == expected
        assert list(view.children[-1]["attributes"][semconv.TRAIN_OPTIMIZER_CALLS]) == [
            "clip_grad_norm_", "step", "zero_grad"]
        assert view.attrs[semconv.TRAIN_MICRO_BATCHES] == 4


def test_manual_update_without_any_optimizer_steps_per_forward_backward(run: Run) -> None:
    gc.collect()
    assert not any(issubclass(type(o), torch.optim.Optimizer) for o in gc.get_objects()), \
        "a leaked optimizer elsewhere in this process hides the manual-update loop"
    clock = run.clock
    model = Net(clock)
    for x, y in DataLoader(Ticking(clock), batch_size=4):
        nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
                p.grad = None
        clock.advance(7_000)  # the update itself: part of the step
    t = run.finish()
    assert len(t.steps) == 4
    for view in t.steps.values():
        assert view.shape() == [(DATA, 0), (FWD, 0), (BWD, 0)]
    for n in range(1, 4):  # a step ends where the next batch is asked for: the update is inside
        assert t.steps[n - 1].span["end_ns"] == t.steps[n].span["start_ns"] == t.steps[n].children[0]["start_ns"]
        assert t.steps[n - 1].span["end_ns"] - t.steps[n - 1].phases()[-1]["end_ns"] == 7_000
        # ... as the script's own code: a `train.other` after the backward
        (other,) = t.steps[n - 1].named(semconv.SPAN_OTHER)
        assert (other["start_ns"], other["end_ns"]) == (t.steps[n - 1].phases()[-1]["end_ns"],
                                                        t.steps[n - 1].span["end_ns"])


def test_loop_without_dataloader_new_forward_after_update_starts_a_step(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for _ in range(5):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    t = run.finish()
    assert len(t.steps) == 5
    # zero_grad at the top of an iteration is written before the update: it belongs to the next
    # step (the first one's too), and the last step keeps its update.
    for view in t.steps.values():
        assert view.shape() == [(ZG, None), (FWD, 0), (BWD, 0), (OPT, None)]
        assert list(view.children[-1]["attributes"][semconv.TRAIN_OPTIMIZER_CALLS]) == ["step"]
        assert view.span["end_ns"] == view.children[-1]["end_ns"]


def test_two_optimizers_per_batch_make_one_step(run: Run) -> None:
    clock = run.clock
    gen, disc = Net(clock), nn.Sequential(nn.Linear(1, 4), nn.ReLU(), nn.Linear(4, 1))
    opt_g, opt_d = ticking_sgd(gen, clock), ticking_sgd(disc, clock)
    bce = nn.BCEWithLogitsLoss()
    for x, _ in DataLoader(Ticking(clock), batch_size=4):
        fake = gen(x)
        d_loss = bce(disc(fake.detach()), torch.zeros(4, 1)) + bce(disc(torch.ones(4, 1)), torch.ones(4, 1))
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(disc(fake), torch.ones(4, 1))
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
    t = run.finish()
    assert len(t.steps) == 4
    for view in t.steps.values():
        # The loss modules (BCEWithLogitsLoss) are not forwards of their own.
        # Each optimizer's update is a phase of its own (a forward comes between them); the
        # zero_grads between forward and backward are not part of an update.
        assert view.shape() == [(DATA, 0), (FWD, 0), (FWD, 0), (FWD, 0), (ZG, None), (BWD, 0), (OPT, None),
                                (FWD, 1), (ZG, None), (BWD, 1), (OPT, None)]
        assert view.attrs[semconv.TRAIN_MICRO_BATCHES] == 2
        assert view.span["end_ns"] == view.children[-1]["end_ns"]  # after the generator's update


def test_several_updates_per_batch_become_one_step_each_once_recognised(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    for x, y in DataLoader(Ticking(clock), batch_size=4):
        for _ in range(2):  # e.g. PPO epochs over one batch
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    t = run.finish()
    # The first batch's two updates are one step (the second update is what gives the loop
    # away); from then on, every update is a step of its own.
    assert len(t.steps) == 1 + 2 * 3
    assert t.steps[0].shape() == [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None), (FWD, 1), (BWD, 1), (OPT, None)]
    assert [v.shape() for v in list(t.steps.values())[1:]] == [
        [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)], [(FWD, 0), (BWD, 0), (OPT, None)],
    ] * 3


def test_evaluation_forwards_form_one_sibling_pass_that_tags_the_step(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    data = Ticking(clock)
    train, val = DataLoader(data, batch_size=4), DataLoader(data, batch_size=8)
    for i, (x, y) in enumerate(train):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if i == 1:
            model.eval()
            with torch.no_grad():
                for vx, _ in val:
                    model(vx)
            model.train()
        if i == 2:
            with torch.inference_mode():
                model(x)
        if i == 3:
            model.eval()
            model(x)  # eval mode alone (gradients on) is evaluation too
            model.train()
    t = run.finish()
    assert len(t.steps) == 4
    evals = t.siblings_named(semconv.SPAN_EVAL)
    assert [e["attributes"][semconv.TRAIN_STEP] for e in evals] == [1, 2, 3]
    assert [sorted(plain_tags(v)) for v in t.steps.values()] == [[], ["eval"], ["eval"], ["eval"]]
    for view in t.steps.values():
        assert view.shape() == [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)]
    # The first pass covers its two batch fetches and two forwards: 16 items, 2 x 10 us.
    first = evals[0]
    assert first["end_ns"] - first["start_ns"] == 16 * 1_000 + 2 * 10_000
    # The step after an evaluation starts when it ends.
    assert t.steps[2].span["start_ns"] == first["end_ns"]


def test_no_grad_forward_inside_a_step_stays_in_the_step(run: Run) -> None:
    clock = run.clock
    model, target = Net(clock), Net(clock)
    opt = ticking_sgd(model, clock)
    for epoch in range(2):  # a new DataLoader each epoch: loaders seen for the first time
        for x, y in DataLoader(Ticking(clock), batch_size=4):
            with torch.no_grad():
                teacher = target(x)  # right after the fetch: a teacher, not an evaluation
            loss = nn.functional.mse_loss(model(x), teacher)
            with torch.no_grad():
                target(x)  # between forward and update: a target network
            loss.backward()
            opt.step()
            opt.zero_grad()
    t = run.finish()
    assert len(t.steps) == 8
    assert [v.attrs[semconv.TRAIN_EPOCH] for v in t.steps.values()] == [0] * 4 + [1] * 4
    assert t.siblings_named(semconv.SPAN_EVAL) == []
    for view in t.steps.values():
        assert view.shape() == [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)]


def test_checkpoint_is_a_sibling_after_the_step_and_tags_it(run: Run, tmp_path: Any) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    for i, (x, y) in enumerate(DataLoader(Ticking(clock), batch_size=4)):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if i % 2 == 1:
            clock.advance(3_000)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / f"{i}.pt")
    t = run.finish()
    assert len(t.steps) == 4
    saves = t.siblings_named(semconv.SPAN_CHECKPOINT)
    assert [s["attributes"][semconv.TRAIN_STEP] for s in saves] == [1, 3]  # one span per torch.save
    assert [sorted(plain_tags(v)) for v in t.steps.values()] == [[], ["checkpoint"], [], ["checkpoint"]]
    for view in t.steps.values():
        # zero_grad after the batch fetch belongs to the step that batch starts.
        assert view.shape() == [(DATA, 0), (ZG, None), (FWD, 0), (BWD, 0), (OPT, None)]
    # Step 1 ends with its update, not with the checkpoint; step 2 starts after the checkpoint.
    assert t.steps[1].span["end_ns"] == t.steps[1].children[-1]["end_ns"]
    assert t.steps[1].span["end_ns"] + 3_000 == saves[0]["start_ns"]
    assert t.steps[2].span["start_ns"] == saves[0]["end_ns"]
    # The script's own code between the update and the save is `train.other`, between them.
    assert [(o["attributes"][semconv.TRAIN_STEP], o["start_ns"], o["end_ns"]) for o in t.between] == [
        (1, t.steps[1].span["end_ns"], saves[0]["start_ns"]), (3, t.steps[3].span["end_ns"], saves[1]["start_ns"])]


def test_gc_pause_is_a_sibling_tagging_the_step_it_happened_in(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    for i, (x, y) in enumerate(DataLoader(Ticking(clock), batch_size=4)):
        loss = nn.functional.mse_loss(model(x), y)
        if i == 2:
            gc.collect()  # a full collection: always a span
        loss.backward()
        opt.step()
        opt.zero_grad()
    t = run.finish()
    pauses = [s for s in t.siblings_named(semconv.SPAN_GC) if s["attributes"].get(semconv.TRAIN_STEP) == 2]
    assert pauses and all(s["parent_span_id"] is None for s in pauses)
    assert "gc" in t.steps[2].tags
    assert len(t.steps) == 4


def test_optimizer_step_with_closure_keeps_forward_and_backward_out_of_the_update(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    for x, y in DataLoader(Ticking(clock), batch_size=4):
        def closure() -> Any:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        opt.step(closure)
    t = run.finish()
    assert len(t.steps) == 4
    for view in t.steps.values():
        assert view.shape() == [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)]
        update = view.children[-1]
        assert update["start_ns"] == view.children[-2]["end_ns"]  # the update begins after backward


def test_explicit_user_steps_rule_and_hooks_add_the_phases(run: Run) -> None:
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    for n in range(3):
        with otel_train.step(10 + n):
            for _ in range(2):
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    t = run.finish(check=False)
    assert list(t.steps) == [10, 11, 12]
    for view in t.steps.values():
        assert view.shape() == [(FWD, 0), (BWD, 0), (OPT, None), (FWD, 0), (BWD, 0), (OPT, None)]


def test_torch_save_inside_a_dataset_fetch_is_not_a_checkpoint(run: Run, tmp_path: Any) -> None:
    clock = run.clock

    class Caching(Ticking):
        def __getitem__(self, i: int) -> tuple[Any, Any]:
            item = super().__getitem__(i)
            torch.save(item, tmp_path / f"{i}.pt")
            return item

    model = Net(clock)
    opt = ticking_sgd(model, clock)
    for x, y in DataLoader(Caching(clock), batch_size=4):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    t = run.finish()
    assert len(t.steps) == 4
    assert t.siblings_named(semconv.SPAN_CHECKPOINT) == []


# --- install / uninstall ----------------------------------------------------------------------
def _registries() -> dict[str, Any]:
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o
    return {
        "forward_pre": dict(m._global_forward_pre_hooks), "forward": dict(m._global_forward_hooks),
        "forward_always": dict(m._global_forward_hooks_always_called),
        "optimizer_pre": dict(o._global_optimizer_pre_hooks), "optimizer_post": dict(o._global_optimizer_post_hooks),
        "gc": list(gc.callbacks), "warnings": list(warnings.filters), "meta_path": list(sys.meta_path),
    }


def _functions() -> dict[str, Any]:
    import torch.distributed as dist
    import torch.nn.utils
    from torch.utils.data import dataloader
    return {
        "autograd.backward": torch.autograd.backward, "Optimizer.zero_grad": vars(torch.optim.Optimizer)["zero_grad"],
        "Module.zero_grad": vars(nn.Module)["zero_grad"], "clip_grad_norm_": torch.nn.utils.clip_grad_norm_,
        "clip_grad.clip_grad_norm_": torch.nn.utils.clip_grad.clip_grad_norm_,
        "__next__": vars(dataloader._BaseDataLoaderIter)["__next__"],
        "GradScaler.step": vars(torch.amp.grad_scaler.GradScaler)["step"],
        "Tensor.to in Tensor.__dict__": "to" in vars(torch.Tensor), "torch.save": torch.save,
        "serialization.save": torch.serialization.save, "dist.all_reduce": dist.all_reduce,
        "c10d.all_reduce": dist.distributed_c10d.all_reduce, "dist.barrier": dist.barrier,
    }


def test_uninstrument_restores_everything_and_instrumenting_twice_is_harmless(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_train.instrumentation import TorchTrainingInstrumentor
    before_reg, before_fn = _registries(), _functions()
    instrumentor = TorchTrainingInstrumentor()
    instrumentor.instrument()
    try:
        installed = _registries()
        assert len(installed["forward_pre"]) == len(before_reg["forward_pre"]) + 1
        assert len(installed["optimizer_post"]) == len(before_reg["optimizer_post"]) + 1
        assert gc_pauses.gc_callback in installed["gc"]
        patched = _functions()
        assert all(patched[k] is not before_fn[k] for k in before_fn if not k.startswith("Tensor.to")), patched
        assert not patched["Tensor.to in Tensor.__dict__"]  # patched at the first fetch, if ever
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BaseInstrumentor says it is already instrumented
            instrumentor.instrument()
        assert _registries() == installed and _functions() == patched
        monkeypatch.setattr(data, "_accelerator_present", lambda: True)  # as if a device were there
        next(iter(DataLoader(range(4), batch_size=2)))
        assert "to" in vars(torch.Tensor)  # patched: uninstrument() must take it away too
    finally:
        instrumentor.uninstrument()
        otel_train.shutdown()
    assert _registries() == before_reg
    assert _functions() == before_fn
    assert _imports.waiting() == {}
    assert not _detect.installed()


def _hooks_in(registries: dict[str, Any]) -> dict[str, Any]:
    """The registries' hook functions, without the handle ids a re-registration renumbers."""
    return {k: list(v.values()) if isinstance(v, dict) else v for k, v in registries.items()}


def test_paused_detection_is_plain_torch_inside_and_goes_on_where_it_left_off(run: Run) -> None:
    """`paused_detection()` (the benchmark's plain steps between automatic ones): no hook or
    patch inside; afterwards the same ones are back, on the roots already found."""
    _detect.uninstall()
    plain_reg, plain_fn = _registries(), _functions()
    _detect.install()
    hooks = ("forward_pre", "forward", "forward_always", "optimizer_pre", "optimizer_post", "gc")
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train_steps(model, opt, 3)  # discovery is over: the model alone is timed, from its slot
    installed_reg, installed_fn = _registries(), _functions()
    assert timed_by(model) == "slot" and installed_fn != plain_fn
    for _ in range(4):
        with paused_detection():
            assert {k: _registries()[k] for k in hooks} == {k: plain_reg[k] for k in hooks}
            assert _functions() == plain_fn
            assert timed_by(model) is None and "_compiled_call_impl" not in vars(model)
            assert not model._forward_pre_hooks and not model._forward_hooks
            _train_steps(model, opt, 1)  # unseen
        assert _hooks_in(_registries()) == _hooks_in(installed_reg) and _functions() == installed_fn
        assert timed_by(model) == "slot" and not model._forward_pre_hooks and not model._forward_hooks
        _train_steps(model, opt, 1)
    t = run.finish()
    steps = [s.attributes[semconv.TRAIN_STEP] for s in run.exporter.get_finished_spans() if s.name == semconv.SPAN_STEP]
    forwards = [s for s in run.exporter.get_finished_spans() if s.name == semconv.SPAN_FORWARD]
    assert sorted(steps) == list(range(7)) and len(forwards) == 7 and len(t.steps) == 7


def test_sdk_disabled_installs_no_hook_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_train.instrumentation import TorchTrainingInstrumentor
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert _runtime.sdk_disabled()
    before_reg, before_fn = _registries(), _functions()
    instrumentor = TorchTrainingInstrumentor()
    instrumentor.instrument()
    try:
        assert _registries() == before_reg
        assert _functions() == before_fn
        assert not _detect.installed()
    finally:
        instrumentor.uninstrument()


def test_hooks_are_inert_while_the_recorder_is_off() -> None:
    _detect.install()
    try:
        assert _runtime.state() is None or _runtime.state().closed
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in DataLoader(torch.randn(8, 2), batch_size=4):
            model(x).sum().backward()
            opt.step()
        assert state.s.step is None and state.s.pending == []
    finally:
        _detect.uninstall()


DCP = """
    import json, sys, tempfile
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import otel_train
    from otel_train.instrumentation import TorchTrainingInstrumentor
    exporter = InMemorySpanExporter()
    otel_train.init(span_processors=[SimpleSpanProcessor(exporter)], export_mode="thread",
                    traces_exporter="none", metrics_exporter="none")
    TorchTrainingInstrumentor().instrument()
    torch_first = "torch" in sys.modules
    import torch, wrapt                        # the hooks go in now
    import torch.distributed.checkpoint as dcp # and the checkpoint functions are patched on import
    patched = isinstance(dcp.save, wrapt.FunctionWrapper) and isinstance(dcp.load, wrapt.FunctionWrapper)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    where = tempfile.mkdtemp()
    dcp.save({"model": model.state_dict()}, checkpoint_id=where)
    dcp.load({"model": model.state_dict()}, checkpoint_id=where)
    TorchTrainingInstrumentor().uninstrument()
    restored = not isinstance(dcp.save, wrapt.FunctionWrapper) and not isinstance(dcp.load, wrapt.FunctionWrapper)
    otel_train.shutdown()
    spans = [[s.name, s.attributes.get("train.step"), sorted(s.attributes.get("train.step.tags") or [])]
             for s in sorted(exporter.get_finished_spans(), key=lambda s: s.start_time) if s.name != "train.gc"]
    print("RESULT " + json.dumps({"torch_first": torch_first, "patched": patched, "restored": restored,
                                  "spans": spans}))
"""


def test_distributed_checkpoint_is_patched_when_imported_and_restored() -> None:
    import json

    from support.procs import run_python
    out = run_python(DCP, env={"PYTHONWARNINGS": "ignore"}, timeout=180).stdout
    result = json.loads(out.split("RESULT ", 1)[1])
    assert result["torch_first"] is False  # instrumenting did not import torch
    assert result["patched"] and result["restored"]
    steps = [s for s in result["spans"] if s[0] == "train.step"]
    assert [s[1] for s in steps] == [0, 1]
    assert [[tag for tag in s[2] if tag != "gc"] for s in steps] == [[], ["checkpoint"]]
    assert [s[:2] for s in result["spans"] if s[0] == "train.checkpoint"] == [["train.checkpoint", 1]] * 2


def test_explicit_shutdown_right_after_the_loop_closes_the_last_step_at_its_end(run: Run) -> None:
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        run.clock.advance(1_000)
    run.done = True
    otel_train.shutdown()  # no uninstall first: the detector is asked to close its step
    steps = [s for s in run.exporter.get_finished_spans() if s.name == semconv.SPAN_STEP]
    assert [s.attributes[semconv.TRAIN_STEP] for s in steps] == [0, 1, 2]
    assert not any(s.attributes.get(semconv.TRUNCATED) for s in steps)
    _detect.uninstall()


def _train_steps(model: nn.Module, opt: Any, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_global_module_hooks_give_way_to_hooks_on_the_root_only(run: Run) -> None:
    from torch.nn.modules import module as nn_module

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    loss_fn = nn.MSELoss()  # a root too, but never a forward: it keeps torch's fast path
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        loss_fn(model(torch.randn(2, 4)), torch.zeros(2, 1)).backward()
        opt.step()
        opt.zero_grad()
    # Any global module hook would send every submodule call down torch's slow path.
    assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks
    assert timed_by(model) == "slot" and not model._forward_pre_hooks and not model._forward_hooks
    assert timed_by(loss_fn) is None and not loss_fn._forward_pre_hooks and not loss_fn._forward_hooks
    assert not any(timed_by(m) or m._forward_pre_hooks or m._forward_hooks for m in model.children())
    run.finish()  # also checks the span tree invariants
    steps = [s for s in run.exporter.get_finished_spans() if s.name == semconv.SPAN_STEP]
    forwards = [s for s in run.exporter.get_finished_spans() if s.name == semconv.SPAN_FORWARD]
    assert len(steps) == 5 and len(forwards) == 5  # still one forward per step after the switch
    assert timed_by(model) is None and "_compiled_call_impl" not in vars(model)  # uninstall removed it


def test_a_model_first_used_later_is_found_by_rediscovery(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(roots.Roots, "REDISCOVER_EVERY", 4)
    first = nn.Linear(4, 1)
    opt = torch.optim.SGD(first.parameters(), lr=0.1)
    _train_steps(first, opt, 3)
    late = nn.Linear(4, 1)  # appears after discovery ended: missed until the next window
    late_opt = torch.optim.SGD(late.parameters(), lr=0.1)
    _train_steps(late, late_opt, 6)
    run.finish()
    forwards = [s.attributes[semconv.TRAIN_STEP] for s in run.exporter.get_finished_spans()
                if s.name == semconv.SPAN_FORWARD]
    assert timed_by(late) is None and timed_by(first) is None  # all removed at the end
    assert forwards[:3] == [0, 1, 2]
    assert max(forwards) == 8  # the late model's forwards are seen again once rediscovered


def test_only_our_own_code_is_hidden_from_dynamo() -> None:
    # Dynamo is told to skip the frames of our hooks; a decorated function's code is often the
    # decorator's (contextmanager's `helper` for `paused`), shared by every function it decorates,
    # and skipping that would change how Dynamo treats user code (a cold compile then counted one
    # frame fewer than without us).
    import contextlib
    import os

    from otel_train import _compat
    from otel_train.record import recorder
    from otel_train.wire import schema

    codes = compile.our_code()
    # detect/, record/, and the compat accessors and record builder they call
    files = (_compat.__file__, schema.__file__)
    ours = {os.path.dirname(_detect.__file__), os.path.dirname(recorder.__file__), *files}
    assert codes and {code.co_filename if code.co_filename in files else os.path.dirname(code.co_filename)
                      for code in codes} == ours
    assert _compat.xpu_compiled.__code__ in codes
    helper = contextlib.contextmanager(lambda: iter(())).__code__
    assert helper not in codes
    assert forward.forward_pre_hook.__code__ in codes


def test_hooks_make_no_compile_call_until_torch_compile_is_called(tmp_path) -> None:
    """Until anything is compiled, a step asks nothing of torch.compiler or Dynamo's counters
    (two attribute reads a hook); `torch.compile` flips the flag before anything is traced,
    and a compiled model's step is still detected. The root's forward is timed from its slot
    until then, and by hooks Dynamo can trace from then on (`roots.slots_to_hooks`)."""
    from support.procs import run_python
    out = run_python(f"""
        import json, sys
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        import otel_train
        from otel_train import detect
        from otel_train.detect import compile as detect_compile
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from support.detect_loop import timed_by

        otel_train.init(run_id="flag", output_dir={str(tmp_path)!r})
        detect.install()
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
        names = {{"is_dynamo_compiling", "is_compiling", "compiled_anything", "__missing__"}}
        calls = []
        def profile(frame, event, arg):  # what our hooks call (torch's own module dispatch asks too)
            if event == "call" and frame.f_code.co_name in names and "otel_train" in frame.f_back.f_code.co_filename:
                calls.append(frame.f_code.co_name)
        def step(m, x, y):
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
        batches = iter(loader)
        for x, y in [next(batches) for _ in range(5)]:  # discovery, then settled on the root
            step(model, x, y)
        before, timed_before = detect_compile.compiled.seen, timed_by(model)
        sys.setprofile(profile)
        for x, y in [next(batches) for _ in range(3)]:
            step(model, x, y)
        sys.setprofile(None)
        compiled = torch.compile(model, backend="eager")
        after, timed_after = detect_compile.compiled.seen, timed_by(model)
        for x, y in batches:
            step(compiled, x, y)
        detect.uninstall()
        otel_train.shutdown()
        print(json.dumps({{"before": before, "calls": calls, "after": after, "timed": [timed_before, timed_after]}}))
    """, timeout=180).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {"before": False, "calls": [], "after": True, "timed": ["slot", "hooks"]}
    spans = [json.loads(line) for path in tmp_path.rglob("traces-rank*.jsonl") for line in path.read_text().splitlines()]
    assert spans, "nothing recorded"


def test_a_signal_mid_update_leaves_that_step_truncated_and_delivers_the_rest(run: Run) -> None:
    # A SIGTERM (or an uncaught exception) ending the run mid-step: the steps whose update was
    # done are delivered as they are; the one still short of its update is marked truncated,
    # not closed as if it had completed.
    clock = run.clock
    model = Net(clock)
    opt = ticking_sgd(model, clock)
    loader = iter(DataLoader(Ticking(clock), batch_size=4))
    step = stepping(model, opt, loader)
    for _ in range(3):
        step()
    x, y = next(loader)
    nn.functional.mse_loss(model(x), y).backward()  # the 4th step's update never comes
    _runtime.shutdown(reason="SIGTERM")
    t = run.finish(check=False)
    truncated = {n: bool(v.attrs.get("otel_train.truncated")) for n, v in t.steps.items()}
    assert truncated == {0: False, 1: False, 2: False, 3: True}
