"""Step edges on the shapes public scripts have (issue 54 #2, #3, #6), under `otel-train run`.

Each scenario (tests/support/scenarios/) counts its own updates; its trace must hold one
`train.step` per update, every phase inside its own step, and no time counted twice (a step's
children never overlap). The scenarios run together when the first test asks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from support.procs import clean_env  # noqa: E402

SCENARIOS = Path(__file__).resolve().parent / "support" / "scenarios"
CASES = ("gan_samples", "rl_episodes", "forward_forward", "lightning_samples")


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


class Ran:
    def __init__(self, proc: subprocess.CompletedProcess[str], cwd: Path) -> None:
        self.proc = proc
        self.counted = json.loads(proc.stdout.split("SCENARIO ", 1)[1].splitlines()[0])
        self.spans: list[dict[str, Any]] = []
        for path in cwd.glob("otel-train/*/traces-*.jsonl"):
            for line in path.read_text().splitlines():
                for rs in json.loads(line)["resourceSpans"]:
                    for ss in rs["scopeSpans"]:
                        self.spans += ss["spans"]

    def steps(self) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Each `train.step` with its children, in start order."""
        children: dict[str, list[dict[str, Any]]] = {}
        for span in self.spans:
            children.setdefault(span.get("parentSpanId", ""), []).append(span)
        steps = sorted((s for s in self.spans if s["name"] == "train.step"), key=lambda s: int(s["startTimeUnixNano"]))
        return [(s, sorted(children.get(s["spanId"], []), key=lambda c: int(c["startTimeUnixNano"]))) for s in steps]


def _run(tmp: Path, name: str) -> Ran:
    proc = subprocess.run([sys.executable, "-m", "otel_train.run", str(SCENARIOS / f"{name}.py")],
                          env=clean_env({"OTEL_METRICS_EXPORTER": "none", "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "60"}),
                          cwd=tmp, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    return Ran(proc, tmp)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[Ran]]:
    pool = ThreadPoolExecutor(2)
    out = {name: pool.submit(_run, tmp_path_factory.mktemp(name), name) for name in CASES}
    yield out
    pool.shutdown(wait=True)


def _inside_and_disjoint(ran: Ran) -> None:
    """Every child lies within its step; a step's children never overlap (no time counted twice)."""
    for step, children in ran.steps():
        t0, t1 = int(step["startTimeUnixNano"]), int(step["endTimeUnixNano"])
        n = _attrs(step)["train.step"]
        end = t0
        for child in children:
            c0, c1 = int(child["startTimeUnixNano"]), int(child["endTimeUnixNano"])
            assert t0 <= c0 <= c1 <= t1, (n, child["name"], _attrs(child), c0 - t0, t1 - c1)
            assert c0 >= end, (n, child["name"], "overlaps the span before it by", end - c0)
            end = c1


@pytest.mark.parametrize("name", ["gan_samples", "lightning_samples"])
def test_gan_sample_forward_stays_in_the_step_it_runs_in(runs: dict[str, Future[Ran]], name: str) -> None:
    """dcgan's `netG(fixed_noise)` after the generator's update, and Lightning's sample in
    `on_train_epoch_end`: never a micro-batch outside an ended step, never also a `train.other`
    of the next one; one step per iteration."""
    if name == "lightning_samples":
        pytest.importorskip("lightning")
    ran = runs[name].result()
    steps = ran.steps()
    assert len(steps) == ran.counted["steps"]
    _inside_and_disjoint(ran)
    updates = [sum(c["name"] == "train.optimizer" for c in children) for _, children in steps]
    assert updates == [2] * len(steps)
    after = [n for n, (_, children) in enumerate(steps)
             if [c["name"] for c in children if c["name"] != "train.other"][-1] == "train.forward"]
    assert len(after) == ran.counted["samples"]  # each sample is the last phase of its iteration's step


def test_rl_one_update_per_episode(runs: dict[str, Future[Ran]]) -> None:
    """reinforce's shape: every policy forward of an episode is in that episode's step."""
    ran = runs["rl_episodes"].result()
    steps = ran.steps()
    assert len(steps) == ran.counted["steps"]
    _inside_and_disjoint(ran)
    forwards = sum(c["name"] == "train.forward" for _, children in steps for c in children)
    assert forwards == ran.counted["forwards"]


def test_forward_forward_every_layer_update_is_a_step(runs: dict[str, Future[Ran]]) -> None:
    """mnist_forward_forward's shape: per-layer optimizers, `self.forward()` called directly:
    each layer's update is one step, every phase inside its step. The forwards after the last
    update (the last layer's outputs, the final `predict()` with gradients) open no step: they
    are an evaluation pass after the last step."""
    ran = runs["forward_forward"].result()
    steps = ran.steps()
    assert len(steps) == ran.counted["steps"]
    assert all(any(c["name"] == "train.optimizer" for c in children) for _, children in steps)
    _inside_and_disjoint(ran)
    (prediction,) = [s for s in ran.spans if s["name"] == "train.eval"]
    assert int(prediction["startTimeUnixNano"]) == int(steps[-1][0]["endTimeUnixNano"])
    inside = [s for s in ran.spans if s.get("parentSpanId") == prediction["spanId"]]
    assert sum(s["name"] == "train.forward" for s in inside) == ran.counted["after_last"]
