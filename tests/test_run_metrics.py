"""The run-time metrics end to end: slow steps tagged on their span, goodput, MFU and the console
line, from the training process's records through the real worker and export pipeline.

In-process runs move a FakeClock by hand; the two subprocess runs (a real exporter process to
the suite's OTLP receiver, and 2 ranks under torchrun) assert names, units, attributes and
arithmetic, never how long anything took.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.harness import Harness, by_name
from support.otlp_receiver import OTLPReceiver
from support.procs import clean_env, launch_torchrun, run_python

import otel_train
from otel_train import semconv
from otel_train.analyze import goodput as gp

MS = 1_000_000


def _steps(h: Harness, times_ms: list[int], **attrs: object) -> None:
    for t in times_ms:
        with otel_train.step(**attrs):
            h.clock.advance(t * MS)


def test_a_planted_slow_step_is_tagged_slow_and_counted() -> None:
    h = Harness()
    h.clock.advance(500 * MS)  # start-up
    _steps(h, [10] * 15 + [60] + [10] * 4)  # step 15 is the planted one
    spans = by_name(h.finish(), semconv.SPAN_STEP)
    slow = [s.attributes[semconv.TRAIN_STEP] for s in spans
            if semconv.TAG_SLOW in (s.attributes.get(semconv.TRAIN_STEP_TAGS) or ())]
    assert slow == [15]
    assert [p.value for p in h.metric_points(semconv.METRIC_SLOW_STEPS)] == [1]


def test_goodput_metrics_add_up_to_the_wall_time_since_init() -> None:
    h = Harness()
    h.clock.advance(400 * MS)  # start-up: 400 ms
    for i in range(10):
        with otel_train.step():
            with otel_train.span(semconv.SPAN_DATA):
                h.clock.advance(3 * MS)
            h.clock.advance(7 * MS)
        if i == 4:
            with otel_train.span(semconv.SPAN_CHECKPOINT):
                h.clock.advance(50 * MS)
    h.finish()
    seconds = {p.attributes[semconv.METRIC_ATTR_CATEGORY]: p.value for p in h.metric_points(
        semconv.METRIC_GOODPUT_TIME)}
    assert set(seconds) == set(gp.CATEGORIES)
    assert seconds[gp.STARTUP] == pytest.approx(0.4) and seconds[gp.CHECKPOINT] == pytest.approx(0.05)
    assert seconds[gp.DATA] == pytest.approx(0.03) and seconds[gp.PRODUCTIVE] == pytest.approx(0.07)
    assert sum(seconds.values()) == pytest.approx(0.55)  # init to the last record: the whole window
    (ratio,) = h.metric_points(semconv.METRIC_GOODPUT)
    assert ratio.value == pytest.approx(0.07 / 0.55)


def test_mfu_of_each_step_from_its_own_flops_or_the_setting() -> None:
    h = Harness(peak_flops=1e12, flops_per_step=2e9)
    _steps(h, [10] * 3)
    _steps(h, [20], **{semconv.TRAIN_FLOPS: 8e9})  # the last step says its own
    h.finish()
    (point,) = h.metric_points(semconv.METRIC_MFU)
    assert point.value == pytest.approx(8e9 / 0.02 / 1e12)


def test_without_a_peak_there_is_no_mfu_and_no_console_line_by_default(capfd: pytest.CaptureFixture[str]) -> None:
    h = Harness(flops_per_step=2e9)  # the CPU: no peak FLOP/s unless OTEL_TRAIN_PEAK_FLOPS
    _steps(h, [10] * 12)
    h.finish()
    assert h.metric_points(semconv.METRIC_MFU) == []
    assert "otel_train: step" not in capfd.readouterr().err


# --- a real exporter process, to the suite's OTLP receiver --------------------------------------
SCRIPT = r"""
import json, sys, time, torch
import otel_train
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

started = time.time_ns()
otel_train.init()
import otel_train.auto  # detection: batch sizes, parameters
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(64, 8), nn.Flatten(), nn.Linear(8 * 16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randint(0, 64, (96, 16)), torch.randn(96, 1)), batch_size=4)
for i, (x, y) in enumerate(data):
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    if i == 12:
        torch.save(model.state_dict(), sys.argv[1])  # a checkpoint: a sibling, its own category
ended = time.time_ns()
print(json.dumps({"wall_s": (ended - started) / 1e9,
                  "parameters": sum(p.numel() for p in model.parameters())}))
