"""The patched `torch.autograd.backward`, `DataLoader` iteration, `zero_grad`, `clip_grad_norm_`
and `GradScaler.step` as objects in C (`otel_train.detect.entry`, `_entry.c`): an error from the
user's code or torch's shows the frames it shows without otel_train, the patched objects act as
the functions they replaced (Dynamo traces them as it traces torch's), and their checks call the
user's function alone where the Python functions did.
"""

from __future__ import annotations

import copy
import inspect
import json
import pickle
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from support.detect_loop import Net, Run, run, ticking_sgd  # noqa: E402,F401 - `run`: a fixture
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.data.dataloader import _BaseDataLoaderIter  # noqa: E402

import otel_train  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.detect import backward, batch, data, entry  # noqa: E402
from otel_train.detect.state import s  # noqa: E402
from benchmarks.switches import calls_at_once  # noqa: E402
from otel_train.bench.switches import paused_detection  # noqa: E402


_PACKAGE = str(Path(otel_train.__file__).parent)


class Failing(Dataset):
    """Eight samples; the one at `bad` raises."""

    def __init__(self, bad: int = 5) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        if i == self.bad:
            raise ValueError("a bad sample")
        return torch.ones(4), torch.zeros(1)


def _dataset_fails(model: nn.Module, opt: Any) -> BaseException:
    """Train over `Failing` until its bad sample raises (the third batch); the error."""
    try:
        for x, y in DataLoader(Failing(), batch_size=2):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    except ValueError as err:
        return err
    raise AssertionError("the dataset did not raise")


def _backward_twice(model: nn.Module, opt: Any) -> BaseException:
    """Two good steps, then a backward through a freed graph; the error."""
    x, y = torch.ones(2, 4), torch.zeros(2, 1)
    for _ in range(2):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    try:
        loss.backward()
    except RuntimeError as err:
        return err
    raise AssertionError("the second backward did not raise")


def _clip_fails(model: nn.Module, opt: Any) -> BaseException:
    """Two good steps, then a non-finite gradient norm that clipping refuses; the error."""
    x, y = torch.ones(2, 4), torch.zeros(2, 1)
    for n in range(3):
        (nn.functional.mse_loss(model(x), y) * (float("nan") if n == 2 else 1.0)).backward()
        try:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
        except RuntimeError as err:
            opt.zero_grad()
            return err
        opt.step()
        opt.zero_grad()
    raise AssertionError("clipping did not raise")


class _Unlisted(nn.Module):
    """A module whose `parameters()` fails: `zero_grad()` calls it."""

    def parameters(self, recurse: bool = True) -> Any:
        raise LookupError("no parameters here")


def _zero_grad_fails(model: nn.Module, opt: Any) -> BaseException:
    """A good step, then a `zero_grad()` whose module's code raises inside it; the error."""
    x, y = torch.ones(2, 4), torch.zeros(2, 1)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    try:
        _Unlisted().zero_grad()
    except LookupError as err:
        return err
    raise AssertionError("zero_grad did not raise")


def _scaler_fails(model: nn.Module, opt: Any) -> BaseException:
    """Two good steps through a gradient scaler, then its `step()` twice before an `update()`."""
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.ones(2, 4), torch.zeros(2, 1)
    for n in range(3):
        scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
        scaler.step(opt)
        if n == 2:
            try:
                scaler.step(opt)
            except RuntimeError as err:
                opt.zero_grad()
                return err
        scaler.update()
        opt.zero_grad()
    raise AssertionError("the scaler did not raise")


def _frames(err: BaseException) -> list[tuple[str, str]]:
    return [(Path(f.filename).name, f.name) for f in traceback.extract_tb(err.__traceback__)]


def _ours(err: BaseException) -> list[str]:
    return [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_tb(err.__traceback__)
            if f.filename.startswith(_PACKAGE)]


