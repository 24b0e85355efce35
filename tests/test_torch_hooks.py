"""Nothing of ours in the user's objects (otel_train.detect.torch_hooks, issue 26 #1).

A model trained under detection carries our forward slot (or, once torch.compile may trace,
our forward hooks) on its outermost module once discovery settles. Saved, pickled or
deep-copied, it must be byte for byte what it is without them, load without otel_train, and
come back with nothing of ours. Each test runs with both forms (`form`).
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.hooks import RemovableHandle  # noqa: E402

import otel_train  # noqa: E402
from otel_train import detect as _detect  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.detect import torch_hooks  # noqa: E402
from otel_train.detect.roots import roots  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from support.detect_loop import timed_by  # noqa: E402


MODEL = """
from torch import nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x):
        return self.body(x)
"""


class Scale:
    """A picklable forward pre-hook of the user's own."""

    def __call__(self, module: nn.Module, args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def model_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The model's class in a module of its own, importable where otel_train is not."""
    folder = tmp_path_factory.mktemp("user_model")
    (folder / "user_model.py").write_text(MODEL)
    sys.path.insert(0, str(folder))
    try:
        import user_model
        yield user_model
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("user_model", None)


@pytest.fixture(params=["slot", "hooks"])
def form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the roots are timed: their slot, or (as once torch.compile may trace) hooks."""
    if request.param == "hooks":
        monkeypatch.setattr(torch_hooks, "slot", lambda *args: None)
    return request.param


@pytest.fixture
def exporter(model_module: Any, form: str) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    otel_train.init(span_processors=[SimpleSpanProcessor(exporter)], export_mode="thread",
                    traces_exporter="none", metrics_exporter="none", flush_interval_ms=10)
    _detect.install()
    try:
        yield exporter
    finally:
        _detect.uninstall()
        otel_train.shutdown()


def _train(model: nn.Module, steps: int = 4) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _saved(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _hooked(exporter: InMemorySpanExporter, form: str) -> nn.Module:
    torch.manual_seed(0)
    model = sys.modules["user_model"].Model()
    _train(model)  # past discovery: the model itself carries our slot or hooks now
    assert model in roots.hooked and timed_by(model) == form
    return model


def _clean(model: nn.Module) -> bool:
    """Nothing of ours on the model or any module in it."""
    return all(timed_by(m) is None and "_compiled_call_impl" not in vars(m) for m in model.modules())


def test_saved_pickled_and_copied_models_are_byte_for_byte_the_plain_ones(exporter: InMemorySpanExporter, form: str) -> None:
    model = _hooked(exporter, form)
    # (a deep copy is saved, not pickled: a pickle names each storage by its address)
    hooked = {"torch.save": _saved(model), "pickle": pickle.dumps(model), "deepcopy": _saved(copy.deepcopy(model))}
    _detect.uninstall()  # every hook of ours off: the same model as it is without us
    assert _clean(model) and not model._forward_pre_hooks and not model._forward_hooks
    plain = {"torch.save": _saved(model), "pickle": pickle.dumps(model), "deepcopy": _saved(copy.deepcopy(model))}
    for kind in hooked:
        assert hooked[kind] == plain[kind], kind
        assert b"otel_train" not in hooked[kind], kind


def test_a_deep_copy_carries_no_hook_and_a_shallow_copy_shares_them_as_without_us(
        exporter: InMemorySpanExporter, form: str) -> None:
    model = _hooked(exporter, form)
    twin = copy.deepcopy(model)
    assert _clean(twin)
    assert not twin._forward_pre_hooks and not twin._forward_hooks and not twin._forward_hooks_always_called
    shallow = copy.copy(model)
    assert shallow._forward_pre_hooks is model._forward_pre_hooks  # as copy.copy does without us
    assert "_compiled_call_impl" not in vars(shallow)  # torch's own __getstate__ drops it, as ours does


def test_our_hooks_take_no_handle_number_so_the_users_are_the_plain_ones(exporter: InMemorySpanExporter, form: str) -> None:
    first = RemovableHandle.next_id
    model = _hooked(exporter, form)  # global hooks while discovering, then the model's own
    assert RemovableHandle.next_id == first
    handle = model.body[0].register_forward_pre_hook(Scale())  # the user's, after ours
    assert handle.id == first
    hooked = pickle.dumps(model)
    _detect.uninstall()
    assert pickle.dumps(model) == hooked  # the user's hook is pickled, ours is not, under the plain key


def test_pickling_a_model_is_no_checkpoint(exporter: InMemorySpanExporter, form: str) -> None:
    """torch pickles each tensor storage through torch.save: not a checkpoint, and no span."""
    model = _hooked(exporter, form)
    pickle.dumps(model)
    copy.deepcopy(model)
    torch.save(model.state_dict(), io.BytesIO())  # a real one, for contrast
    otel_train.shutdown()
    saves = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_CHECKPOINT]
    assert len(saves) == 1


LOADER = """
import json, sys
sys.modules["otel_train"] = None  # a process that cannot import otel_train
import torch
path, model_path = sys.argv[1], sys.argv[2]
sys.path.insert(0, model_path)
unsafe = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
model = torch.load(path, weights_only=False)
hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) + ("_compiled_call_impl" in vars(m))
            for m in model.modules())
