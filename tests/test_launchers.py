"""Training in the processes a script starts, under `otel-train run` (issue 54 #1).

Each scenario (tests/support/scenarios/) runs unmodified under `python -m otel_train.run`,
writing local files; every process that trains prints its own update count (`SCENARIO`), and
its trace file must hold exactly that many `train.step` spans, under its own name, with its own
closing line; a process that trains nothing (the parent of `mp.spawn`, an idle pool worker)
writes no file and no closing line. The scenarios start together when the first test asks (a
few seconds each, mostly each child importing torch).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from support.procs import clean_env  # noqa: E402

SCENARIOS = Path(__file__).resolve().parent / "support" / "scenarios"
CASES = {
    "hogwild_spawn": ("hogwild.py", "spawn"),
    "hogwild_fork": ("hogwild.py", "fork"),
    "hogwild_forkserver": ("hogwild.py", "forkserver"),
    "spawn_ddp": ("spawn_ddp.py", "2"),
    "pool_spawn": ("process_pool.py", "spawn"),
}
CLOSING = re.compile(r"otel_train: (?:rank \d+: )?(\d+) spans exported to (\S+);")
SCENARIO_LINE = re.compile(r"SCENARIO (\{[^{}]*\})")


class Ran:
    def __init__(self, proc: subprocess.CompletedProcess[str], cwd: Path) -> None:
        self.proc = proc
        # Children share the parent's stdout: two lines may come out run together (mp.spawn's
        # ranks printing at once), so each flat `SCENARIO {...}` is found wherever it is.
        self.counted = [json.loads(found) for found in SCENARIO_LINE.findall(proc.stdout)]
        self.closing = CLOSING.findall(proc.stderr)
        self.files = {p.name: p for p in cwd.glob("otel-train/*/*.jsonl")}

    def spans(self, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(resource attributes, spans) of one trace file."""
        resource: dict[str, Any] = {}
        out = []
        for line in self.files[name].read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                resource = {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    out += ss["spans"]
        return resource, out


def _run(tmp: Path, script: str, arg: str) -> Ran:
    proc = subprocess.run([sys.executable, "-m", "otel_train.run", str(SCENARIOS / script), arg],
                          env=clean_env({"OTEL_METRICS_EXPORTER": "none", "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "60"}), cwd=tmp, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    return Ran(proc, tmp)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[Ran]]:
    pool = ThreadPoolExecutor(2)  # with a generous shutdown bound: exporters start slowly on 2 busy cores
    out = {name: pool.submit(_run, tmp_path_factory.mktemp(name), *case) for name, case in CASES.items()}
    yield out
    pool.shutdown(wait=True)


def _check_children(ran: Ran, expected_files: set[str]) -> None:
    trainers = [c for c in ran.counted if c["steps"]]
    assert len(trainers) == len(expected_files), ran.proc.stdout
    assert set(ran.files) == expected_files, (ran.files, ran.proc.stderr)
    # one closing line per trainer, each naming its own file; none from the parent
    named = sorted(Path(path).name for _, path in ran.closing)
    assert named == sorted(expected_files), ran.proc.stderr
    by_pid = {c["pid"]: c["steps"] for c in trainers}
    for name in expected_files:
        resource, spans = ran.spans(name)
        steps = [s for s in spans if s["name"] == "train.step"]
        assert len(steps) == by_pid[int(resource["process.pid"])], (name, len(steps), by_pid)
        assert sum(s["name"] == "train.optimizer" for s in spans) == len(steps)
    spans_said = {Path(path).name: int(n) for n, path in ran.closing}
    for name in expected_files:
        assert spans_said[name] == len(ran.spans(name)[1])


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_hogwild_children_are_traced_each_in_its_own_file(runs: dict[str, Future[Ran]], method: str) -> None:
    """mnist_hogwild's shape: two `torch.multiprocessing` children train a shared model; each
    is followed whatever the start method, named by its identity (no rank of its own)."""
    ran = runs[f"hogwild_{method}"].result()
    _check_children(ran, {"traces-rank0-p1.jsonl", "traces-rank0-p2.jsonl"})


def test_mp_spawn_ddp_ranks_come_from_init_process_group(runs: dict[str, Future[Ran]]) -> None:
    """`mp.spawn` DDP (gloo, `rank=` given to `init_process_group`, no RANK variable): each
    child is its rank, in files, resource and closing line; the parent, which trains nothing,
    stands down and leaves rank 0's file to rank 0."""
    ran = runs["spawn_ddp"].result()
    _check_children(ran, {"traces-rank0.jsonl", "traces-rank1.jsonl"})
    ranks = {c["pid"]: c["rank"] for c in ran.counted if "rank" in c}
    for name in ran.files:
        resource, spans = ran.spans(name)
        assert resource["ml.rank"] == str(ranks[int(resource["process.pid"])])
        assert resource["ml.world_size"] == "2"
        assert f"traces-rank{resource['ml.rank']}.jsonl" == name
    run_ids = {ran.spans(name)[0]["ml.run.id"] for name in ran.files}
    assert len(run_ids) == 1  # the children share the parent's run


def test_process_pool_traces_the_worker_that_trains_only(runs: dict[str, Future[Ran]]) -> None:
    """A `ProcessPoolExecutor` whose idle workers only compute: they write nothing and print
    nothing; the one that ran the training task has its file and closing line."""
    ran = runs["pool_spawn"].result()
    assert len(ran.files) == 1, (ran.files, ran.proc.stderr)
    # the parent, which started a pool (not a function of its own), keeps its runtime: it says
    # it exported nothing, to rank 0's file, which no child writes
    parent = [path for n, path in ran.closing if Path(path).name == "traces-rank0.jsonl"]
    assert len(parent) == 1 and ("0", parent[0]) in ran.closing, ran.proc.stderr
    ran.closing = [(n, path) for n, path in ran.closing if path not in parent]
    _check_children(ran, set(ran.files))


SHADOWED = """
import multiprocessing as mp
import os
import sys


def child() -> None:
    print("CHILD RAN", flush=True)


if __name__ == "__main__":
    os.chdir(sys.argv[1])  # where a package named otel_train shadows ours for the child
    p = mp.get_context("spawn").Process(target=child)
    p.start()
    p.join()
    sys.exit(p.exitcode)
"""


def test_a_child_that_cannot_be_followed_says_so_once_and_runs(tmp_path: Path) -> None:
    """A spawned child that cannot import otel_train (here a package of that name in its working
    directory shadows ours) runs untraced, and says so in one line."""
    shadow = tmp_path / "shadow"
    (shadow / "otel_train").mkdir(parents=True)
    (shadow / "otel_train" / "__init__.py").write_text("raise ImportError('not the real one')\n")
    script = tmp_path / "launch.py"
    script.write_text(SHADOWED)
    proc = subprocess.run([sys.executable, "-m", "otel_train.run", str(script), str(shadow)],
                          env=clean_env({"OTEL_METRICS_EXPORTER": "none"}), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "CHILD RAN" in proc.stdout, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "is not traced" in line]
    assert len(said) == 1 and "not the real one" in said[0], proc.stderr
