"""End to end: unmodified training scripts (tests/support/scenarios/) run instrumented in subprocesses
(`python -m otel_train.run`, `import otel_train.auto`, `opentelemetry-instrument`, torchrun) and
export to the suite's real OTLP receiver; each test asserts the exact span tree of every step.

All scenario processes start together when the first test of this module asks for one (they
take a few seconds each, mostly importing torch, on 2 cores), each with its own run id; a test
then waits for its own and filters the received spans by `ml.run.id`.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from support.otlp_receiver import OTLPReceiver  # noqa: E402
from support.procs import REPO, clean_env  # noqa: E402
from support.span_tree import Tree, check_invariants, plain_tags, tree  # noqa: E402

from otel_train import semconv  # noqa: E402

SCENARIOS = Path(__file__).resolve().parent / "support" / "scenarios"
DATA, FWD, BWD, OPT, COLL, ZG = "data", "forward", "backward", "optimizer", "collective", "zero_grad"
WAIT_S = 420.0


MAX_RUNNING = 4  # scenario processes at a time: enough to keep 2 cores busy, little memory


@dataclass
class Launched:
    """One scenario process: queued, then run to completion by one of the launcher threads."""

    name: str
    run_id: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    outcome: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its SCENARIO line
    parsed: bool = False

    def run(self) -> None:
        try:
            with open(self.log, "wb") as out:
                self.proc = subprocess.Popen(self.argv, env=self.env, cwd=str(self.log.parent), stdout=out,
                                             stderr=subprocess.STDOUT)
            self.proc.wait()
        finally:
            self.done.set()

    def wait(self) -> Launched:
        assert self.done.wait(WAIT_S), f"{self.name} did not finish in {WAIT_S:.0f} s"
        if not self.parsed:
            self.parsed = True
            text = self.log.read_text(errors="replace")
            assert self.proc is not None and self.proc.returncode == 0, \
                f"{self.name} exited {self.proc and self.proc.returncode}:\n{text[-6000:]}"
            for line in text.splitlines():
                if "SCENARIO " in line:  # torchrun interleaves its ranks' lines
                    for part in line.split("SCENARIO ")[1:]:
                        result = json.loads(part.strip())
                        self.outcome[result.get("rank", 0)] = result
        return self

    @property
    def steps(self) -> int:
        return self.outcome[0]["steps"]


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


def _scenario(receiver: OTLPReceiver, tmp: Path, name: str, argv: list[str], **env: str) -> Launched:
    run_id = f"{name}-{uuid.uuid4().hex[:8]}"
    environ = clean_env({
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRAIN_RUN_ID": run_id,
        "OTEL_TRAIN_FLUSH_INTERVAL_MS": "100", "OTEL_METRIC_EXPORT_INTERVAL": "60000",
        "OTEL_SERVICE_NAME": "auto-e2e", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore", **env})
    return Launched(name, run_id, [a.replace("{run_id}", run_id) for a in argv], environ, tmp / f"{name}.log")


def _launch_all(runs: list[Launched], stop: threading.Event) -> list[threading.Thread]:
    todo: queue.Queue[Launched] = queue.Queue()
    for run in runs:
        todo.put(run)

    def worker() -> None:
        while not stop.is_set():
            try:
                run = todo.get_nowait()
            except queue.Empty:
                return
            run.run()

    threads = [threading.Thread(target=worker, name=f"scenario-launcher-{i}", daemon=True)
               for i in range(MAX_RUNNING)]
    for thread in threads:
        thread.start()
    return threads


# The callbacks used by hand, without automatic instrumentation: they install the torch-level
# detection for the run and remove it afterwards.
LIGHTNING_EXPLICIT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import lightning.pytorch as pl, torch
from torch.nn.modules import module
from torch.utils.data import DataLoader, TensorDataset
from lightning_fit import Tiny
from otel_train import detect as _detect
from otel_train.lightning import OtelCallback
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, callbacks=[OtelCallback()],
                     default_root_dir=sys.argv[2])
trainer.fit(Tiny(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=16))
print("SCENARIO " + json.dumps({"steps": trainer.global_step, "installed_after": _detect.installed(),
                                "hooks_after": len(module._global_forward_pre_hooks)}))
"""
HF_EXPLICIT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from torch.nn.modules import module
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from hf_trainer import Tokens
from otel_train import detect as _detect
from otel_train.hf import OtelTrainerCallback
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
args = TrainingArguments(output_dir=sys.argv[2], per_device_train_batch_size=4, max_steps=3, eval_strategy="no",
                         save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True,
                         disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(24), callbacks=[OtelTrainerCallback()])
