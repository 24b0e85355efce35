"""A real training subprocess for the fault suite, and the figures each fault test reports.

`TrainingRun` starts `python -c LOOP` (a plain loop with explicit `otel_train.step()` and four
phase spans a step, no torch: seconds to start, so a fault test stays cheap), lets the test
follow its steps as they complete (one `STEP n` line each), and collects what it said: steps
completed, training time, exit time (from the loop's end to the process's end), its stderr and
its closing line's counts. `report()` prints one row of the fault table (docs/faults.md) and,
with `FAULT_TABLE_FILE` set to a file, appends it there as JSON.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.procs import clean_env

#: argv: steps, seconds a step sleeps, then optionally "raise" at step N, "hold" (block after
#: the last step, for a signal to arrive mid-step); any further arguments are the script's own
#: (ignored, as a real script's flags would be by us). `FAULT_RUN_FSIZE` in its environment: a
#: disk that fills up after that many bytes of a file (RLIMIT_FSIZE, the exporter's too).
#:
#: It starts as from a terminal: a shell without job control starts a background command with
#: SIGINT ignored (`bash .ci/run &`), the child inherits that, and CPython keeps an inherited
#: SIG_IGN instead of installing its KeyboardInterrupt handler, so a Ctrl-C fault test would wait
#: for an exit that never comes; the script installs the handler itself. Not in a `preexec_fn`:
#: that makes subprocess fork the test process, whose OTLP receivers run gRPC threads, and gRPC
#: restarts its poller in the forked child, which then aborts (SIGABRT, "epoll_wait error: Bad
#: file descriptor") when the child closes its descriptors before exec.
LOOP = textwrap.dedent("""
    import json, os, resource, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("FAULT_RUN_FSIZE"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = int(os.environ["FAULT_RUN_FSIZE"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    import otel_train
    steps, step_s = int(sys.argv[1]), float(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    otel_train.init()
    if os.environ.get("FAULT_RUN_WAIT_READY"):  # start training once the exporter process is up
        from otel_train import _runtime
        _runtime.state().worker.sink.ready.wait(120)
    t0 = time.monotonic()
    for n in range(steps):
        with otel_train.step():
            for name in ("train.data", "train.forward", "train.backward", "train.optimizer"):
                with otel_train.span(name):
                    pass
            time.sleep(step_s)
            if mode == "raise" and n == steps - 1:
                with otel_train.span("train.forward"):
                    raise RuntimeError("the loss went NaN")
        print(f"STEP {n + 1}", flush=True)
    if mode == "hold":
        with otel_train.step():
            with otel_train.span("train.forward"):
                print("HOLDING", flush=True)
                # In short sleeps: a signal the kernel hands to another thread (ours, gRPC's) is
                # only seen by the main thread when it next runs bytecode, not mid-sleep.
                for _ in range(1200):
                    time.sleep(0.1)
    print("DONE " + json.dumps({"train_s": time.monotonic() - t0, "loop_end": time.time()}), flush=True)
""")

_CLOSING = re.compile(r"otel_train: (?:rank \d+: )?(\d+) spans (?:exported|emitted).*?(?:dropped: (\d+) \(buffer full\), "
                      r"(\d+) \(export failed|none dropped)")


@dataclass
class Result:
    """What one training run did and said."""

    run_id: str
    returncode: int
    completed: int
    train_s: float | None
    exit_s: float | None
    stderr: str
    exported: int | None = None
    dropped: int | None = None
    lines: list[str] = field(default_factory=list)

    def closing(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if re.search(r"spans (exported|emitted)", line)]


class TrainingRun:
    """One training subprocess (`LOOP`), its steps followed as they complete."""

    def __init__(self, env: Mapping[str, str], steps: int, step_s: float = 0.01, mode: str = "",
                 cwd: str | os.PathLike[str] | None = None, run_id: str | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.run_id = run_id or f"fault-{uuid.uuid4().hex[:8]}"
        environ = clean_env({"OTEL_TRAIN_RUN_ID": self.run_id, "OTEL_TRAIN_FLUSH_INTERVAL_MS": "100",
                             "OTEL_METRIC_EXPORT_INTERVAL": "600000", **env})
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", LOOP, str(steps), str(step_s), mode, *args], cwd=cwd,
                                     env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.completed = 0
        self.lines: list[str] = []
        self._done: dict[str, Any] | None = None
        # stderr is read on a thread all along (a full pipe would block the run), and stdout
        # only through its TextIOWrapper: `communicate()` reads the raw pipe and would lose the
        # lines `wait_for` had buffered (the DONE line among them).
        self._stderr: list[str] = []
        self._stderr_reader = threading.Thread(target=lambda: self._stderr.append(self.proc.stderr.read()),
                                               daemon=True)
        self._stderr_reader.start()
        # When the process ended, seen as it happens (a test may finish several runs in turn).
        self._ended: list[float] = []
        self._waiter = threading.Thread(target=lambda: (self.proc.wait(), self._ended.append(time.time())),
                                        daemon=True)
        self._waiter.start()

    def wait_for(self, text: str, timeout: float = 120.0) -> None:
        """Read stdout until a line starts with `text` (`STEP 5`, `HOLDING`)."""
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                self._stderr_reader.join(10)
                raise AssertionError(f"the run ended before {text!r}: {self.lines[-3:]}\n{''.join(self._stderr)}")
            self._take(line.strip())
            if line.startswith(text):
                return
        raise AssertionError(f"no {text!r} within {timeout:.0f} s")

    def _take(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith("STEP "):
            self.completed = int(line.split()[1])
        elif line.startswith("DONE "):
            self._done = json.loads(line[5:])

    def finish(self, timeout: float = 120.0) -> Result:
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.append(self.proc.stdout.read()), daemon=True)
        reader.start()
        self.proc.wait(timeout=timeout)
        self._waiter.join(timeout)
        ended = self._ended[0] if self._ended else time.time()
        reader.join(timeout)
        self._stderr_reader.join(timeout)
        out, err = "".join(rest), "".join(self._stderr)
        for line in out.splitlines():
            self._take(line.strip())
        done = self._done or {}
        result = Result(self.run_id, self.proc.returncode, self.completed, done.get("train_s"),
                        ended - done["loop_end"] if "loop_end" in done else None, err, lines=self.lines)
        found = _CLOSING.search(err)
        if found:
            result.exported = int(found.group(1))
            result.dropped = int(found.group(2) or 0) + int(found.group(3) or 0)
        return result


def step_spans(spans: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The completed (not force-ended) `train.step` spans of one run."""
    return [s for s in spans if s["resource"].get("ml.run.id") == run_id and s["name"] == "train.step"
            and not s["attributes"].get("otel_train.truncated")]


def run_spans(spans: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["resource"].get("ml.run.id") == run_id]


def settle(receiver: Any, run_id: str, timeout: float = 15.0, quiet_s: float = 0.5) -> list[dict[str, Any]]:
    """The receiver's spans of `run_id` once no more have arrived for `quiet_s`."""
    deadline = time.monotonic() + timeout
    last = -1
    while True:
        mine = run_spans(receiver.spans(), run_id)
        if len(mine) == last or time.monotonic() > deadline:
            return mine
        last = len(mine)
        time.sleep(quiet_s)


def report(fault: str, kept: str, lost: str, faulted: Result, base: Result | None) -> None:
    """One row of the fault table: printed, and appended to $FAULT_TABLE_FILE if set."""
    row = {"fault": fault, "kept": kept, "lost": lost,
           "train_s": faulted.train_s, "exit_s": faulted.exit_s,
           "base_train_s": base.train_s if base else None, "base_exit_s": base.exit_s if base else None}
    print("FAULT " + json.dumps(row))
    table = os.environ.get("FAULT_TABLE_FILE")
    if table:
        with open(Path(table), "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")


@dataclass
class Script:
    """One run of a script of ours (`run_script`): its exit, stderr and closing-line counts."""

    returncode: int
    stdout: str
    stderr: str
    exported: int | None
    dropped: int | None


def run_script(code: str, env: Mapping[str, str], timeout: float = 90.0,
               cwd: str | os.PathLike[str] | None = None, args: tuple[str, ...] = ()) -> Script:
    """Run `code` (dedented) in a fresh interpreter under `env` (no other OTEL_*), killed past
    `timeout`: a hang fails the test as an exit by SIGKILL (-9), not by the suite's timeout."""
    environ = clean_env({"OTEL_TRAIN_FLUSH_INTERVAL_MS": "100", "OTEL_METRIC_EXPORT_INTERVAL": "600000", **env})
    proc = subprocess.Popen([sys.executable, "-u", "-c", textwrap.dedent(code), *args], cwd=cwd, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    found = _CLOSING.search(err)
    exported = dropped = None
    if found:
        exported = int(found.group(1))
        dropped = int(found.group(2) or 0) + int(found.group(3) or 0)
    return Script(proc.returncode, out, err, exported, dropped)