def _warm(run: Run, model: nn.Module, opt: Any, steps: int) -> None:
    """`steps` plain steps through a DataLoader, so that discovery is over and calls are noted."""
    loader = DataLoader([(torch.ones(4), torch.zeros(1))] * (2 * steps), batch_size=2)
    for x, y in loader:
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("fails", [_dataset_fails, _backward_twice, _clip_fails, _zero_grad_fails, _scaler_fails],
                         ids=["dataset", "backward", "clip_grad_norm_", "zero_grad", "GradScaler.step"])
@pytest.mark.parametrize("when", ["discovering", "noted", "at_once"])
def test_an_error_shows_the_frames_it_shows_without_us(run: Run, fails: Callable[..., BaseException],
                                                       when: str) -> None:
    """While discovery's hooks run the bodies in Python, while calls are noted (C), and with each
    call run at its moment (the Python bodies that call the user's function): the same frames."""
    model = Net(run.clock)
    opt = ticking_sgd(model, run.clock)
    with paused_detection():
        plain = fails(model, opt)
    if when != "discovering":
        _warm(run, model, opt, 4)
    if when == "at_once":
        with calls_at_once():
            err = fails(model, opt)
    else:
        err = fails(model, opt)
    assert _ours(err) == []
    assert _frames(err) == _frames(plain)
    assert "".join(traceback.format_exception(err)).count(_PACKAGE) == 0
    batch.settle()
    run.finish()
    names = {span.name for span in run.exporter.get_finished_spans()}
    assert semconv.SPAN_BACKWARD in names and semconv.SPAN_OPTIMIZER in names
    assert semconv.SPAN_DATA in names or fails is not _dataset_fails


