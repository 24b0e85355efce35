"""End to end: a tiny training loop in a subprocess exports to the suite's real OTLP receiver."""

from __future__ import annotations

import glob
import json
import subprocess
import uuid

import pytest
from support.otlp_receiver import OTLPReceiver
from support.procs import clean_env, run_python

from otel_train import semconv
from otel_train.export.otlp_json import read_spans
from otel_train.wire.ids import step_span_id, trace_id_for

LOOP = """
    import sys, torch
    from torch import nn
    import otel_train
    steps = int(sys.argv[1])
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n in range(steps):
        with otel_train.step(epoch=0, **{"train.samples": 4}):
            for mb in range(2):
                with otel_train.span("train.data", **{"train.micro_batch": mb}):
                    x, y = torch.randn(4, 8), torch.randn(4, 1)
                with otel_train.span("train.forward", **{"train.micro_batch": mb}):
                    loss = nn.functional.mse_loss(model(x), y)
                with otel_train.span("train.backward", **{"train.micro_batch": mb}):
                    loss.backward()
            with otel_train.span("train.optimizer"):
                opt.step(); opt.zero_grad()
        if n == 1:
            with otel_train.span("train.checkpoint"):
                torch.save(model.state_dict(), "/dev/null")
    print("loop done", flush=True)
"""
PER_STEP = {"train.step": 1, "train.data": 2, "train.forward": 2, "train.backward": 2, "train.optimizer": 1}


def _env(receiver: OTLPReceiver, run_id: str, protocol: str = "grpc", **extra: str) -> dict[str, str]:
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_TRAIN_RUN_ID": run_id, "OTEL_SERVICE_NAME": "e2e-trainer",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-team=ml,x-run=" + run_id, **extra}


def _spans_of(receiver: OTLPReceiver, run_id: str, count: int) -> list[dict]:
    return receiver.wait_for_spans(lambda s: s["resource"].get(semconv.ML_RUN_ID) == run_id, count=count,
                                   timeout=60)


def _assert_trace_shape(spans: list[dict], run_id: str, steps: int, rank: int = 0) -> None:
    names = [s["name"] for s in spans]
    for name, per_step in PER_STEP.items():
        assert names.count(name) == per_step * steps, (name, names)
    assert names.count("train.checkpoint") == 1
    step_spans = {s["attributes"][semconv.TRAIN_STEP]: s for s in spans if s["name"] == "train.step"}
    assert sorted(step_spans) == list(range(steps))
    for n, step in step_spans.items():
        launch = step["resource"].get(semconv.ML_RUN_LAUNCH, "")
        assert step["trace_id"] == f"{trace_id_for(run_id, n):032x}"
        assert step["span_id"] == f"{step_span_id(run_id, n, rank, launch=launch):016x}"
        expected_parent = None if rank == 0 else f"{step_span_id(run_id, n, 0, launch=launch):016x}"
        assert step["parent_span_id"] == expected_parent
        assert step["attributes"][semconv.TRAIN_EPOCH] == 0
        assert step["attributes"][semconv.TRAIN_SAMPLES] == 4
        assert step["attributes"][semconv.TRAIN_STEP_TIME_S] > 0
    assert step_spans[1]["attributes"][semconv.TRAIN_STEP_TAGS] == ["checkpoint"]
    for span in spans:
        if span["name"] in PER_STEP and span["name"] != "train.step":
            step = step_spans[span["attributes"][semconv.TRAIN_STEP]]
            assert span["parent_span_id"] == step["span_id"] and span["trace_id"] == step["trace_id"]
            if span["name"] != "train.optimizer":
                assert span["attributes"][semconv.TRAIN_MICRO_BATCH] in (0, 1)
    (ckpt,) = [s for s in spans if s["name"] == "train.checkpoint"]
    # a sibling of its step: the step's parent (none on rank 0, rank 0's step span on the others)
    assert ckpt["parent_span_id"] == step_spans[1]["parent_span_id"] and ckpt["trace_id"] == step_spans[1]["trace_id"]
    resource = spans[0]["resource"]
    assert resource[semconv.SERVICE_NAME] == "e2e-trainer"
    assert resource[semconv.ML_RUN_ID] == run_id and resource[semconv.ML_RANK] == rank
    assert resource[semconv.ML_ROLE] == "trainer" and "process.pid" in resource and "host.name" in resource


@pytest.mark.parametrize("protocol,mode", [("grpc", "process"), ("http/protobuf", "process"), ("grpc", "thread")])
def test_training_loop_exports_the_trace_shape(fresh_receiver: OTLPReceiver, protocol: str, mode: str) -> None:
    run_id = f"e2e-{uuid.uuid4().hex[:8]}"
    steps = 4
    run_python(LOOP, args=[str(steps)], env=_env(fresh_receiver, run_id, protocol, OTEL_TRAIN_EXPORT_MODE=mode))
    spans = _spans_of(fresh_receiver, run_id, count=steps * 8 + 1)
    assert {s["transport"] for s in spans} == {"grpc" if protocol == "grpc" else "http"}
    _assert_trace_shape(spans, run_id, steps)
    assert fresh_receiver.saw_headers({"x-team": "ml", "x-run": run_id}, signal="traces")
    metrics = fresh_receiver.wait_for_metrics(lambda m: m["name"] == semconv.METRIC_STEP_DURATION and
                                              m["resource"].get(semconv.ML_RUN_ID) == run_id, timeout=30)
    assert sum(p["count"] for p in metrics[-1]["data_points"]) == steps
    assert metrics[-1]["unit"] == "s"


def test_two_ranks_share_one_trace_per_step(fresh_receiver: OTLPReceiver) -> None:
    run_id = f"ranks-{uuid.uuid4().hex[:8]}"
    procs = [subprocess.Popen(["python", "-c", __import__("textwrap").dedent(LOOP), "3"], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=clean_env({**_env(fresh_receiver, run_id), "RANK": str(r), "WORLD_SIZE": "2"}))
             for r in (0, 1)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    spans = _spans_of(fresh_receiver, run_id, count=2 * (3 * 8 + 1))
    for rank in (0, 1):
        _assert_trace_shape([s for s in spans if s["resource"][semconv.ML_RANK] == rank], run_id, 3, rank)


def test_embedded_default_writes_otlp_json_files(tmp_path) -> None:
    run_id = "file-run"
    result = run_python(LOOP, args=["3"], env={"OTEL_TRAIN_RUN_ID": run_id, "OTEL_SERVICE_NAME": "e2e-trainer"},
                        cwd=tmp_path)
    (traces,) = glob.glob(str(tmp_path / "otel-train" / run_id / "traces-rank0.jsonl"))
    assert str(traces).endswith("otel-train/file-run/traces-rank0.jsonl")
    spans = list(read_spans(traces))
    _assert_trace_shape(spans, run_id, 3)
    assert "spans exported to otel-train/file-run/traces-rank0.jsonl; none dropped" in result.stderr
    metrics = (tmp_path / "otel-train" / run_id / "metrics-rank0.jsonl").read_text()
    assert semconv.METRIC_STEP_DURATION in metrics and semconv.METRIC_PHASE_DURATION in metrics


def test_console_exporter_prints_spans_on_stdout() -> None:
    """The console gets what a file gets: OTLP JSON, one export request a line."""
    result = run_python(LOOP, args=["1"], env={"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"})
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    names = [s["name"] for doc in lines for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert "train.step" in names and "train.forward" in names