print(json.dumps({"unsafe": unsafe, "hooks": hooks}))
"""


def test_a_model_saved_under_detection_loads_without_otel_train_and_with_no_hook(
        exporter: InMemorySpanExporter, form: str, model_module: Any, tmp_path: Path) -> None:
    model = _hooked(exporter, form)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    folder = str(Path(model_module.__file__).parent)
    proc = subprocess.run([sys.executable, "-c", LOADER, str(path), folder], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["hooks"] == 0
    # weights_only=True refuses exactly what it refuses in a plain save: the model's own classes.
    assert out["unsafe"] == sorted(["user_model.Model", "torch.nn.modules.activation.ReLU",
                                    "torch.nn.modules.container.Sequential", "torch.nn.modules.linear.Linear"])


def test_a_model_scripts_as_it_does_without_us_and_keeps_our_hooks(exporter: InMemorySpanExporter, form: str) -> None:
    """torch.jit.script compiles a module tree's hooks into the script module, and failed on
    ours; scripted under detection, the model gives the plain script, keeps our hooks in their
    place, and training goes on detected."""
    model = _hooked(exporter, form)

    def tables() -> list[list[tuple[Any, Any]]]:
        return [list(table.items()) for table in (model._forward_pre_hooks, model._forward_hooks,
                                                  model._forward_hooks_always_called)]

    before, slot = tables(), vars(model).get("_compiled_call_impl")
    assert all(torch_hooks.ours(dict(table)) for table in before) == (form == "hooks")
    assert torch_hooks.is_slot(slot) == (form == "slot")
    scripted = torch.jit.script(model)
    assert tables() == before and vars(model).get("_compiled_call_impl") is slot
    x = torch.randn(3, 4)
    assert torch.equal(scripted(x), model(x))
    with pytest.raises(torch.jit.frontend.NotSupportedError) as caught:  # no frame of ours in its traceback
        torch.jit.script(nn.Sequential(_Unscriptable()))
    assert not [f for f in traceback.extract_tb(caught.value.__traceback__) if "otel_train" in f.filename]
    _train(model, steps=2)
    _detect.uninstall()
    plain = torch.jit.script(model)
    assert str(plain.graph) == str(scripted.graph) and plain.code == scripted.code
    otel_train.shutdown()
    assert sum(span.name == semconv.SPAN_STEP for span in exporter.get_finished_spans()) == 6


class _Unscriptable(nn.Module):
    def forward(self, *xs: Any) -> Any:  # TorchScript takes no *args
        return xs


def test_uninstall_removes_the_pickling_filter_and_every_entry(exporter: InMemorySpanExporter, form: str) -> None:
    model = _hooked(exporter, form)
    assert "__reduce_ex__" in vars(nn.Module)
    _detect.uninstall()
    assert "__reduce_ex__" not in vars(nn.Module)
    assert not torch_hooks.ours(model._forward_pre_hooks) and not model._forward_pre_hooks and _clean(model)


def test_a_class_whose_getstate_keeps_the_dict_pickles_without_our_slot(exporter: InMemorySpanExporter,
                                                                        form: str) -> None:
    """torch's `Module.__getstate__` drops `_compiled_call_impl`; an RNN's own keeps the rest of
    `__dict__`, and our `__reduce_ex__` takes the slot out."""
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 4)
    opt = torch.optim.SGD(lstm.parameters(), lr=0.1)
    for _ in range(4):
        opt.zero_grad()
        lstm(torch.randn(3, 2, 4))[0].sum().backward()
        opt.step()
    assert timed_by(lstm) == form
    hooked = pickle.dumps(lstm)
    _detect.uninstall()
    assert b"otel_train" not in hooked and pickle.dumps(lstm) == hooked


def test_a_dict_copied_onto_another_module_times_only_the_root(exporter: InMemorySpanExporter, form: str) -> None:
    """`DataParallel`'s replicas are made by copying a module's `__dict__`, slot and all: the
    slot runs the module that calls it, and times only the root it was made for. (The copy
    shares the hook tables, whose hooks time it as they did before the slot.)"""
    model = _hooked(exporter, form)
    other = type(model).__new__(type(model))
    other.__dict__ = model.__dict__.copy()
    other._modules = {"body": nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))}
    x = torch.randn(2, 4)
    assert torch.equal(other(x), other.body(x)) and not torch.equal(other(x), model.body(x))
    _train(model, steps=2)
    otel_train.shutdown()
    forwards = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_FORWARD]
    assert len(forwards) == 4 + 2 + (2 if form == "hooks" else 0)  # the model's training forwards
    assert copy.copy(vars(model).get("_compiled_call_impl")) is None