def test_a_failing_copy_to_the_device_shows_the_frames_it_shows_without_us(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Tensor.to`, patched where torch has an accelerator (here as if it had one): a copy that
    fails (no such device: this build has no CUDA, a GPU machine no 100th GPU; as a device out of
    memory would fail) shows no frame of ours."""
    monkeypatch.setattr(data, "_accelerator_present", lambda: True)

    def copy_fails() -> BaseException:
        for x, _ in DataLoader([(torch.ones(4), torch.zeros(1))] * 4, batch_size=2):
            try:
                x.to("cuda:99")
            except (AssertionError, RuntimeError) as err:
                return err
        raise AssertionError("the copy did not raise")

    with paused_detection():
        plain = copy_fails()
    err = copy_fails()
    assert isinstance(vars(torch.Tensor)["to"], entry._entry.Entry)
    assert _ours(err) == [] and _frames(err) == _frames(plain) and _frames(err)


def _save_fails(model: nn.Module, opt: Any) -> BaseException:
    try:
        torch.save(model.state_dict(), "/nonexistent-dir-otel-train/ckpt.pt")
    except RuntimeError as err:
        return err
    raise AssertionError("torch.save did not raise")


def _collective_fails(model: nn.Module, opt: Any) -> BaseException:
    import torch.distributed as dist
    try:
        dist.all_reduce(torch.ones(1))  # no process group
    except ValueError as err:
        return err
    raise AssertionError("all_reduce did not raise")


@pytest.mark.parametrize("fails", [_save_fails, _collective_fails], ids=["torch.save", "all_reduce"])
def test_an_error_inside_a_wrapt_wrapped_function_shows_the_frames_it_shows_without_us(
        run: Run, fails: Callable[..., BaseException]) -> None:
    """Checkpoints and collectives keep their wrapt wrappers, which call ours through `Hidden`."""
    if fails is _collective_fails and not torch.distributed.is_available():
        pytest.skip("torch.distributed is not built")
    model = Net(run.clock)
    opt = ticking_sgd(model, run.clock)
    with paused_detection():
        plain = fails(model, opt)
    _warm(run, model, opt, 3)
    err = fails(model, opt)
    assert _ours(err) == [] and _frames(err) == _frames(plain)


def _in_our_namespace(source: str, **names: Any) -> Callable[..., Any]:
    """A function compiled as if written in a module of otel_train's (its frames are ours)."""
    namespace: dict[str, Any] = {"__name__": "otel_train.detect.a_body", **names}
    exec(compile(source, str(Path(_PACKAGE) / "detect" / "a_body.py"), "exec"), namespace)  # noqa: S102
    return namespace["fetch"]


def test_an_error_begun_in_our_code_keeps_its_frames(run: Run) -> None:
    """A body of ours that raises is ours to be seen; one that only passes on the user's error is not."""
    ours = _in_our_namespace("def fetch(original, iterator):\n    raise KeyError('ours')\n")
    passing = _in_our_namespace("def fetch(original, iterator):\n    return original(iterator)\n")
    with pytest.MonkeyPatch.context() as patch:  # undone before the run stops, which restores `data.fetch`
        patch.setattr(data, "fetch", ours)
        with pytest.raises(KeyError) as caught:
            next(iter(DataLoader(Failing(bad=-1), batch_size=2)))
        assert any(line.endswith(" fetch") and "a_body.py" in line for line in _ours(caught.value)), \
            _frames(caught.value)
        patch.setattr(data, "fetch", passing)
        with pytest.raises(ValueError) as caught:
            next(iter(DataLoader(Failing(bad=0), batch_size=2)))
        assert _ours(caught.value) == []


def test_the_patched_objects_act_as_the_functions_they_replaced(run: Run) -> None:
    patched, original = torch.autograd.backward, torch.autograd.backward.__wrapped__
    assert type(patched) is entry._entry.Entry and inspect.isfunction(original)
    assert (patched.__name__, patched.__qualname__, patched.__module__, patched.__doc__) == (
        original.__name__, original.__qualname__, original.__module__, original.__doc__)
    assert inspect.signature(patched) == inspect.signature(original)
    assert pickle.loads(pickle.dumps(patched)) is patched and copy.deepcopy(patched) is patched
    method = _BaseDataLoaderIter.__next__
    assert type(method) is entry._entry.Entry and method.__name__ == "__next__"
    assert pickle.loads(pickle.dumps(method)) is method

    model = Net(run.clock)
    x = torch.ones(2, 4)
    it = iter(DataLoader([(torch.ones(4), torch.zeros(1))] * 6, batch_size=2))
    assert it.__next__.__self__ is it and it.__next__.__func__ is method
    first, second, third = next(it), it.__next__(), _BaseDataLoaderIter.__next__(it)
    assert all(b[0].shape == (2, 4) for b in (first, second, third))
    with pytest.raises(StopIteration):
        next(it)
    loss = model(x).sum()
    torch.autograd.backward(loss, retain_graph=True)
    grads = [p.grad.clone() for p in model.parameters()]
    torch.autograd.backward([loss], grad_tensors=[torch.tensor(1.0)], inputs=list(model.parameters()))
    assert all(torch.equal(p.grad, 2 * g) for p, g in zip(model.parameters(), grads))


@pytest.mark.parametrize("owner, name", [(torch.nn.utils, "clip_grad_norm_"), (torch.optim.Optimizer, "zero_grad"),
                                          (nn.Module, "zero_grad"), (torch.amp.GradScaler, "step")])
def test_the_update_s_patched_functions_act_as_the_ones_they_replaced(run: Run, owner: Any, name: str) -> None:
    patched = vars(owner)[name]
    original = patched.__wrapped__
    assert isinstance(patched, entry._entry.Entry) and inspect.isfunction(original)
    assert (patched.__name__, patched.__qualname__, patched.__module__, patched.__doc__) == (
        original.__name__, original.__qualname__, original.__module__, original.__doc__)
    assert inspect.signature(patched) == inspect.signature(original)
    assert pickle.loads(pickle.dumps(patched)) is patched and copy.deepcopy(patched) is patched
    if isinstance(owner, type):  # a method: bound as the function was, looked up on the class or an instance
        assert getattr(owner, name) is patched
        model = Net(run.clock)
        instance = {nn.Module: model, torch.optim.Optimizer: ticking_sgd(model, run.clock),
                    torch.amp.GradScaler: torch.amp.GradScaler("cpu")}[owner]
        bound = getattr(instance, name)
        assert bound.__self__ is instance and bound.__func__ is patched
        assert inspect.signature(bound) == inspect.signature(getattr(original, "__get__")(instance))


def test_dynamo_traces_the_update_s_patched_functions_as_it_traces_torch_s(tmp_path: Path) -> None:
    """A compiled function that clips (through a reference taken beforehand) and zeroes the
    gradients, or copies tensors (`Tensor.to`, bound and unbound), compiles as without
    otel_train: the same frames, graphs, breaks and recompiles.
    (In a process of its own: once anything was compiled, detection never goes back.)"""
    from support.procs import run_python
    out = run_python(f"""
        import json
        import torch
        from torch import nn
        from torch._dynamo.utils import counters
        import otel_train
        from otel_train import detect
        from otel_train.detect import data, entry
        from otel_train.bench.switches import paused_detection

        data._accelerator_present = lambda: True  # as if a device were there: `Tensor.to` patched
        otel_train.init(run_id="twins", output_dir={str(tmp_path)!r})
        detect.install()
        next(iter(torch.utils.data.DataLoader(range(4), batch_size=2)))

        def compile_and_count():
            torch._dynamo.reset()
            counters.clear()
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            clip = torch.nn.utils.clip_grad_norm_

            @torch.compile(backend="eager")
            def clip_and_zero(x):
                model(x).sum().backward()
                norm = clip(model.parameters(), 1.0)
                model.zero_grad()
                return norm

            @torch.compile(backend="eager")
            def zero_grad():
                opt.zero_grad()

            @torch.compile(backend="eager")
            def copies(x):
                y = torch.Tensor.to(x, torch.float32)
                return model(y.to(torch.float32)).to(torch.float64).sum()

            for _ in range(3):
                clip_and_zero(torch.ones(2, 4))
                zero_grad()
                copies(torch.ones(2, 4, dtype=torch.float64))
            return {{group: sorted(counters[group].values())
                     for group in ("frames", "graph_break", "recompiles", "stats")}}

        with paused_detection():
            compile_and_count()  # warm-up: torch's first eager backward fills typing's caches (2.11
            plain = compile_and_count()  # counts those frames once, in whichever round runs first)
        assert type(torch.nn.utils.clip_grad_norm_) is entry._entry.Entry
        assert type(vars(torch.Tensor)["to"]) is entry._entry.Entry
        ours = compile_and_count()
        detect.uninstall()
        otel_train.shutdown()
        print("COUNTS " + json.dumps({{"plain": plain, "ours": ours}}))
    """, timeout=300).stdout
    counts = json.loads(out.split("COUNTS ", 1)[1].splitlines()[0])
    assert counts["ours"] == counts["plain"]
    assert len(counts["plain"]["graph_break"]) == 2  # at `.backward()` and at `Optimizer.zero_grad`, torch's own


def test_the_check_calls_the_users_function_alone_where_the_python_one_did(run: Run) -> None:
    """Under torch.export's tracing flag, or inside a backward (a backward from a tensor hook),
    `backward_run` is not called; otherwise it is, with the arguments as a tuple and a dict."""
    calls: list[tuple[Any, ...]] = []

    def recording(original: Any, args: Any, kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return original(*args, **kwargs)

    model = Net(run.clock)
    loss = model(torch.ones(2, 4)).sum()
    with pytest.MonkeyPatch.context() as patch:  # undone before the run stops (`backward_run` restored)
        patch.setattr(backward, "backward_run", recording)
        loss.backward(retain_graph=True)
        assert len(calls) == 1 and calls[0][0][0] is loss and calls[0][1]["inputs"] is None
        patch.setattr(torch.compiler, "_is_compiling_flag", True)
        loss.backward(retain_graph=True)
        patch.setattr(torch.compiler, "_is_compiling_flag", False)
        s.bwd_depth = 1
        try:
            loss.backward(retain_graph=True)
        finally:
            s.bwd_depth = 0
        assert len(calls) == 1
        loss.backward()
        assert len(calls) == 2
