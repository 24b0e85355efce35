"""The zoo's CI tier: public training scripts that ship inside installed packages, run unmodified
under `otel-train run` (issue 26). tests/test_zoo.py's scripts come from GitHub and are not
committed, so a fresh clone skips them; these are always at hand (tests/zoo/catalog.py,
`PACKAGED`: accelerate's own end-to-end script).

Each is run plain and instrumented, with the independent step counter
(tests/zoo/counter/sitecustomize.py, torch's global optimizer post-hook) on PYTHONPATH, and
checked as the zoo checks: exit status as plain, steps = the counter's, per step one forward,
one backward and one `train.optimizer` (with a top-of-loop `zero_grad()` in the step it
starts), `train.step.uncovered_s` right, >= 99 % of the loop's wall time attributed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
if str(ZOO_DIR) not in sys.path:
    sys.path.insert(0, str(ZOO_DIR))

import analysis  # noqa: E402
import catalog  # noqa: E402
import harness  # noqa: E402
from analysis import BACKWARD, FORWARD, OPTIMIZER  # noqa: E402
from harness import Run  # noqa: E402
from support.otlp_receiver import OTLPReceiver  # noqa: E402

from otel_train import semconv  # noqa: E402

ENTRIES = catalog.PACKAGED
NAMES = list(ENTRIES)
#: accelerate's script: 10 loops of 12 updates (4 batches x 3 epochs), two rounds of
#: (plain, Accelerator, batch split, bf16, fp16 where available); read off its code for torch
#: 2.13 on CPU, and checked against the counter.
ACCELERATE_UPDATES = 120
FRESH_MODEL_FIRST_STEPS = [n for n in range(12, ACCELERATE_UPDATES, 12)]


@pytest.fixture(scope="module")
def runs(otlp_receiver: OTLPReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    problems = [p for e in ENTRIES.values() for p in catalog.missing(e)]
    if problems:  # another version of the package: its script is not the one pinned
        pytest.skip("packaged zoo scripts are not the pinned ones:\n" + "\n".join(problems))
    root = tmp_path_factory.mktemp("zoo-packaged")
    out: dict[str, Run] = {}
    for name, entry in ENTRIES.items():
        out[f"{name}/otel"] = Run(entry, "otel", root / f"{name}-otel", otlp_receiver.grpc_endpoint)
        out[f"{name}/plain"] = Run(entry, "plain", root / f"{name}-plain")
    threads = harness.launch(list(out.values()), max_running=2)
    yield out
    for run in out.values():
        if run.proc is not None and run.proc.poll() is None:
            run.proc.kill()
    for thread in threads:
        thread.join(timeout=60)


def _view(receiver: OTLPReceiver, run: Run) -> analysis.RankView:
    run.wait()
    views = analysis.by_rank(harness.spans_of(receiver, run.run_id))
    assert list(views) == [0], f"ranks {list(views)} from {run.name}\n{run.describe()}"
    return views[0]


@pytest.mark.parametrize("name", NAMES)
def test_exits_as_it_does_without_instrumentation(runs: dict[str, Run], name: str) -> None:
    plain, otel = runs[f"{name}/plain"].wait(), runs[f"{name}/otel"].wait()
    assert plain.returncode == 0, plain.describe()
    assert otel.returncode == 0, otel.describe()


@pytest.mark.parametrize("name", NAMES)
def test_steps_and_phases_are_the_scripts(otlp_receiver: OTLPReceiver, runs: dict[str, Run], name: str) -> None:
    run = runs[f"{name}/otel"]
    view = _view(otlp_receiver, run)
    counted = run.counts()[0]["steps"]
    assert counted == runs[f"{name}/plain"].wait().counts()[0]["steps"] == ACCELERATE_UPDATES
    print(f"FIGURE {name}: {len(view.steps)} train.step spans, {counted} optimizer steps counted")
    assert list(view.steps) == list(range(counted))
    no_forward = []
    for tree in view.steps.values():
        counts = tree.counts()
        assert (counts[BACKWARD], counts[OPTIMIZER]) == (1, 1), (tree.n, dict(counts))
        (update,) = tree.named(OPTIMIZER)
        assert list(update["attributes"][semconv.TRAIN_OPTIMIZER_CALLS]) == ["step"], tree.n
        assert tree.span["end_ns"] == update["end_ns"], tree.n
        # `model.zero_grad()` at the top of the iteration: the step that iteration makes, first.
        (zero_grad,) = tree.named(semconv.SPAN_ZERO_GRAD)
        (backward,) = tree.named(BACKWARD)
        assert zero_grad["end_ns"] <= backward["start_ns"], tree.n
        if counts[FORWARD] != 1:
            no_forward.append(tree.n)
    # Each loop after the first trains a freshly built model: its first step's forward is not
    # seen (docs/step-semantics.md, "Models that appear later"), every other step's is.
    assert no_forward == FRESH_MODEL_FIRST_STEPS


@pytest.mark.parametrize("name", NAMES)
def test_time_adds_up(otlp_receiver: OTLPReceiver, runs: dict[str, Run], name: str) -> None:
    view = _view(otlp_receiver, runs[f"{name}/otel"])
    for tree in view.steps.values():
        reported = analysis.uncovered_attribute(tree.span)
        assert reported == pytest.approx(tree.uncovered_s(), abs=1e-4), tree.n
    share = view.loop_attributed()
    print(f"FIGURE {name}: {share:.4%} of the loop's wall time attributed over {len(view.steps)} steps")
    assert share >= 0.99


@pytest.mark.parametrize("name", NAMES)
def test_events_lie_inside_their_span(otlp_receiver: OTLPReceiver, runs: dict[str, Run], name: str) -> None:
    run = runs[f"{name}/otel"]
    run.wait()
    assert analysis.events_outside(harness.spans_of(otlp_receiver, run.run_id)) == []
