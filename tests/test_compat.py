"""One test per private access in `otel_train/_compat.py`: each fails, naming the access, on a
torch, Python or OpenTelemetry SDK that removed or changed it."""

from __future__ import annotations

import inspect
import multiprocessing
import multiprocessing.spawn
import sys
import warnings
from typing import Any

import pytest

from otel_train import _compat



@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


def test_sys_getframe_reads_the_callers_frame() -> None:
    def caller() -> object:
        return sys._getframe(1).f_code

    assert caller() is test_sys_getframe_reads_the_callers_frame.__code__, "sys._getframe is gone"


def test_a_spawned_child_is_inheriting_while_it_imports_its_parents_main() -> None:
    assert "_inheriting = True" in inspect.getsource(multiprocessing.spawn.prepare) or \
        "_inheriting = True" in inspect.getsource(multiprocessing.spawn), \
        "multiprocessing.spawn no longer sets BaseProcess._inheriting"
    process = multiprocessing.current_process()
    assert _compat.multiprocessing_inheriting(process) is False
    process._inheriting = True  # type: ignore[attr-defined]
    try:
        assert _compat.multiprocessing_inheriting(process) is True
    finally:
        del process._inheriting  # type: ignore[attr-defined]


def test_warnings_filters_mutated_exists_and_resets_the_registries() -> None:
    assert callable(getattr(warnings, "_filters_mutated", None)), "warnings._filters_mutated is gone"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")

        def warn() -> None:
            warnings.warn("once", UserWarning, stacklevel=1)

        warn()
        warn()  # "default": once per location
        _compat.warnings_filters_changed()
        warn()  # the registry was dropped: said again
    assert len(caught) == 2


def test_metric_readers_take_a_collect_callback_from_their_provider() -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData

    reader = InMemoryMetricReader()
    assert callable(getattr(reader, "_set_collect_callback", None)), "MetricReader._set_collect_callback is gone"
    seen = []

    def collect(reader_: object, timeout_millis: float = 10_000) -> MetricsData:
        seen.append(reader_)
        return MetricsData(resource_metrics=[])

    _compat.set_collect_callback(reader, collect)
    reader.get_metrics_data()
    assert seen == [reader]


def test_compile_checks_are_torchs_dynamo_check_and_export_flag(torch: Any) -> None:
    dynamo_compiling, tc = _compat.compile_checks()
    assert dynamo_compiling is torch.compiler.is_dynamo_compiling, "torch.compiler.is_dynamo_compiling is gone"
    assert tc is torch.compiler and tc._is_compiling_flag is False, "torch.compiler._is_compiling_flag is gone"
    assert dynamo_compiling() is False


def test_dynamo_counts_the_frames_it_compiled(torch: Any) -> None:
    """In a process of its own: once anything is compiled, detection never adds or removes its
    global hooks again in that process (`detect/compile.py`), which the tests after would see."""
    from support.procs import run_python

    run_python("""
        import torch
        from torch._dynamo import utils
        from otel_train import _compat
        assert isinstance(utils.counters["frames"], dict), "torch._dynamo.utils.counters['frames'] changed"
        assert not _compat.dynamo_frames_compiled()
        torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2))
        assert utils.counters["frames"]["total"] > 0 and _compat.dynamo_frames_compiled(), \
            "torch._dynamo.utils.counters['frames']['total'] no longer counts compiled frames"
    """, timeout=240)


def test_dynamo_can_be_told_to_skip_a_code_object(torch: Any) -> None:
    from torch._dynamo import eval_frame

    def ours(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    _compat.dynamo_set_code_skipped(eval_frame, ours.__code__, True)  # raises where the API changed
    _compat.dynamo_set_code_skipped(eval_frame, ours.__code__, False)


def test_global_forward_hook_tables_are_the_ones_torch_calls(torch: Any) -> None:
    pre_hooks, hooks, always = _compat.global_forward_hook_tables()
    handles = (torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None),
               torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None, always_call=True))
    try:
        assert handles[0].id in pre_hooks and handles[1].id in hooks and handles[1].id in always, \
            "torch.nn.modules.module._global_forward_*hooks changed"
    finally:
        for handle in handles:
            handle.remove()


def test_global_optimizer_hook_tables_are_the_ones_torch_calls(torch: Any) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    pre_hooks, post_hooks = _compat.global_optimizer_hook_tables()
    handles = (register_optimizer_step_pre_hook(lambda o, a, k: None),
               register_optimizer_step_post_hook(lambda o, a, k: None))
    try:
        assert handles[0].id in pre_hooks and handles[1].id in post_hooks, \
            "torch.optim.optimizer._global_optimizer_*_hooks changed"
    finally:
        for handle in handles:
            handle.remove()


