"""Run zoo scripts unmodified, plain or under `otel-train run`, and collect what they left.

A `Run` is one process tree: the script copied (byte for byte) into its own working directory
with the data we generate for it, started as `python script.py args` ("plain") or as
`otel-train run script.py args` ("otel") exporting to the suite's OTLP receiver, or, for a
multi-rank entry, under `torchrun --nproc-per-node N [-m otel_train.run] script.py args`.
Every process of a run has tests/zoo/counter on PYTHONPATH, so the independent step counter
(counter/sitecustomize.py) writes its counts and probes into `<workdir>/_zoo/`.

`python tests/zoo/harness.py [entry ...]` runs the named entries (default: all) both ways
against a receiver of its own and prints what tests/test_zoo.py asserts, with the numbers;
tests/zoo/FINDINGS.md was written from its output.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ZOO = Path(__file__).resolve().parent
REPO = ZOO.parent.parent
COUNTER = ZOO / "counter"
for _p in (str(ZOO), str(ZOO.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import catalog  # noqa: E402
from catalog import Entry  # noqa: E402

RANK_KEY = "ml.rank"
RUN_ID_KEY = "ml.run.id"


def _otel_train_argv() -> list[str]:
    """`otel-train run`, as a user types it: the console script next to this python, else the
    same entry point through `-c` (both import otel_train from PYTHONPATH first)."""
    console = Path(sys.executable).parent / "otel-train"
    if console.exists():
        return [str(console), "run"]
    return [sys.executable, "-c", "import sys; from otel_train.cli import main; sys.exit(main())", "run"]


def _base_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "ZOO_")) and k not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")}
    env["PYTHONPATH"] = os.pathsep.join([str(COUNTER), str(REPO)])
    # One intra-op thread: on a shared 2-core machine torch's default of one thread per core
    # makes small ops 10-30x slower; both the plain and the instrumented runs get it.
    env.update({"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "MPLBACKEND": "Agg",
                "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(extra)
    return env


@dataclass
class Run:
    """One zoo run: set up by `prepare()`, started by `start()`, awaited by `wait()`."""

    entry: Entry
    mode: str  # "plain" or "otel"
    workdir: Path
    endpoint: str | None = None  # the receiver's gRPC endpoint for "otel" runs
    args: tuple[str, ...] | None = None  # overrides entry.args
    env_extra: dict[str, str] = field(default_factory=dict)
    run_id: str = ""
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.run_id = self.run_id or f"zoo-{self.entry.name}-{self.mode}-{uuid.uuid4().hex[:8]}"

    @property
    def name(self) -> str:
        return f"{self.entry.name}/{self.mode}"

    @property
    def counts_dir(self) -> Path:
        return self.workdir / "_zoo"

    def prepare(self) -> Run:
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        for src in self.entry.sources:
            dest = self.workdir / src.dest
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.entry.folder / src.dest, dest)
        self.entry.prepare(self.workdir)
        self.counts_dir.mkdir()
        return self

    def argv(self) -> list[str]:
        args = list(self.entry.args if self.args is None else self.args)
        script = str(self.workdir / self.entry.script)
        if self.entry.ranks > 1:
            # (not --standalone: it would make up its own rendezvous id, which becomes ml.run.id)
            launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={self.entry.ranks}",
                        "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", f"--rdzv-id={self.run_id}"]
            return launcher + (["-m", "otel_train.run"] if self.mode == "otel" else []) + [script, *args]
        if self.mode == "otel":
            return _otel_train_argv() + [script, *args]
        return [sys.executable, script, *args]

    def env(self) -> dict[str, str]:
        extra = {"ZOO_COUNT_DIR": str(self.counts_dir), "ZOO_PROBE_STEP": str(self.entry.probe_step),
                 **self.entry.env}
        if self.mode == "otel":
            extra.update({"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint or "", "OTEL_TRAIN_RUN_ID": self.run_id,
                          "OTEL_TRAIN_FLUSH_INTERVAL_MS": "100", "OTEL_METRIC_EXPORT_INTERVAL": "60000",
                          "OTEL_SERVICE_NAME": "zoo"})
            if not self.endpoint:
                del extra["OTEL_EXPORTER_OTLP_ENDPOINT"]  # the embedded default: files under ./otel-train/
        extra.update(self.env_extra)
        return _base_env(extra)

    def start(self) -> Run:
        self.started = time.monotonic()
        with open(self.workdir / "_stdout.txt", "wb") as out, open(self.workdir / "_stderr.txt", "wb") as err:
            # Its own session: the SIGTERM test signals torchrun's whole process group.
            self.proc = subprocess.Popen(self.argv(), env=self.env(), cwd=str(self.workdir), stdout=out,
                                         stderr=err, start_new_session=True)
        return self

    def run_to_end(self, timeout: float) -> None:
        try:
            self.start()
            assert self.proc is not None
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        finally:
            self.ended = time.monotonic()
            self.done.set()

    def wait(self, timeout: float = 300.0) -> Run:
        assert self.done.wait(timeout), f"{self.name} did not finish in {timeout:.0f} s"
        return self

    # --- what it left ---------------------------------------------------------------
    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    @property
    def stdout(self) -> str:
        return (self.workdir / "_stdout.txt").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return (self.workdir / "_stderr.txt").read_text(errors="replace")

    @property
    def wall_s(self) -> float:
        return self.ended - self.started

    def _jsons(self, prefix: str) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.counts_dir.glob(f"{prefix}-*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except json.JSONDecodeError:  # a process killed mid-write: its last count is lost
                continue
        return out

    def counts(self) -> dict[int, dict[str, Any]]:
        """Rank -> the counter's record of that rank's process (rank 0 when not distributed)."""
        return {int(c["rank"] or 0): c for c in self._jsons("count") if c["steps"]}

    def probes(self) -> dict[int, dict[str, Any]]:
        return {int(p["rank"] or 0): p for p in self._jsons("probe")}

    def describe(self) -> str:
        return (f"{self.name} (exit {self.returncode}) {' '.join(self.argv())}\n--- stdout (tail)\n"
                f"{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-5000:]}")


def terminate_group_mid_run(run: Run, min_steps: int, timeout: float = 240.0) -> dict[int, int]:
    """Start `run`, wait until every rank has made `min_steps` optimizer steps, then SIGTERM the
    launcher's whole process group (`kill -TERM -<pgid>`, what a scheduler or a user's Ctrl-C to
    the group does), wait for everything to exit. Returns rank -> steps when the signal went."""
    run.prepare().start()
    assert run.proc is not None
    deadline = time.monotonic() + timeout
    try:
        while True:
            counts = {r: c["steps"] for r, c in run.counts().items()}
            if len(counts) == run.entry.ranks and min(counts.values()) >= min_steps:
                break
            assert run.proc.poll() is None, f"{run.name} ended before {min_steps} steps:\n{run.describe()}"
            assert time.monotonic() < deadline, f"{run.name}: {min_steps} steps not reached in {timeout:.0f} s"
            time.sleep(0.05)
        os.killpg(run.proc.pid, signal.SIGTERM)
        run.proc.wait(timeout=60)
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
        run.ended = time.monotonic()
        run.done.set()
    return counts


def launch(runs: Sequence[Run], max_running: int = 3, timeout: float = 300.0) -> list[threading.Thread]:
    """Prepare every run, then run them `max_running` at a time on background threads."""
    todo: queue.Queue[Run] = queue.Queue()
    for run in runs:
        run.prepare()
        todo.put(run)

    def worker() -> None:
        while True:
            try:
                run = todo.get_nowait()
            except queue.Empty:
                return
            run.run_to_end(timeout)

    threads = [threading.Thread(target=worker, name=f"zoo-launcher-{i}", daemon=True) for i in range(max_running)]
    for thread in threads:
        thread.start()
    return threads


def spans_of(receiver: Any, run_id: str, settle_s: float = 0.3, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The receiver's spans of one run, once no more have arrived for `settle_s`."""
    deadline = time.monotonic() + timeout
    last = -1
    while True:
        mine = [s for s in receiver.spans() if s["resource"].get(RUN_ID_KEY) == run_id]
        if len(mine) == last or time.monotonic() > deadline:
            return mine
        last = len(mine)
        time.sleep(settle_s)


