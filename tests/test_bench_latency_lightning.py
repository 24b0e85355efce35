"""`TrainingLatencyCallback` on real Lightning fits: measured once between steps, unseen by step
detection, training bit-identical with and without it, barriers always reached, and a real
2-process DDP run (CPU, gloo, under torchrun)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.procs import REPO, launch_torchrun, run_python
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import otel_train
from otel_train import semconv
from otel_train.export.otlp_json import read_spans
from otel_train.lightning import OtelCallback, TrainingLatencyCallback


class Tiny(pl.LightningModule):
    """Dropout and BatchNorm: RNG and buffers the benchmark must leave as they were."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class NoForward(Tiny):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("no forward here")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)


def _fit(root: Path, callbacks: list[pl.Callback], model: pl.LightningModule | None = None,
         max_steps: int = 6) -> pl.LightningModule:
    """6 optimizer steps of 2 accumulated batches each: 12 of the 8 shuffled batches an epoch
    has, so an epoch boundary (a reshuffle, from the global RNG) comes after the benchmark."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    model = model or Tiny()
    trainer = pl.Trainer(max_steps=max_steps, accumulate_grad_batches=2, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(root), callbacks=[OtelCallback(), *callbacks])
    trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True))
    assert trainer.global_step == max_steps
    return model


@pytest.fixture
def spans_in_memory() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    otel_train.init(span_processors=[SimpleSpanProcessor(exporter)], run_id="latency-cb", traces_exporter="none",
                    metrics_exporter="none")
    return exporter


def test_measured_once_between_steps_and_unseen_by_step_detection(tmp_path: Path, spans_in_memory: InMemorySpanExporter,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    callback = TrainingLatencyCallback(start_step=3, warmup=1, iters=3)
    _fit(tmp_path, [callback])
    otel_train.shutdown(5.0)
    result = callback.result
    assert result is not None and result["measured_after_step"] == 3 and result["rank"] == 0
    assert result["batch"]["inputs"] == [{"path": "0", "shape": [8, 6], "dtype": "float32"},
                                         {"path": "1", "shape": [8, 1], "dtype": "float32"}]
    assert all(len(result["phases"][p]["latencies_s"]) == 3 for p in ("forward", "forward_backward"))
    assert json.loads((tmp_path / "latency" / "latency-rank0.json").read_text()) == result
    assert "Latency of Tiny after step 3 on synthetic batches" in capsys.readouterr().out

    spans = list(spans_in_memory.get_finished_spans())
    names = [s.name for s in spans]
    # The benchmark's 1 + 3 + 1 + 3 forwards are no training phases: 6 steps of 2 micro-batches.
    assert (names.count("train.step"), names.count("train.forward"), names.count("train.backward")) == (6, 12, 12)
    assert (names.count("bench.latency"), names.count("bench.forward"), names.count("bench.forward_backward")) == \
        (1, 3, 3)
    steps = {s.attributes["train.step"]: s for s in spans if s.name == "train.step"}
    bench = next(s for s in spans if s.name == "bench.latency")
    # A sibling of the step it follows (step index 2 ends with global_step 3): same trace, not inside it.
    assert bench.parent is None and bench.context.trace_id == steps[2].context.trace_id
    assert "bench" in steps[2].attributes["train.step.tags"]
    assert bench.attributes["bench.after_step"] == 3
    assert steps[2].end_time <= bench.start_time and bench.end_time <= steps[3].start_time
    # The next step's own time leaves the benchmark out.
    window_ns = steps[3].end_time - steps[2].end_time
    assert steps[3].attributes["train.step.time_s"] <= (window_ns - (bench.end_time - bench.start_time)) / 1e9 + 1e-6


def test_trained_weights_are_identical_with_and_without_the_callback(tmp_path: Path,
                                                                    spans_in_memory: InMemorySpanExporter) -> None:
    plain = _fit(tmp_path / "plain", [])
    callback = TrainingLatencyCallback(start_step=3, warmup=2, iters=3, print_table=False)
    measured = _fit(tmp_path / "measured", [callback])
    assert callback.result is not None

    class DrawsOnce(pl.Callback):
        """What a careless benchmark does: consumes the global RNG once, at the same point."""

        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: object,
                               batch: object, batch_idx: int) -> None:
            if batch_idx == 5:
                torch.rand(1)

    disturbed = _fit(tmp_path / "disturbed", [DrawsOnce()])
    expected = plain.state_dict()
    assert all(torch.equal(value, expected[key]) for key, value in measured.state_dict().items())
    # The comparison sees a single RNG draw (dropout masks and the reshuffle change).
    assert not all(torch.equal(value, expected[key]) for key, value in disturbed.state_dict().items())


def test_a_failing_benchmark_still_reaches_both_barriers_and_training_goes_on(
        tmp_path: Path, spans_in_memory: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    reached: list[str | None] = []
    monkeypatch.setattr(pl.strategies.SingleDeviceStrategy, "barrier", lambda self, name=None: reached.append(name))
    callback = TrainingLatencyCallback(start_step=2, warmup=1, iters=2)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        _fit(tmp_path, [callback], model=NoForward(), max_steps=4)
    assert callback.result is None
    assert [name for name in reached if name and name.startswith("otel_train")] == \
        ["otel_train.bench.latency.start", "otel_train.bench.latency.end"]
    assert "latency benchmark failed on rank 0 (NotImplementedError: no forward here); training goes on " \
           "(if the module has no usable forward, pass forward_fn=)" in caplog.text


def test_a_start_step_never_reached_is_said(tmp_path: Path, spans_in_memory: InMemorySpanExporter,
                                            caplog: pytest.LogCaptureFixture) -> None:
    callback = TrainingLatencyCallback(start_step=50)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        _fit(tmp_path, [callback], max_steps=2)
    assert callback.result is None
    assert "training ended at step 2, before start_step=50; no latency was measured" in caplog.text


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"iters": 0}, "TrainingLatencyCallback(iters=0): expected an integer >= 1"),
    ({"start_step": -1}, "TrainingLatencyCallback(start_step=-1): expected an integer >= 0"),
    ({"batch_size": 2.5}, "TrainingLatencyCallback(batch_size=2.5): expected an integer >= 1"),
])
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        TrainingLatencyCallback(**kwargs)
    assert str(info.value) == message


def test_ddp_two_processes_all_ranks_measure_between_barriers(tmp_path: Path) -> None:
    """Every rank measures its replica between the callback's barriers; the model's own
    all-reduce runs on both ranks together (rank 0 alone would hang on it); parameters agree."""
    proc = launch_torchrun(lambda: run_python(None, script="-m", args=[
        "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
        "--rdzv-id", "latency-ddp", str(REPO / "tests" / "support" / "scenarios" / "lightning_latency.py"), str(tmp_path),
        "--ddp"], env={"OTEL_TRAIN_OUTPUT_DIR": str(tmp_path / "otel")}, timeout=240, check=False),
        again=lambda: shutil.rmtree(tmp_path / "otel", ignore_errors=True))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((tmp_path / f"weights-rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["steps"], r["measured"]) for r in ranks] == [(0, 6, True), (1, 6, True)]
    assert ranks[0]["params"] == ranks[1]["params"]
    results = [json.loads((tmp_path / f"latency-rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"], r["measured_after_step"]) for r in results] == [(0, 2, 3), (1, 2, 3)]
    assert proc.stdout.count("Latency of Tiny after step 3") == 1  # the table: rank 0 only
    for rank in (0, 1):
        spans = list(read_spans(tmp_path / "otel" / "latency-ddp" / f"traces-rank{rank}.jsonl"))
        bench = [s for s in spans if s["name"] == "bench.latency"]
        steps = {s["attributes"]["train.step"]: s for s in spans if s["name"] == "train.step"}
        assert len(bench) == 1 and bench[0]["resource"]["ml.rank"] == rank
        assert bench[0]["trace_id"] == steps[2]["trace_id"] and "bench" in steps[2]["attributes"]["train.step.tags"]
        assert len(steps) == 6 and sum(s["name"] == "train.forward" for s in spans) == 6
        assert sum(s["name"] == semconv.SPAN_BENCH_FORWARD_BACKWARD for s in spans) == 3
