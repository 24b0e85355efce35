"""The accelerator code path on a CPU (`otel_train.bench.device_path`): the proxy device takes
exactly the path a GPU run takes, and the figure host noise cannot move, Python calls a step on
the training thread, holds the device path to the host path's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from otel_train.bench import device_path


def _child(variant: str, tmp_path, steps: int = 30) -> dict[str, float]:
    code = ("import json; from otel_train.bench.device_path import child; "
            f"print(json.dumps(child({variant!r}, {steps}, {str(tmp_path)!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_explicit_device_timing_adds_no_python_call_on_the_training_thread(tmp_path) -> None:
    host, dev = _child("explicit_host", tmp_path), _child("explicit_device", tmp_path)
    # forward, backward and optimizer: an event at entry and one at exit; the step: one at its end
    assert dev["record_per_step"] == 7
    assert dev["python_calls_per_step"] == host["python_calls_per_step"]


def test_automatic_device_timing_adds_python_calls_of_the_host_paths_order(tmp_path) -> None:
    host, dev = _child("auto_host", tmp_path, 64), _child("auto_device", tmp_path, 64)
    assert dev["record_per_step"] > 6  # its phases and step are device-timed (detection replays its notes
    # in batches of 32 steps, so a window's count is not exactly 7 or 8)
    # Until 2026-11-28 the device path added ~12 here (and ~5 more an event on CUDA, in torch).
    assert dev["python_calls_per_step"] - host["python_calls_per_step"] <= 3


def test_the_proxy_event_is_never_read_before_it_completes() -> None:
    proxy = device_path.ProxyDevice(lag_ns=10**9)
    start, end = proxy.event(), proxy.event()
    start.record()
    end.record()
    assert not end.query()
    with pytest.raises(RuntimeError, match="not yet complete"):
        start.elapsed_time(end)
    assert proxy.calls == {"create": 2, "record": 2, "query": 1, "elapsed_time": 1}
