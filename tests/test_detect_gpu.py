"""Automatic detection on a real CUDA device: what test_detect.py checks with an accelerator faked.

Skipped as a whole without a GPU. A real loop (DataLoader, batches copied to the device, a
forward that returns the loss, backward, AdamW, zero_grad) runs under `otel_train.detect` with a
real clock, as `import otel_train.auto` would run it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from torch import nn  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset  # noqa: E402

import otel_train  # noqa: E402
from otel_train import detect as _detect  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.bench.switches import SyncCounter  # noqa: E402
from support.cuda import event_calls, started  # noqa: E402,F401 - event_calls: the fixture

PHASES = (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD, semconv.SPAN_OPTIMIZER)
WIDTH, BATCH = 4096, 4096


class Regressor(nn.Module):
    """Its forward returns the loss, so every kernel of a step runs inside one of its phases."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))

    def forward(self, x: Any, y: Any) -> Any:
        return nn.functional.mse_loss(self.body(x), y)


@pytest.fixture
def auto() -> Iterator[Any]:
    exporter = started("gpu-auto")
    _detect.install()
    try:
        yield exporter
    finally:
        _detect.uninstall()
        otel_train.shutdown(10.0)


def _setup(steps: int, pinned: bool) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = Regressor().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ds = TensorDataset(torch.randn(steps * BATCH, WIDTH), torch.randn(steps * BATCH, WIDTH))
    # A batch is fetched as one index (TensorDataset gathers it at once), so the GPU, not the
    # fetch, sets the pace and a phase's device time is its kernels.
    batches = BatchSampler(SequentialSampler(ds), BATCH, drop_last=False)
    return model, opt, DataLoader(ds, sampler=batches, batch_size=None, pin_memory=pinned)


def _step(model: Any, opt: Any, x: Any, y: Any, pinned: bool) -> None:
    x, y = x.to("cuda", non_blocking=pinned), y.to("cuda", non_blocking=pinned)
    model(x, y).backward()
    opt.step()
    opt.zero_grad()


def _spans(exporter: Any, name: str) -> list[Any]:
    return sorted((s for s in exporter.get_finished_spans() if s.name == name), key=lambda s: s.start_time)


def test_automatic_detection_adds_no_synchronisation(auto: Any, event_calls: Counter) -> None:
    """Pinned, non-blocking copies: no synchronising call of ours on the training thread or the
    worker, from the first step (discovery) to the shutdown; device events are read on the
    worker, once complete; the copy edge was armed at the first fetch."""
    model, opt, loader = _setup(8, pinned=True)
    training = threading.get_ident()
    torch.cuda.synchronize()  # CPU-GPU sync point: the test's own, before counting
    counter = SyncCounter()
    with counter.installed():
        counter.active = True
        for x, y in loader:
            _step(model, opt, x, y, pinned=True)
        armed = "to" in vars(torch.Tensor)
        _detect.uninstall()
        otel_train.shutdown(10.0)
        counter.active = False
    assert counter.total() == 0, counter.calls
    assert armed
    assert not [key for key in event_calls if key[0] == training]
    assert all(done for (_, method, done) in event_calls if method == "elapsed_time")  # never blocking
    forwards = _spans(auto, semconv.SPAN_FORWARD)
    assert len(forwards) == 8 and all(s.attributes[semconv.DEVICE_TYPE] == "cuda" for s in forwards)


def test_phases_carry_the_device_time_the_profiler_sees(auto: Any) -> None:
    from torch.profiler import ProfilerActivity, profile

    steps, warm = 12, 3
    model, opt, loader = _setup(steps, pinned=True)
    prof = profile(activities=[ProfilerActivity.CUDA])
    for i, (x, y) in enumerate(loader):
        if i == warm:
            torch.cuda.synchronize()  # CPU-GPU sync point: the test's own, before profiling
            prof.start()
        _step(model, opt, x, y, pinned=True)
    torch.cuda.synchronize()  # CPU-GPU sync point: the test's own
    prof.stop()
    _detect.uninstall()
    otel_train.shutdown(10.0)
    # The batches' copies are timed as part of train.data by the host only; phases hold kernels.
    kernel_s = sum(e.self_device_time_total for e in prof.key_averages()
                   if not e.key.startswith(("Memcpy", "Memset"))) / 1e6
    timed = [s for name in PHASES for s in _spans(auto, name)]
    assert len(timed) == 3 * steps
    assert all(s.attributes[semconv.DEVICE_TYPE] == "cuda" and s.attributes[semconv.DEVICE_DURATION_S] > 0
               for s in timed)
    first = sorted({s.attributes[semconv.TRAIN_STEP] for s in timed})[warm]
    device_s = sum(s.attributes[semconv.DEVICE_DURATION_S] for s in timed if s.attributes[semconv.TRAIN_STEP] >= first)
    assert device_s == pytest.approx(kernel_s, rel=0.05)
    forwards = _spans(auto, semconv.SPAN_FORWARD)[warm:]
    host_s = sum((s.end_time - s.start_time) / 1e9 for s in forwards)
    assert host_s < sum(s.attributes[semconv.DEVICE_DURATION_S] for s in forwards)  # the host only dispatches
    steps_ = _spans(auto, semconv.SPAN_STEP)
    assert len(steps_) == steps and all(s.attributes[semconv.TRAIN_STEP_TIME_S] > 0 for s in steps_)


def test_a_blocking_copy_of_the_batch_is_part_of_train_data(auto: Any) -> None:
    """Pageable memory: `.to("cuda")` holds the host until the copy is done; `train.data` ends
    after the batch's last copy, so each one holds at least its batch's copy time."""
    model, opt, loader = _setup(6, pinned=False)
    copies = []
    for x, y in loader:
        t0 = time.perf_counter_ns()
        x, y = x.to("cuda"), y.to("cuda")
        copies.append(time.perf_counter_ns() - t0)
        model(x, y).backward()
        opt.step()
        opt.zero_grad()
    _detect.uninstall()
    otel_train.shutdown(10.0)
    data = _spans(auto, semconv.SPAN_DATA)
    assert len(data) == len(copies) == 6
    assert all(s.end_time - s.start_time >= copy for s, copy in zip(data, copies))
    forwards = _spans(auto, semconv.SPAN_FORWARD)
    assert all(d.end_time <= f.start_time for d, f in zip(data, forwards))
