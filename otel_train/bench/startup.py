"""`otel-train bench startup`: what the first steps of a run pay for otel_train's start.

Each round runs two fresh processes, in alternating order: a plain loop of `--steps` steps of
fixed CPU work (about `--step-ms` each, calibrated once), and the same loop after
`otel_train.init()` with each step in `otel_train.step()` and a `train.forward` span (the
embedded default: files). What the instrumented process pays at start is `init()` itself (on
the training thread, before the loop) and whatever the exporter process's start takes from the
loop's CPU while it imports and builds its pipeline. Printed: `init()`'s time, each step's
median time over the rounds, plain and instrumented, the first steps' total, the training
thread's own CPU time over them (what it did itself, which a loaded machine does not blur) and
when the exporter process said it was ready (seconds after `init()` returned).

`--loop auto` (and `auto-manual`) times an unmodified torch loop instead (a small MLP, 64
samples, with an optimizer; `auto-manual`: updating its weights by hand, as pytorch/examples
regression does), plain and under `import otel_train.auto`: what detection itself does inside
the first steps (root discovery, the first decisions) shows beside the start's own cost.

Wall-clock figures: run it on a quiet machine (issue 26 item 6 measured 190-946 ms first steps
against 25 ms when the exporter started on the training thread's time). The command's flags:
`cli/bench.py`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

CHILD = textwrap.dedent("""
    import json, sys, threading, time
    mode, steps, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def step_work():
        total = 0
        for i in range(work):
            total += i * i
        return total

    t0 = time.perf_counter()
    init_s, ready = 0.0, []
    if mode == "instrumented":
        import otel_train
        from otel_train import _runtime
        otel_train.init()
        init_s = time.perf_counter() - t0
        started = time.perf_counter()
        sink = _runtime.state().worker.sink
        if hasattr(sink, "ready"):
            def wait_ready():
                ready.append(time.perf_counter() - started if sink.ready.wait(120) else None)
            threading.Thread(target=wait_ready, daemon=True).start()
    times, cpu = [], []
    for n in range(steps):
        begin, begin_cpu = time.perf_counter(), time.thread_time()
        if mode == "instrumented":
            with otel_train.step():
                with otel_train.span("train.forward"):
                    step_work()
        else:
            step_work()
        times.append(time.perf_counter() - begin)
        cpu.append(time.thread_time() - begin_cpu)
    if mode == "instrumented":
        deadline = time.perf_counter() + 60
        while not ready and time.perf_counter() < deadline:
            time.sleep(0.01)
    print("RESULT " + json.dumps({"init_s": init_s, "steps": times, "cpu": cpu, "ready_s": ready[0] if ready else None}))
""")


#: An unmodified torch loop (`--loop auto` / `auto-manual`); argv: mode, steps, manual (0/1).
AUTO_CHILD = textwrap.dedent("""
    import json, sys, time
    mode, steps, manual = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    t0 = time.perf_counter()
    if mode == "instrumented":
        import otel_train.auto
    import torch
    from torch import nn
    init_s = time.perf_counter() - t0
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = None if manual else torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    times, cpu = [], []
    for n in range(steps):
        begin, begin_cpu = time.perf_counter(), time.thread_time()
        (opt or model).zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if opt is not None:
            opt.step()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(-0.01 * p.grad)
        times.append(time.perf_counter() - begin)
        cpu.append(time.thread_time() - begin_cpu)
    print("RESULT " + json.dumps({"init_s": init_s, "steps": times, "cpu": cpu, "ready_s": None}))
""")


def _calibrate(step_ms: float) -> int:
    """Loop iterations that take about `step_ms` here (the best of a few tries)."""
    work = 100_000
    best = min(_time_work(work) for _ in range(5))
    return max(1000, int(work * step_ms / 1000.0 / best))


def _time_work(work: int) -> float:
    begin = time.perf_counter()
    total = 0
    for i in range(work):
        total += i * i
    return time.perf_counter() - begin


class ChildFailed(Exception):
    """A timed process did not report its figures: the message says which and why."""


def _child(mode: str, steps: int, work: int, out_dir: str, loop: str = "explicit") -> dict[str, Any]:
    """One fresh process's figures. Its telemetry settings are the defaults (files in `out_dir`),
    not the caller's OTEL_* environment: the figures are of the start every run pays."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_TRAIN_OUTPUT_DIR"] = out_dir
    code, arg = (CHILD, str(work)) if loop == "explicit" else (AUTO_CHILD, "1" if loop == "auto-manual" else "0")
    try:
        proc = subprocess.run([sys.executable, "-c", code, mode, str(steps), arg], env=env,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"the {mode} process ran over 300 s") from None
    line = next((line for line in proc.stdout.splitlines() if line.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ChildFailed(f"the {mode} process exited with status {proc.returncode}: {tail[0]}")
    return json.loads(line[7:])


def run_startup(steps: int, step_ms: float, rounds: int, loop: str = "explicit") -> dict[str, Any]:
    """The figures (module docstring), by name, in print order."""
    work = _calibrate(step_ms) if loop == "explicit" else 0
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "instrumented": []}
    with tempfile.TemporaryDirectory() as out_dir:
        for r in range(rounds):
            order = ("plain", "instrumented") if r % 2 == 0 else ("instrumented", "plain")
            for mode in order:
                runs[mode].append(_child(mode, steps, work, out_dir, loop))
    figures: dict[str, Any] = {}
    for mode, results in runs.items():
        per_step = [statistics.median(r["steps"][n] for r in results) for n in range(steps)]
        for n, value in enumerate(per_step):
            figures[f"{mode}.step{n}_ms"] = value * 1000
        figures[f"{mode}.first{steps}_total_ms"] = statistics.median(sum(r["steps"]) for r in results) * 1000
        # The training thread's own CPU time: what it does itself, whatever else the machine runs.
        figures[f"{mode}.first{steps}_thread_cpu_ms"] = statistics.median(sum(r["cpu"]) for r in results) * 1000
    figures["instrumented.import_and_init_ms"] = statistics.median(r["init_s"] for r in runs["instrumented"]) * 1000
    ready = [r["ready_s"] for r in runs["instrumented"] if r["ready_s"] is not None]
    if ready:
        figures["instrumented.exporter_ready_after_init_s"] = statistics.median(ready)
    figures[f"ratio.first{steps}_total"] = (figures[f"instrumented.first{steps}_total_ms"]
                                           / figures[f"plain.first{steps}_total_ms"])
    figures[f"ratio.first{steps}_thread_cpu"] = (figures[f"instrumented.first{steps}_thread_cpu_ms"]
                                                / figures[f"plain.first{steps}_thread_cpu_ms"])
    figures["rounds"] = rounds
    figures["loop"] = loop
    return figures
