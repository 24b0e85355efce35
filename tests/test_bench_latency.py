"""`otel-train bench latency` and `otel_train.bench.latency`: statistics, timers (fake clock and
fake device events), leaving the model as found, synthetic batches, and the command end to end
(table, JSON, spans and metrics in the embedded default's files and at a real OTLP receiver)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from support.fake_device import MS, FakeDevice
from support.otlp_receiver import OTLPReceiver
from support.procs import REPO, run_python

from otel_train import semconv
from otel_train.bench import latency
from otel_train.bench.synthetic import SyntheticBatches
from otel_train.export.otlp_json import read_spans
from otel_train.record.clock import FakeClock

#: Where `latency_models` lives: the commands run there, as a user runs them beside their code.
SUPPORT = REPO / "tests" / "support"


def test_summary_statistics_match_numpys_definitions() -> None:
    stats = latency.summarize([4.0, 1.0, 10.0, 2.0, 3.0])
    assert stats["mean"] == 4.0
    assert stats["std"] == pytest.approx(math.sqrt(10.0))  # population std (ddof=0)
    assert (stats["p50"], stats["min"], stats["max"]) == (3.0, 1.0, 10.0)
    assert stats["p90"] == pytest.approx(7.6)  # numpy.percentile([...], 90), linear interpolation
    assert latency.summarize([2.5])["p90"] == 2.5


class _Clocked(torch.nn.Module):
    """A module whose forward takes `fwd_ns` of fake host time and backward `bwd_ns`; the first
    `slow_calls` forwards take 100 ms (a warm-up that must not be counted)."""

    def __init__(self, clock: FakeClock, fwd_ns: int, bwd_ns: int, slow_calls: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))
        self.clock, self.fwd_ns, self.slow_calls = clock, fwd_ns, slow_calls
        self.calls = 0
        clocked = self

        class Tick(torch.autograd.Function):
            @staticmethod
            def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
                return x.clone()

            @staticmethod
            def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
                clocked.clock.advance(bwd_ns)
                return grad

        self.tick = Tick

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.clock.advance(100 * MS if self.calls <= self.slow_calls else self.fwd_ns)
        return self.tick.apply(x.float() * self.w).sum(-1)


def test_host_timer_times_only_the_measured_batches() -> None:
    clock = FakeClock()
    model = _Clocked(clock, fwd_ns=2 * MS, bwd_ns=3 * MS, slow_calls=2)
    result = latency.measure_latency(model, SyntheticBatches.shaped((4, 3), torch.float32, torch.device("cpu")),
                                     warmup=2, iters=5, timer=latency.HostTimer(clock.perf_ns))
    assert model.calls == 2 * (2 + 5)  # warm-up and timed batches of both phases
    forward, both = result["phases"]["forward"], result["phases"]["forward_backward"]
    assert forward["latencies_s"] == [0.002] * 5  # the two 100 ms warm-up forwards are not in it
    assert both["latencies_s"] == pytest.approx([0.005] * 5)
    assert forward["latency_s"]["std"] == 0.0
    assert forward["samples_per_s"] == pytest.approx(4 / 0.002) and forward["tokens_per_s"] is None
    assert (result["timer"], result["warmup"], result["iters"]) == ("host_perf_counter", 2, 5)


def test_device_events_give_device_time_with_one_synchronisation() -> None:
    """Batches are queued back to back; each one's latency is the device time between its events
    (not host dispatch time), and the events are read with one synchronisation, at the end."""
    clock = FakeClock()
    device = FakeDevice(clock)
    # Device ms per forward; each phase's warm-up batch first (50 ms: the queue is backed up after it).
    work = iter([50, 4, 6, 5, 7, 50, 2, 3, 9, 8])

    class Queued(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            device.launch(next(work) * MS)  # returns at once, as a kernel launch does
            clock.advance(MS // 10)
            return (x * self.w).sum()

    result = latency.measure_latency(Queued(), SyntheticBatches.shaped((2, 2), torch.float32, torch.device("cpu")),
                                     warmup=1, iters=4, timer=latency.EventTimer(device.event))
    assert result["phases"]["forward"]["latencies_s"] == pytest.approx([0.004, 0.006, 0.005, 0.007])
    assert result["phases"]["forward_backward"]["latencies_s"] == pytest.approx([0.002, 0.003, 0.009, 0.008])
    assert device.syncs == [("MainThread", "Event.synchronize")]
    assert result["timer"] == "device_events"


def test_the_model_is_left_exactly_as_found() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5),
                                torch.nn.Linear(8, 1))
    model.eval()
    model[3].train()  # mixed modes must come back as they were
    model(torch.randn(5, 4)).sum().backward()  # a gradient being accumulated
    grads = [p.grad for p in model.parameters()]
    copies = [g.clone() for g in grads]
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    latency.measure_latency(model, SyntheticBatches.shaped((6, 4), torch.float32, torch.device("cpu")),
                            warmup=1, iters=2)
    assert [m.training for m in model.modules()] == [False, False, False, False, True]
    assert all(p.grad is g and torch.equal(g, c) for p, g, c in zip(model.parameters(), grads, copies))
    assert all(torch.equal(v, buffers[k]) for k, v in model.state_dict().items())  # BatchNorm stats too
    assert torch.equal(torch.get_rng_state(), rng)


def test_synthetic_batches_copy_structure_ranges_and_resize() -> None:
    example = {"input_ids": torch.tensor([[5, 9, 7], [6, 5, 8]]), "labels": torch.tensor([[-100, 3, 4], [2, -100, 1]]),
               "mask": torch.ones(2, 3, dtype=torch.bool), "pixels": (torch.zeros(2, 1, 4, dtype=torch.float64),),
               "name": "kept"}
    batches = SyntheticBatches.like(example, batch_size=5, seq_len=7)
    assert (batches.batch_size, batches.seq_len, batches.tokens) == (5, 7, 35)
    for _ in range(20):
        b = batches()
        assert b["input_ids"].shape == (5, 7) and b["input_ids"].dtype == torch.int64
        assert 5 <= int(b["input_ids"].min()) and int(b["input_ids"].max()) <= 9
        assert 0 <= int(b["labels"].min()) and int(b["labels"].max()) <= 4  # no -100
        assert b["mask"].all() and b["mask"].shape == (5, 7)
        assert b["pixels"][0].shape == (5, 1, 4) and b["pixels"][0].dtype == torch.float64
        assert b["name"] == "kept"
    assert [i["path"] for i in batches.inputs] == ["input_ids", "labels", "mask", "pixels.0"]
    vocab = SyntheticBatches.like(example, vocab_size=3)()
    assert int(vocab["input_ids"].max()) < 3 and int(vocab["input_ids"].min()) >= 0
    with pytest.raises(ValueError, match="seq_len was given"):
        SyntheticBatches.like(torch.randn(2, 3), seq_len=4)


def test_backward_runs_from_the_loss_else_the_first_tensor_that_needs_grad() -> None:
    w = torch.ones(2, requires_grad=True)
    loss = (w * 3).sum()
    assert latency.scalar_loss({"loss": loss, "logits": w * 2}) is loss
    assert latency.scalar_loss((torch.zeros(2), w * 2)).item() == 2.0
    with pytest.raises(ValueError, match="nothing to run backward from"):
        latency.scalar_loss((torch.zeros(2), "text"))


# --- the command -----------------------------------------------------------------------------
def _cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_python("from otel_train.cli import main; raise SystemExit(main())",
                      args=["bench", "latency", *args], cwd=SUPPORT,
                      env={"OTEL_TRAIN_OUTPUT_DIR": str(tmp_path / "otel"), "OTEL_SERVICE_NAME": "bench-test", **env})


def test_command_prints_the_table_and_writes_json_spans_and_metrics(tmp_path: Path) -> None:
    out = tmp_path / "out" / "latency.json"
    proc = _cli(tmp_path, "latency_models:tiny_lm", "--batch-size", "4", "--seq-len", "16", "--warmup", "2",
                "--iters", "5", "--json", str(out))
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Latency of latency_models:tiny_lm on synthetic batches (cpu, float32")
    assert lines[1] == "batch 4 x 16 tokens; 2 warm-up + 5 timed batches per phase"
    rows = {line.split()[0]: line for line in lines if line.startswith("forward")}
    assert set(rows) == {"forward", "forward+backward"} and all("±" in row for row in rows.values())

    result = json.loads(out.read_text())
    assert result["schema"] == latency.SCHEMA and result["model"] == "latency_models:tiny_lm"
    assert result["batch"] == {"batch_size": 4, "seq_len": 16, "tokens": 64,
                               "inputs": [{"path": "(batch)", "shape": [4, 16], "dtype": "int64"}]}
    for phase in ("forward", "forward_backward"):
        res = result["phases"][phase]
        assert len(res["latencies_s"]) == 5 and all(x > 0 for x in res["latencies_s"])
        assert res["latency_s"]["mean"] == pytest.approx(sum(res["latencies_s"]) / 5)
        assert res["tokens_per_s"] == pytest.approx(64 / res["latency_s"]["mean"])
        assert res["samples_per_s"] == pytest.approx(4 / res["latency_s"]["mean"])

    run_dir = next((tmp_path / "otel").iterdir())
    spans = list(read_spans(run_dir / "traces-rank0.jsonl"))
    names = [s["name"] for s in spans]
    assert (names.count("bench.latency"), names.count("bench.warmup"), names.count("bench.forward"),
            names.count("bench.forward_backward")) == (1, 2, 5, 5)
    assert not any(n.startswith("train.") for n in names)
    root = next(s for s in spans if s["name"] == "bench.latency")
    assert all(s["parent_span_id"] == root["span_id"] for s in spans if s is not root)
    assert root["attributes"].items() >= {"bench.model": "latency_models:tiny_lm", "bench.warmup": 2, "bench.iters": 5,
                                       "bench.samples": 4, "bench.tokens": 64, "bench.timer": "host_perf_counter",
                                       "device.type": "cpu"}.items()
    assert root["resource"]["service.name"] == "bench-test"
    result_event = next(e for e in root["events"] if e["name"] == "bench.result")
    assert result_event["attributes"]["forward.latency_s.mean"] == pytest.approx(
        result["phases"]["forward"]["latency_s"]["mean"])
    timed = sorted((s["attributes"]["bench.iteration"], s["attributes"]["bench.tokens"]) for s in spans
                   if s["name"] == "bench.forward_backward")
    assert timed == [(i, 64) for i in range(5)]
    assert {s["attributes"]["bench.phase"] for s in spans if s["name"] == "bench.warmup"} == \
        {"forward", "forward_backward"}

    metrics = _file_metrics(run_dir / "metrics-rank0.jsonl")
    histogram = metrics[semconv.METRIC_BENCH_LATENCY]
    assert histogram["unit"] == "s"
    points = {p["attributes"]["bench.phase"]: p for p in histogram["points"]}
    assert set(points) == {"forward", "forward_backward"}
    assert all(int(p["count"]) == 5 and p["attributes"]["device.type"] == "cpu" for p in points.values())
    assert float(points["forward"]["sum"]) == pytest.approx(sum(result["phases"]["forward"]["latencies_s"]))
    tokens = metrics[semconv.METRIC_BENCH_TOKENS]
    assert tokens["unit"] == "{token}/s" and len(tokens["points"]) == 2
    assert "bench.throughput.samples" in metrics
    assert "none dropped" in proc.stderr


def _file_metrics(path: Path) -> dict[str, dict]:
    """Metric name -> unit and data points (attributes flattened) from an OTLP JSON lines file."""
    found: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        for rm in json.loads(line)["resourceMetrics"]:
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    data = metric.get("histogram") or metric.get("gauge") or metric.get("sum")
                    points = [{**p, "attributes": {a["key"]: next(iter(a["value"].values()))
                                                   for a in p.get("attributes", [])}}
                              for p in data["dataPoints"]]
                    found[metric["name"]] = {"unit": metric.get("unit"), "points": points}
    return found


def test_command_sends_spans_and_metrics_to_an_otlp_receiver(tmp_path: Path, fresh_receiver: OTLPReceiver) -> None:
    _cli(tmp_path, "latency_models:lm_with_example", "--warmup", "1", "--iters", "3",
         OTEL_EXPORTER_OTLP_ENDPOINT=fresh_receiver.grpc_endpoint)
    spans = fresh_receiver.wait_for_spans(lambda s: s["name"].startswith("bench."), count=1 + 2 + 3 + 3)
    assert {s["name"] for s in spans} == {"bench.latency", "bench.warmup", "bench.forward", "bench.forward_backward"}
    metrics = fresh_receiver.wait_for_metrics(lambda m: m["name"] == "bench.latency")
    points = metrics[0]["data_points"]
    assert metrics[0]["unit"] == "s" and metrics[0]["scope"] == "otel_train"
    assert sorted(p["attributes"]["bench.phase"] for p in points) == ["forward", "forward_backward"]
    assert all(p["count"] == 3 for p in points)
    assert metrics[0]["resource"]["ml.rank"] == 0 and "ml.run.id" in metrics[0]["resource"]


@pytest.mark.parametrize(("args", "message"), [
    (["nocolon", "--seq-len", "4"], "factory 'nocolon': expected MODULE:FUNCTION"),
    (["no_such_module_xyz:f", "--seq-len", "4"], "no module named 'no_such_module_xyz'"),
    (["latency_models:nope", "--seq-len", "4"], "'latency_models' has no attribute 'nope'"),
    (["latency_models:not_a_module", "--seq-len", "4"], "returned a int; expected an nn.Module"),
    (["latency_models:broken", "--seq-len", "4"], "raised RuntimeError: weights not found"),
    (["latency_models:TinyLM.dump_patches", "--seq-len", "4"], "is a bool, not a callable"),
    (["latency_models:tiny_lm"], "say what a batch looks like"),
    (["latency_models:tiny_lm", "--seq-len", "0"], "--seq-len must be an integer >= 1 (got 0)"),
    (["latency_models:tiny_lm", "--seq-len", "4", "--iters", "0"], "--iters must be an integer >= 1"),
    (["latency_models:tiny_mlp", "--input-shape", "3,x"], "--input-shape '3,x': expected positive integers"),
    (["latency_models:tiny_mlp", "--input-shape", "3", "--seq-len", "2"], "give one"),
    (["latency_models:tiny_mlp", "--seq-len", "2"], "--vocab-size is needed"),
    (["latency_models:tiny_lm", "--seq-len", "4", "--device", "cuda:99"], "--device cuda:99"),
    (["latency_models:tiny_lm", "--seq-len", "4", "--device", "toaster"], "expected cpu, cuda, cuda:N, xpu or mps"),
    (["latency_models:tiny_lm", "--example", "/nonexistent/batch.pt"], "--example /nonexistent/batch.pt: no such file"),
    (["latency_models:frozen", "--input-shape", "4"], "no parameter that requires grad"),
    (["latency_models:tiny_mlp", "--input-shape", "3"],
     "the model failed on a synthetic batch ((batch) (8, 3) float32): RuntimeError: mat1 and mat2 shapes"),
])
def test_bad_input_gets_one_clear_message(args: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.chdir(SUPPORT)
    monkeypatch.syspath_prepend(str(SUPPORT))
    from otel_train.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "latency", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("otel-train bench latency: error: ") and message in last, err
    assert "Traceback" not in err
