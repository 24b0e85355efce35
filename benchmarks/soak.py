"""`otel-train bench soak`: a long run at a short step against a live receiver; is anything growing?

A training process (explicit `otel_train.step()` with four phase spans, `--step-ms` of sleep a
step) exports over OTLP/gRPC to `bench.receiver` for `--minutes`. Every `--sample-s` the
benchmark samples the trainer's and its exporter process's resident memory, threads and open
file descriptors (from /proc, Linux). At the end: first and last samples and the largest, and
the spans the receiver got against the spans made (steps x 5): every step must be delivered.

The issue 30 target is 20 minutes; flat means the last sample is within noise of the one
taken once the run has settled (the first minute holds imports and the first allocations).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

SPANS_PER_STEP = 5

CHILD = textwrap.dedent("""
    import sys, time
    import otel_train
    seconds, step_s = float(sys.argv[1]), float(sys.argv[2])
    otel_train.init()
    from otel_train import _runtime
    sink = _runtime.state().worker.sink
    print("EXPORTER", getattr(getattr(sink, "proc", None), "pid", 0), flush=True)
    end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < end:
        with otel_train.step():
            for name in ("train.data", "train.forward", "train.backward", "train.optimizer"):
                with otel_train.span(name):
                    pass
            time.sleep(step_s)
        steps += 1
    print("STEPS", steps, flush=True)
""")


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    threads: int
    fds: int


def _sample(pid: int, t_s: float) -> Sample | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    if "VmRSS" not in fields:  # exited, not yet reaped
        return None
    rss_kb = int(fields["VmRSS"].split()[0])
    return Sample(t_s, rss_kb / 1024.0, int(fields["Threads"]), fds)


def run_soak(minutes: float, step_ms: float, sample_s: float) -> dict[str, object]:
    receiver = subprocess.Popen([sys.executable, "-m", "otel_train.bench.receiver"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        port = int(receiver.stdout.readline())  # type: ignore[union-attr]
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_METRIC_EXPORT_INTERVAL": "10000"})
        trainer = subprocess.Popen([sys.executable, "-c", CHILD, str(minutes * 60.0), str(step_ms / 1000.0)],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        exporter = int(trainer.stdout.readline().split()[1])  # type: ignore[union-attr]
        started = time.monotonic()
        samples: dict[str, list[Sample]] = {"trainer": [], "exporter": []}
        while trainer.poll() is None:
            now = time.monotonic() - started
            for name, pid in (("trainer", trainer.pid), ("exporter", exporter)):
                found = _sample(pid, now) if pid else None
                if found is not None:
                    samples[name].append(found)
            time.sleep(sample_s)
        out, err = trainer.communicate()
        steps = int(next(line for line in out.splitlines() if line.startswith("STEPS")).split()[1])
        receiver.stdin.write("count\n")  # type: ignore[union-attr]
        receiver.stdin.flush()  # type: ignore[union-attr]
        delivered = int(receiver.stdout.readline())  # type: ignore[union-attr]
    finally:
        receiver.kill()
        receiver.wait()
    result: dict[str, object] = {"minutes": minutes, "step_ms": step_ms, "steps": steps,
                                 "spans_made": steps * SPANS_PER_STEP, "spans_delivered": delivered,
                                 "closing_line": err.strip().splitlines()[-1] if err.strip() else ""}
    for name, series in samples.items():
        if not series:
            continue
        settled = next((s for s in series if s.t_s >= min(60.0, series[-1].t_s / 3)), series[0])
        last = series[-1]
        for field in ("rss_mb", "threads", "fds"):
            result[f"{name}.{field}.settled"] = getattr(settled, field)
            result[f"{name}.{field}.last"] = getattr(last, field)
            result[f"{name}.{field}.max"] = max(getattr(s, field) for s in series)
        result[f"{name}.settled_at_s"] = round(settled.t_s, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.soak [--minutes M] [--step-ms MS] [--sample-s S]`; exit 1 when a span was lost."""
    import argparse

    soak = argparse.ArgumentParser(prog="python -m benchmarks.soak",
                                   description="a long run to a live receiver: RSS, threads, fds; every step delivered")
    soak.add_argument("--minutes", type=float, default=20.0, help="how long the run lasts (default 20)")
    soak.add_argument("--step-ms", type=float, default=2.0, help="sleep per step, ms (default 2)")
    soak.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples (default 5)")
    args = soak.parse_args(argv)
    if args.minutes <= 0 or args.step_ms < 0 or args.sample_s <= 0:
        soak.error("--minutes and --sample-s must be positive numbers, --step-ms >= 0")
    from otel_train.bench.harness import print_figure

    result = run_soak(args.minutes, args.step_ms, args.sample_s)
    for name, value in result.items():
        print_figure(name, value)  # type: ignore[arg-type]
    return 0 if result["spans_delivered"] == result["spans_made"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