def test_a_modules_own_hook_tables_have_their_names(torch: Any) -> None:
    module = torch.nn.Linear(2, 2)
    handle = module.register_forward_hook(lambda m, a, o: None, always_call=True)
    try:
        tables = [getattr(module, name) for name in _compat.MODULE_HOOK_TABLES]
        assert handle.id in tables[1] and handle.id in tables[2] and tables[0] == {}, \
            f"torch.nn.Module's {_compat.MODULE_HOOK_TABLES} changed"
    finally:
        handle.remove()


def test_module_call_runs_the_forward_slot_where_an_instance_has_one(torch: Any) -> None:
    assert _compat.module_call_with_slot() is torch.nn.Module.__call__, \
        f"torch.nn.Module has no {_compat.FORWARD_SLOT}"
    module = torch.nn.Linear(2, 2)
    calls = []
    vars(module)[_compat.FORWARD_SLOT] = lambda *a, **k: calls.append(a) or "slot"
    assert module(torch.ones(2)) == "slot" and len(calls) == 1, f"Module.__call__ ignores {_compat.FORWARD_SLOT}"


def test_every_module_call_runs_in_call_impls_frame(torch: Any) -> None:
    code = _compat.call_impl_code()
    found = []

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code is not code:
                frame = frame.f_back
            found.append(frame is not None)
            return x

    Probe()(torch.ones(1))
    assert found == [True], "torch.nn.Module._call_impl no longer runs each module call"


def test_dataloader_iterators_share_one_base_next(torch: Any) -> None:
    base = _compat.dataloader_iter_class()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 1)), batch_size=2)
    iterator = iter(loader)
    assert isinstance(iterator, base) and type(iterator).__next__ is base.__next__, \
        "torch.utils.data.dataloader._BaseDataLoaderIter.__next__ is not what iterators run"


def test_the_instrumented_librarys_floor_is_the_extras() -> None:
    """`opentelemetry-instrument` skips the instrumentor below `_instruments`: the same floor as the
    `torch` extra, the oldest torch tested (docs/compatibility.md)."""
    import tomllib
    from pathlib import Path

    from otel_train.instrumentation import _instruments

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    (extra,) = project["optional-dependencies"]["torch"]
    assert extra.replace(" ", "") == _instruments[0].replace(" ", "")
    assert project["requires-python"] == ">=3.11"  # the C extensions' frame API (docs/compatibility.md)


def test_a_process_has_its_identity_and_its_target() -> None:
    process = multiprocessing.Process(target=print)
    assert _compat.process_target(process) is print, "multiprocessing's BaseProcess._target is gone"
    assert len(_compat.multiprocessing_identity(process)) == 1, "multiprocessing's BaseProcess._identity changed"
    assert _compat.multiprocessing_identity(multiprocessing.current_process()) == ()


def test_a_module_is_initializing_while_it_runs(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "compat_probe.py").write_text(
        "import sys\nfrom otel_train import _compat\nDURING = _compat.module_initializing(sys.modules[__name__])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import compat_probe  # type: ignore[import-not-found]

    assert compat_probe.DURING is True, "ModuleSpec._initializing is no longer set while a module runs"
    assert _compat.module_initializing(compat_probe) is False


def test_a_readers_temporality_preferences_are_where_the_sdk_keeps_them() -> None:
    from opentelemetry.sdk.metrics import Histogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

    reader = InMemoryMetricReader(preferred_temporality={Histogram: AggregationTemporality.DELTA})
    by_name = {cls.__name__.lstrip("_"): t for cls, t in _compat.reader_temporalities(reader).items()}
    assert Histogram.__name__ == "Histogram" and by_name.get("Histogram") is AggregationTemporality.DELTA, \
        "MetricReader._instrument_class_temporality changed"  # keyed by the SDK's private _Histogram


def test_the_cuda_capture_check_and_the_xpu_build_flag(torch: Any) -> None:
    assert _compat.cuda_capturing_check(torch) is torch._C._cuda_isCurrentStreamCapturing, \
        "torch._C._cuda_isCurrentStreamCapturing is gone"
    assert callable(getattr(torch.xpu, "_is_compiled", None)), "torch.xpu._is_compiled is gone"
    assert _compat.xpu_compiled(torch.xpu) is torch.xpu._is_compiled()