"""


def test_metrics_reach_the_receiver_with_their_names_units_and_attributes(tmp_path: Path,
                                                                          fresh_receiver: OTLPReceiver) -> None:
    proc = run_python(SCRIPT, args=[str(tmp_path / "ckpt.pt")], env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": fresh_receiver.grpc_endpoint, "OTEL_TRAIN_RUN_ID": "metrics-e2e",
        "OTEL_TRAIN_PEAK_FLOPS": "1e12", "OTEL_METRIC_EXPORT_INTERVAL": "600000"})
    facts = json.loads(proc.stdout.splitlines()[-1])
    wanted = {semconv.METRIC_GOODPUT, semconv.METRIC_GOODPUT_TIME, semconv.METRIC_SLOW_STEPS, semconv.METRIC_MFU,
              semconv.METRIC_THROUGHPUT_TOKENS}
    metrics = {m["name"]: m for m in fresh_receiver.wait_for_metrics(lambda m: m["name"] in wanted,
                                                                      count=len(wanted))}
    assert {name: metrics[name]["unit"] for name in wanted} == {
        semconv.METRIC_GOODPUT: "1", semconv.METRIC_GOODPUT_TIME: "s", semconv.METRIC_SLOW_STEPS: "{step}",
        semconv.METRIC_MFU: "1", semconv.METRIC_THROUGHPUT_TOKENS: "{token}/s"}
    assert all(m["resource"][semconv.ML_RUN_ID] == "metrics-e2e" for m in metrics.values())
    seconds = {p["attributes"][semconv.METRIC_ATTR_CATEGORY]: p["value"]
               for p in metrics[semconv.METRIC_GOODPUT_TIME]["data_points"]}
    assert set(seconds) == set(gp.CATEGORIES)
    # The categories cover the run: from init to its last record, against the script's own clock.
    assert sum(seconds.values()) == pytest.approx(facts["wall_s"], rel=0.01)
    assert seconds[gp.CHECKPOINT] > 0 and seconds[gp.DATA] > 0 and seconds[gp.STARTUP] > 0

    # MFU of the last step: 6 x parameters x tokens (4 x 16 ids from the batch shape) / time / peak.
    spans = fresh_receiver.wait_for_spans(lambda s: s["name"] == semconv.SPAN_STEP, count=24)
    last = max(spans, key=lambda s: s["attributes"][semconv.TRAIN_STEP])["attributes"]
    assert (last[semconv.TRAIN_TOKENS], last[semconv.TRAIN_SAMPLES]) == (64, 4)
    (mfu,) = metrics[semconv.METRIC_MFU]["data_points"]
    assert mfu["value"] == pytest.approx(6 * facts["parameters"] * 64 / last[semconv.TRAIN_STEP_TIME_S] / 1e12)
    assert "otel_train: goodput " in proc.stderr and proc.stderr.count("otel_train: goodput") == 1
    assert "otel_train: step" not in proc.stderr  # the console summary is off by default


# --- 2 ranks under torchrun: the console line on rank 0 only -------------------------------------
DDP = r"""
import gc
import torch, torch.distributed as dist
import otel_train.auto
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(6):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
del model, opt  # before exit: tests/support/procs.py TORCH_EXIT_ABORT
gc.collect()
dist.destroy_process_group()
"""


def test_the_console_line_is_printed_by_rank_0_only(tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    logs = tmp_path / "logs"
    env = clean_env({"OTEL_TRAIN_CONSOLE_EVERY": "3", "OTEL_TRAIN_OUTPUT_DIR": str(tmp_path / "otel"),
                     "OTEL_TRAIN_RUN_ID": "console", "OMP_NUM_THREADS": "1"})
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--log-dir", str(logs),
            "--redirects", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "console",
            str(script)]

    def again() -> None:
        shutil.rmtree(logs)
        shutil.rmtree(tmp_path / "otel", ignore_errors=True)

    proc = launch_torchrun(lambda: subprocess.run(argv, env=env, cwd=tmp_path, timeout=240, capture_output=True,
                                                  text=True), again=again, logs=logs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stderr = {int(p.parent.name): p.read_text() for p in logs.rglob("stderr.log")}
    assert set(stderr) == {0, 1}
    lines = [line for line in stderr[0].splitlines() if line.startswith("otel_train: step ")]
    assert [line.split(" | ")[0] for line in lines] == ["otel_train: step 2", "otel_train: step 5"]
    assert all(" | data " in line and " | dropped 0" in line for line in lines)
    assert "otel_train: step " not in stderr[1]
    assert stderr[0].count("otel_train: goodput") == 1 and "otel_train: goodput" not in stderr[1]