trainer.train()
print("SCENARIO " + json.dumps({"steps": trainer.state.global_step, "installed_after": _detect.installed(),
                                "hooks_after": len(module._global_forward_pre_hooks)}))
"""


def _run_module(script: str, *args: str) -> list[str]:
    return _python("-m", "otel_train.run", str(SCENARIOS / script), *args)


@pytest.fixture(scope="module")
def launched(otlp_receiver: OTLPReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Launched]]:
    tmp = tmp_path_factory.mktemp("auto_e2e")
    instrument = Path(sys.executable).parent / "opentelemetry-instrument"
    runs: dict[str, Launched] = {}

    def add(name: str, argv: list[str], **env: str) -> None:
        (tmp / name).mkdir()
        runs[name] = _scenario(otlp_receiver, tmp / name, name, argv, **env)

    # The slowest first: torch.compile (twice, to compare), the frameworks, torchrun.
    # Each compiled run gets its own empty inductor cache: Dynamo's frame counters differ
    # between a cold and a warm cache, and the two runs of a pair start together.
    def cold(name: str) -> dict[str, str]:
        return {"TORCHINDUCTOR_CACHE_DIR": str(tmp / name / "inductor-cache")}

    add("compiled", _run_module("compiled.py"), **cold("compiled"))
    add("compiled_plain", _python(str(SCENARIOS / "compiled.py")), **cold("compiled_plain"))
    add("compiled_step", _run_module("compiled.py", "step"), **cold("compiled_step"))
    add("compiled_step_plain", _python(str(SCENARIOS / "compiled.py"), "step"), **cold("compiled_step_plain"))
    add("lightning", _run_module("lightning_fit.py", "."))
    add("hf", _run_module("hf_trainer.py", "."))
    # (not --standalone: it would make up its own rendezvous id, which becomes ml.run.id)
    add("torchrun", _python("-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                            "--rdzv-endpoint", "localhost:0", "--rdzv-id", "{run_id}",
                            "-m", "otel_train.run", str(SCENARIOS / "collectives.py")))
    add("lightning_explicit", _python("-c", LIGHTNING_EXPLICIT, str(SCENARIOS), "."))
    add("hf_explicit", _python("-c", HF_EXPLICIT, str(SCENARIOS), "."))
    add("workers", _python(str(SCENARIOS / "workers_auto.py")))
    add("plain", _run_module("plain_loop.py"))
    add("grad_accum", _run_module("grad_accum.py"))
    add("amp", _run_module("amp_scaler.py"))
    add("manual_sgd", _run_module("manual_sgd.py"))
    add("eval", _run_module("eval_every_k.py"))
    add("checkpoint", _run_module("checkpoint_every_k.py", "."))
    add("gan", _run_module("gan.py"))
    add("collectives", _run_module("collectives.py"))
    if instrument.exists():
        add("otel_instrument", [str(instrument), sys.executable, str(SCENARIOS / "plain_loop.py")])
    add("example", _python(str(REPO / "examples" / "auto_plain.py"), "--epochs", "1", "--out", "."))
    stop = threading.Event()
    threads = _launch_all(list(runs.values()), stop)
    yield runs
    stop.set()
    for run in runs.values():
        if run.proc is not None and run.proc.poll() is None:
            run.proc.kill()
    for thread in threads:
        thread.join(timeout=WAIT_S)


def _tree(receiver: OTLPReceiver, run: Launched, ranks: int = 1, rank: int = 0) -> Tree:
    run.wait()
    mine = [s for s in receiver.spans() if s["resource"].get(semconv.ML_RUN_ID) == run.run_id]
    steps = sum(run.outcome[r]["steps"] for r in range(ranks))
    received = [s for s in mine if s["name"] == semconv.SPAN_STEP]
    # Steps run == train.step spans received (the scripts count their own optimizer updates).
    assert len(received) == steps, f"{run.name}: {steps} steps run, {len(received)} train.step spans"
    print(f"FIGURE {run.name}: steps run {steps}, train.step spans received {len(received)} ({ranks} rank(s))")
    t = tree([s for s in mine if s["resource"].get(semconv.ML_RANK) == rank])
    check_invariants(t, times=False)  # host clocks of two drains may differ by microseconds
    return t


def _shapes(t: Tree) -> list[list[tuple[str, int | None]]]:
    return [view.shape() for view in t.steps.values()]


def _sibling_steps(t: Tree, name: str) -> list[int]:
    return [s["attributes"].get(semconv.TRAIN_STEP) for s in t.siblings_named(name)]


def _tags(t: Tree) -> list[list[str]]:
    return [sorted(plain_tags(view)) for view in t.steps.values()]


PLAIN = [(DATA, 0), (ZG, None), (FWD, 0), (BWD, 0), (OPT, None)]  # zero_grad; forward; backward; step


def test_plain_loop_under_otel_train_run(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["plain"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 8
    assert _shapes(t) == [PLAIN] * 8
    assert [v.attrs[semconv.TRAIN_EPOCH] for v in t.steps.values()] == [0] * 4 + [1] * 4
    assert all(v.attrs[semconv.TRAIN_MICRO_BATCHES] == 1 for v in t.steps.values())
    assert _tags(t) == [[]] * 8 and t.others == []


def test_plain_loop_under_opentelemetry_instrument(otlp_receiver: OTLPReceiver,
                                                   launched: dict[str, Launched]) -> None:
    if "otel_instrument" not in launched:
        pytest.fail("opentelemetry-instrument is not installed next to this python")
    run = launched["otel_instrument"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 8
    assert _shapes(t) == [PLAIN] * 8


def test_gradient_accumulation_4(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["grad_accum"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 4
    micro = [p for k in range(4) for p in ((DATA, k), (FWD, k), (BWD, k))]
    assert _shapes(t) == [micro + [(OPT, None)]] * 4  # clip_grad_norm_, step, zero_grad: one phase
    assert {tuple(v.children[-1]["attributes"][semconv.TRAIN_OPTIMIZER_CALLS]) for v in t.steps.values()} == {
        ("clip_grad_norm_", "step", "zero_grad")}
    assert all(v.attrs[semconv.TRAIN_MICRO_BATCHES] == 4 for v in t.steps.values())


def test_grad_scaler_skipped_updates_are_still_steps(otlp_receiver: OTLPReceiver,
                                                     launched: dict[str, Launched]) -> None:
    run = launched["amp"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 8 and run.outcome[0]["skipped"] == [0, 3]  # the scaler skipped opt.step() twice
    # clip_grad_norm_, scaler.step (with opt.step() inside when not skipped), zero_grad: one phase
    assert _shapes(t) == [[(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)]] * 8
    assert {tuple(v.children[-1]["attributes"][semconv.TRAIN_OPTIMIZER_CALLS]) for v in t.steps.values()} == {
        ("clip_grad_norm_", "step", "zero_grad")}
    assert all(v.attrs[semconv.TRAIN_MICRO_BATCHES] == 1 for v in t.steps.values())


def test_manual_sgd_without_optimizer(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["manual_sgd"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 6
    assert _shapes(t) == [[(DATA, 0), (FWD, 0), (BWD, 0)]] * 6
    assert [v.attrs[semconv.TRAIN_EPOCH] for v in t.steps.values()] == [0] * 3 + [1] * 3


def test_eval_every_k_steps(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["eval"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 8
    assert _shapes(t) == [[(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)]] * 8
    assert _sibling_steps(t, semconv.SPAN_EVAL) == run.outcome[0]["eval_after"] == [2, 5, 7]
    assert _tags(t) == [["eval"] if n in (2, 5, 7) else [] for n in range(8)]


def test_checkpoint_every_k_steps(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["checkpoint"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 8
    assert _shapes(t) == [PLAIN] * 8
    assert _sibling_steps(t, semconv.SPAN_CHECKPOINT) == run.outcome[0]["checkpoint_after"] == [2, 5, 7]
    assert _tags(t) == [["checkpoint"] if n in (2, 5, 7) else [] for n in range(8)]


def test_gan_two_optimizers(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["gan"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 8
    # G(z), D(real), D(fake); D: zero_grad, backward, step; D(fake) for G: zero_grad, backward, step.
    gan = [(DATA, 0), (FWD, 0), (FWD, 0), (FWD, 0), (ZG, None), (BWD, 0), (OPT, None),
           (FWD, 1), (ZG, None), (BWD, 1), (OPT, None)]
    assert _shapes(t) == [gan] * 8
    assert all(v.attrs[semconv.TRAIN_MICRO_BATCHES] == 2 for v in t.steps.values())


def test_torch_compile_without_graph_breaks_or_recompiles(otlp_receiver: OTLPReceiver,
                                                          launched: dict[str, Launched]) -> None:
    run, plain = launched["compiled"], launched["compiled_plain"].wait()
    t = _tree(otlp_receiver, run)
    assert run.steps == plain.steps == 6
    assert _shapes(t) == [[(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)]] * 6
    instrumented, baseline = run.outcome[0]["compile"], plain.outcome[0]["compile"]
    assert instrumented == baseline, f"instrumented {instrumented} != plain {baseline}"
    assert instrumented["graph_break"] == {} and instrumented["recompiles"] == {}
    assert [s for s in otlp_receiver.spans() if s["resource"].get(semconv.ML_RUN_ID) == plain.run_id] == []


def test_compiled_step_function_keeps_its_graphs_and_breaks(otlp_receiver: OTLPReceiver,
                                                            launched: dict[str, Launched]) -> None:
    # A compiled function calls the patched backward, clip_grad_norm_ and zero_grad: Dynamo
    # inlines them where it traces and breaks the graph only where torch itself does. (With
    # wrapt wrappers there, Dynamo failed on its own guard: "Guard failed on the same frame".)
    run, plain = launched["compiled_step"], launched["compiled_step_plain"].wait()
    t = _tree(otlp_receiver, run)
    assert run.steps == plain.steps == 6
    instrumented, baseline = dict(run.outcome[0]["compile"]), dict(plain.outcome[0]["compile"])
    # The break at zero_grad is "call" of a skipped function for us, "inline" without us.
    assert len(instrumented.pop("graph_break")) == len(baseline.pop("graph_break")) == 2
    assert instrumented == baseline, f"instrumented {instrumented} != plain {baseline}"
    assert instrumented["graph_breaks"] == 2 and instrumented["recompiles"] == {}
    # Forward and clipping run inside compiled graphs, unseen; what runs eagerly is timed:
    # the backward at the graph break, the optimizer step and the zero_grad after it (one phase).
    assert _shapes(t) == [[(DATA, 0), (BWD, 0), (OPT, None)]] * 6


def test_dataloader_workers_fork_and_spawn_are_not_trainers(otlp_receiver: OTLPReceiver,
                                                            launched: dict[str, Launched]) -> None:
    run = launched["workers"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 8
    assert _shapes(t) == [PLAIN] * 8
    # Each loader is a new pass over the data: an epoch as far as anyone can tell.
    assert [v.attrs[semconv.TRAIN_EPOCH] for v in t.steps.values()] == [0] * 4 + [1] * 4
    mine = [s for s in otlp_receiver.spans() if s["resource"].get(semconv.ML_RUN_ID) == run.run_id]
    assert {s["resource"].get("process.pid") for s in mine} == {run.outcome[0]["pid"]}
    assert len({s["resource"].get(semconv.SERVICE_INSTANCE_ID) for s in mine}) == 1


def test_collectives_carry_op_bytes_and_group_size(otlp_receiver: OTLPReceiver,
                                                   launched: dict[str, Launched]) -> None:
    run = launched["collectives"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 8
    per_step = [(DATA, 0), (ZG, None), (FWD, 0), (BWD, 0)] + [(COLL, None)] * 4 + [(OPT, None), (COLL, None)]
    assert _shapes(t) == [per_step] * 8
    grads = list(run.outcome[0]["grad_bytes"].values())
    for view in t.steps.values():
        colls = [c["attributes"] for c in view.children if c["name"] == semconv.SPAN_COLLECTIVE]
        assert [c[semconv.COMM_OP] for c in colls] == ["all_reduce"] * 5
        assert [c[semconv.COMM_BYTES] for c in colls] == grads + [4]  # the gradients, then the loss
        assert {c[semconv.COMM_GROUP_SIZE] for c in colls} == {1}
    barrier = [s for s in t.others if s["name"] == semconv.SPAN_COLLECTIVE]
    assert [b["attributes"][semconv.COMM_OP] for b in barrier] == ["barrier"]  # before the first step


def test_torchrun_two_ranks_share_step_traces(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["torchrun"]
    trees = [_tree(otlp_receiver, run, ranks=2, rank=rank) for rank in (0, 1)]
    assert run.outcome[0]["steps"] == run.outcome[1]["steps"] == 4
    per_step = [(DATA, 0), (ZG, None), (FWD, 0), (BWD, 0)] + [(COLL, None)] * 4 + [(OPT, None), (COLL, None)]
    for t in trees:
        assert _shapes(t) == [per_step] * 4
        for view in t.steps.values():
            assert {c["attributes"][semconv.COMM_GROUP_SIZE] for c in view.children
                    if c["name"] == semconv.SPAN_COLLECTIVE} == {2}
    for n in range(4):
        root, child = trees[0].steps[n].span, trees[1].steps[n].span
        assert root["parent_span_id"] is None and child["parent_span_id"] == root["span_id"]
        assert root["trace_id"] == child["trace_id"]


def test_lightning_trainer(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["lightning"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 8
    for view in t.steps.values():
        # Lightning runs forward and backward inside optimizer.step(closure), evaluating it
        # once: they are the step's micro-batch, not the update. Before validation it zeroes the
        # gradients once more, from a hook of its own: a zero_grad of its own, not the update's.
        # A zero_grad Lightning makes before a step's batch is fetched (from its own loop, not
        # the update) is a train.zero_grad at the start of that step (docs/step-semantics.md).
        shape = view.shape()
        if shape[0] == (ZG, None):
            shape = shape[1:]
        assert shape[:4] == [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)], shape
        assert set(shape[4:]) <= {(ZG, None)}, shape
    assert [v.attrs[semconv.TRAIN_EPOCH] for v in t.steps.values()] == [0] * 4 + [1] * 4
    assert _sibling_steps(t, semconv.SPAN_EVAL) == [3, 7]  # validation after each epoch
    assert _sibling_steps(t, semconv.SPAN_CHECKPOINT) == [3, 7]  # ModelCheckpoint, one span each
    assert _tags(t) == [["checkpoint", "eval"] if n in (3, 7) else [] for n in range(8)]


def test_transformers_trainer(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["hf"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 6
    fetches = 0
    for view in t.steps.values():
        shape = view.shape()
        # The Trainer's `model.zero_grad()` before its loop: a train.zero_grad at step 0's start.
        if view.n == 0:
            assert shape[0] == (ZG, None), shape
            shape = shape[1:]
        # The Trainer pulls a step's two batches up front, through accelerate's loader, which
        # reads one batch ahead: every step waits for its batches before its first forward.
        fetched = [p for p in shape if p[0] == DATA]
        fetches += len(fetched)
        assert fetched and shape[:len(fetched)] == [(DATA, 0)] * len(fetched), shape
        # Two micro-batches (gradient_accumulation_steps=2); clip, step, model.zero_grad: one phase.
        assert shape[len(fetched):] == [(FWD, 0), (BWD, 0), (FWD, 1), (BWD, 1), (OPT, None)], shape
        assert list(view.children[-1]["attributes"][semconv.TRAIN_OPTIMIZER_CALLS]) == [
            "clip_grad_norm_", "step", "zero_grad"]
        assert view.attrs[semconv.TRAIN_MICRO_BATCHES] == 2
    assert fetches == 6 * 2  # every batch trained on was fetched once, in some step
    assert _sibling_steps(t, semconv.SPAN_EVAL) == [2, 5]
    assert _sibling_steps(t, semconv.SPAN_CHECKPOINT) == [2, 5]
    assert _tags(t) == [["checkpoint", "eval"] if n in (2, 5) else [] for n in range(6)]


def test_lightning_callback_by_hand_instruments_only_its_fit(otlp_receiver: OTLPReceiver,
                                                           launched: dict[str, Launched]) -> None:
    run = launched["lightning_explicit"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 4
    for view in t.steps.values():
        assert view.shape()[:4] == [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)]
    # Lightning's sanity check (before the first step: in its trace), then validation after the epoch.
    assert _sibling_steps(t, semconv.SPAN_EVAL) == [0, 3]
    assert run.outcome[0]["installed_after"] is False and run.outcome[0]["hooks_after"] == 0


def test_hf_callback_by_hand_instruments_only_its_training(otlp_receiver: OTLPReceiver,
                                                           launched: dict[str, Launched]) -> None:
    run = launched["hf_explicit"]
    t = _tree(otlp_receiver, run)
    assert run.steps == 3
    for view in t.steps.values():
        assert view.shape()[-4:] == [(DATA, 0), (FWD, 0), (BWD, 0), (OPT, None)] or \
            view.shape()[-3:] == [(FWD, 0), (BWD, 0), (OPT, None)]
    assert run.outcome[0]["installed_after"] is False and run.outcome[0]["hooks_after"] == 0


def test_example_auto_plain(otlp_receiver: OTLPReceiver, launched: dict[str, Launched]) -> None:
    run = launched["example"].wait()
    text = run.log.read_text()
    steps = int(text.split("done: ")[1].split()[0])
    mine = [s for s in otlp_receiver.spans() if s["resource"].get(semconv.ML_RUN_ID) == run.run_id]
    t = tree(mine)
    check_invariants(t, times=False)
    assert len(t.steps) == steps == 8
    assert _shapes(t) == [PLAIN] * 8
    assert _sibling_steps(t, semconv.SPAN_EVAL) == [4]
    assert _sibling_steps(t, semconv.SPAN_CHECKPOINT) == [7]


def test_otel_train_run_passes_argv_and_exit_status(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint('ARGV', sys.argv)\nprint('PATH0', sys.path[0])\n"
                      "print('MAIN', __name__)\nsys.exit(int(sys.argv[2]))\n")
    proc = subprocess.run(_python("-m", "otel_train.run", str(script), "--flag", "3"), env=clean_env(
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}), capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert f"ARGV ['{script}', '--flag', '3']" in proc.stdout
    assert f"PATH0 {tmp_path}" in proc.stdout and "MAIN __main__" in proc.stdout
    missing = subprocess.run(_python("-m", "otel_train.run", str(tmp_path / "nope.py")), env=clean_env(),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "nope.py" in missing.stderr


def test_otel_train_run_module_mode_and_no_torch_import(tmp_path: Path) -> None:
    (tmp_path / "pkgmod.py").write_text("import sys\nprint('TORCH', 'torch' in sys.modules)\nprint('ARGS', sys.argv[1:])\n")
    env = clean_env({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"})
    proc = subprocess.run(_python("-m", "otel_train.run", "-m", "pkgmod", "a", "b"), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH False" in proc.stdout and "ARGS ['a', 'b']" in proc.stdout  # torch waits to be imported