def frames(traceback_text: str) -> list[tuple[str, str]]:
    """(file name, function) of every frame of the last traceback in `traceback_text`."""
    block = traceback_text.rsplit("Traceback (most recent call last):", 1)[-1]
    out = []
    for line in block.splitlines():
        line = line.strip()
        if line.startswith('File "') and ", in " in line:
            path = line[len('File "'):line.index('"', len('File "'))]
            out.append((os.path.basename(path), line.rsplit(", in ", 1)[1]))
    return out


def load_in_clean_process(workdir: Path, files: Iterable[Path], timeout: float = 120.0) -> dict[str, Any]:
    """Load each file in a fresh python in which otel_train cannot be imported (see loadcheck.py)."""
    proc = subprocess.run([sys.executable, str(ZOO / "loadcheck.py"), *map(str, files)], cwd=str(workdir),
                          env=_base_env({"PYTHONPATH": str(workdir)}), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"loadcheck failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str]) -> int:
    """Run the entries both ways against a receiver of our own and print the findings."""
    import tempfile

    import analysis
    from support.otlp_receiver import OTLPReceiver

    every = {**catalog.ENTRIES, **catalog.PACKAGED}
    names = list(argv) or list(every)
    receiver = OTLPReceiver().start()
    root = Path(tempfile.mkdtemp(prefix="zoo-"))
    try:
        runs = []
        for name in names:
            entry = every[name]
            for mode in ("plain", "otel"):
                runs.append(Run(entry, mode, root / f"{name}-{mode}", receiver.grpc_endpoint))
        t0 = time.monotonic()
        for thread in launch(runs, max_running=2):
            thread.join()
        print(f"# all runs done in {time.monotonic() - t0:.1f} s wall (2 at a time) under {root}")
        for run in runs:
            spans = spans_of(receiver, run.run_id) if run.mode == "otel" else []
            print(analysis.summary(run, spans))
    finally:
        receiver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
