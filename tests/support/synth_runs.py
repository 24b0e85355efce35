"""Scripted runs written as the embedded default writes them, with the truth beside them.

`write_run(plan, dir)` simulates a synchronous data-parallel job on one true clock (each rank:
data, forward, backward, then an all-reduce every rank leaves together, then the optimizer;
checkpoint / eval / GC siblings; a restart that redoes steps) and writes what each rank's
otel_train would have written: `traces-rank<R>.jsonl` (OTLP JSON lines, ids derived as the
package derives them) and `metrics-rank<R>.jsonl` (a step-duration histogram whose start time is
the process's `otel_train.init`), every timestamp shifted by the rank's planted clock offset.
It returns the `Truth`: per-category goodput times, the stragglers and offsets planted.

Also a command, for measuring `diagnose` on a big run:

    python tests/support/synth_runs.py OUT_DIR --ranks 1024 --steps 100
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from otel_train.semconv import PHASE_SPANS as _PHASES  # noqa: E402
from otel_train.wire.ids import step_span_id, trace_id_for  # noqa: E402
from otel_train.wire.sampling import sampled_in  # noqa: E402

MS = 1_000_000
T0 = 1_800_000_000 * 10**9  # an arbitrary wall-clock origin (2027)


@dataclass
class Plan:
    ranks: int = 4
    steps: int = 20
    run_id: str = "synth"
    data_ms: float = 5.0
    forward_ms: float = 30.0
    backward_ms: float = 50.0
    optimizer_ms: float = 5.0
    collective_ms: float = 2.0  # the all-reduce itself, once everyone arrived
    ddp: bool = False  # True: no collective spans, the all-reduce completes inside backward
    micro_batches: int = 1
    startup_ms: float = 1000.0  # init -> first step
    compile_ms: float = 0.0  # extra time in step 0 (every rank)
    straggler: dict[int, float] = field(default_factory=dict)  # rank -> extra data ms every step
    straggle_steps: set[int] | None = None  # None: every step
    offsets_ms: dict[int, float] = field(default_factory=dict)  # rank -> clock offset
    slow_steps: dict[int, float] = field(default_factory=dict)  # step -> extra forward ms (all ranks)
    siblings: dict[int, list[tuple[str, float]]] = field(default_factory=dict)  # step -> [(span, ms)]
    gc: dict[int, float] = field(default_factory=dict)  # step -> GC pause ms inside the step's forward
    restart: tuple[int, int, float] | None = None  # (crash after step, resume at step, downtime ms)
    device: bool = False  # device.duration_s / device.lag_s on forward/backward/optimizer
    jitter_ms: float = 0.0  # uniform noise on each phase
    seed: int = 0
    steps_per_line: int = 10
    tail_ms: float = 0.0  # after the last step, before the process's last span ends
    sample: int | None = None  # OTEL_TRAIN_RANKS=sample:K: phase spans of rank 0 and K ranks a step only
    zero_grad_ms: float = 0.0  # a train.zero_grad phase after the optimizer (automatic mode's)
    other_ms: float = 0.0  # the script's own time after each step: a train.other sibling (goodput `other`)
    first_data_ms: float = 0.0  # extra data wait in the first step (every rank): a slow first batch
    hiccup: tuple[float, float] | None = None  # (probability, ms): a random rank's extra data in a step (noise)


@dataclass
class Truth:
    wall_ns: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # goodput category -> seconds (mean over ranks)
    offsets_ns: dict[int, int] = field(default_factory=dict)
    stragglers: set[int] = field(default_factory=set)
    step_ns: dict[int, int] = field(default_factory=dict)


def _kv(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for k, v in attrs.items():
        if isinstance(v, bool):
            val: dict[str, Any] = {"boolValue": v}
        elif isinstance(v, int):
            val = {"intValue": str(v)}
        elif isinstance(v, float):
            val = {"doubleValue": v}
        elif isinstance(v, list):
            val = {"arrayValue": {"values": [{"stringValue": x} for x in v]}}
        else:
            val = {"stringValue": str(v)}
        out.append({"key": k, "value": val})
    return out


class _RankWriter:
    def __init__(self, plan: Plan, rank: int, restart: int, out: Path, rng: random.Random) -> None:
        self.plan, self.rank, self.restart, self.rng = plan, rank, restart, rng
        self.offset = int(plan.offsets_ms.get(rank, 0.0) * MS)
        self.resource = {"resource": {"attributes": _kv({
            "service.name": "otel-train", "service.instance.id": f"synth-{rank}-{restart}",
            "host.name": f"node{rank // 8}", "ml.run.id": plan.run_id, "ml.rank": rank, "ml.local_rank": rank % 8,
            "ml.world_size": plan.ranks, "ml.node_rank": rank // 8, "ml.role": "trainer", "ml.restart": restart})}}
        self.spans: list[dict[str, Any]] = []
        self.traces = open(out / f"traces-rank{rank}.jsonl", "a", encoding="utf-8")
        self.metrics_path = out / f"metrics-rank{rank}.jsonl"

    def span(self, name: str, step: int | None, t0: int, t1: int, parent: str | None = None,
             span_id: str | None = None, **attrs: Any) -> str:
        sid = span_id or f"{self.rng.getrandbits(64) or 1:016x}"
        if self.plan.sample is not None and name in _PHASES and \
                not sampled_in(self.plan.run_id, step, self.rank, self.plan.ranks, self.plan.sample):
            return sid  # sampled out, as the exporter would
        a = {"train.step": step} if step is not None else {}
        a.update(attrs)
        s: dict[str, Any] = {"traceId": f"{trace_id_for(self.plan.run_id, step):032x}", "spanId": sid,
                             "name": name, "kind": 1, "startTimeUnixNano": str(t0 + self.offset),
                             "endTimeUnixNano": str(t1 + self.offset), "attributes": _kv(a), "status": {}}
        if parent:
            s["parentSpanId"] = parent
        self.spans.append(s)
        return sid

    def step_ids(self, step: int) -> tuple[str, str | None]:
        own = f"{step_span_id(self.plan.run_id, step, self.rank, self.restart):016x}"
        root = None if self.rank == 0 else f"{step_span_id(self.plan.run_id, step, 0, self.restart):016x}"
        return own, root

    def flush(self, force: bool = False) -> None:
        if self.spans and (force or len(self.spans) >= self.plan.steps_per_line * 8):
            doc = {"resourceSpans": [{**self.resource, "scopeSpans": [
                {"scope": {"name": "otel_train", "version": "0.1.0"}, "spans": self.spans}]}]}
            self.traces.write(json.dumps(doc, separators=(",", ":")) + "\n")
            self.spans = []

    def metrics(self, init: int, last: int) -> None:
        doc = {"resourceMetrics": [{**self.resource, "scopeMetrics": [{"scope": {"name": "otel_train"}, "metrics": [
            {"name": "train.step.duration", "unit": "s", "histogram": {"aggregationTemporality": 2, "dataPoints": [
                {"startTimeUnixNano": str(init + self.offset), "timeUnixNano": str(last + self.offset),
                 "count": "1", "sum": 0.1, "bucketCounts": ["1"], "explicitBounds": []}]}}]}]}]}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")

    def close(self) -> None:
        self.flush(force=True)
        self.traces.close()


def write_run(plan: Plan, out: str | os.PathLike[str]) -> Truth:
    """Write `plan` as files under `out` (created); return what was planted."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(plan.seed)
    truth = Truth(offsets_ns={r: int(plan.offsets_ms.get(r, 0.0) * MS) for r in range(plan.ranks)},
                  stragglers=set(plan.straggler))
    cat = {k: 0 for k in ("productive", "startup", "compile", "data", "checkpoint", "eval", "gc", "restart",
                          "other")}
    attempts: list[tuple[int, list[int]]] = []
    if plan.restart:
        crash, resume, _ = plan.restart
        attempts = [(0, list(range(0, crash + 1))), (1, list(range(resume, plan.steps)))]
    else:
        attempts = [(0, list(range(plan.steps)))]
    redone = set(range(plan.restart[1], plan.restart[0] + 1)) if plan.restart else set()
    t = T0
    start = T0
    for restart, steps in attempts:
        writers = [_RankWriter(plan, r, restart, out, rng) for r in range(plan.ranks)]
        init = t
        if restart:
            t += int(plan.restart[2] * MS)  # type: ignore[index]
            cat["restart"] += t - init
            init = t
        t += int(plan.startup_ms * MS)
        cat["restart" if restart else "startup"] += t - init
        for n in steps:
            lost = restart == 0 and n in redone
            t = _step(plan, writers, n, t, rng, cat, truth, lost, first=(n == steps[0]))
            if plan.other_ms:
                d = int(plan.other_ms * MS)
                for w in writers:
                    w.span("train.other", n, t, t + d, parent=w.step_ids(n)[1])
                cat["other"] += d
                t += d
            for name, ms in plan.siblings.get(n, ()):
                d = int(ms * MS)
                for w in writers:
                    w.span(name, n, t, t + d)
                key = {"train.checkpoint": "checkpoint", "train.eval": "eval", "train.gc": "gc"}[name]
                cat[key] += d
                t += d
            for w in writers:
                w.flush()
        t_end = t + int(plan.tail_ms * MS)
        cat["other"] += t_end - t
        for w in writers:
            if plan.tail_ms:
                w.span("user.finish", None, t, t_end)  # a span after the last step (not analysed)
            w.metrics(init if not restart else init, t_end)
            w.close()
        t = t_end
    truth.wall_ns = t - start
    truth.seconds = {k: v / 1e9 for k, v in cat.items()}
    return truth


def _step(plan: Plan, writers: list[_RankWriter], n: int, t: int, rng: random.Random, cat: dict[str, int],
          truth: Truth, lost: bool, first: bool) -> int:
    def ms(x: float) -> int:
        return int((x + (rng.uniform(0, plan.jitter_ms) if plan.jitter_ms else 0.0)) * MS)

    arrive, rank_phases = [], []
    hiccup = -1
    if plan.hiccup is not None and rng.random() < plan.hiccup[0]:
        hiccup = rng.randrange(len(writers))
    for w in writers:
        r = w.rank
        cur = t
        phases = []
        data_total = 0
        for mb in range(plan.micro_batches):
            extra = plan.straggler.get(r, 0.0) if plan.straggle_steps is None or n in plan.straggle_steps else 0.0
            if first:
                extra += plan.first_data_ms
            if r == hiccup and plan.hiccup is not None:
                extra += plan.hiccup[1] * rng.random()
            d = ms(plan.data_ms / plan.micro_batches + extra / plan.micro_batches)
            phases.append(("train.data", cur, cur + d, {"train.micro_batch": mb}))
            data_total += d
            cur += d
            f = ms(plan.forward_ms / plan.micro_batches + plan.slow_steps.get(n, 0.0) / plan.micro_batches)
            if first:
                f += int(plan.compile_ms * MS / plan.micro_batches)
            phases.append(("train.forward", cur, cur + f, {"train.micro_batch": mb}))
            cur += f
            b = ms(plan.backward_ms / plan.micro_batches)
            phases.append(("train.backward", cur, cur + b, {"train.micro_batch": mb}))
            cur += b
        arrive.append(cur)
        rank_phases.append((phases, data_total))
    together = max(arrive) + int(plan.collective_ms * MS)
    opt_end = together + int(plan.optimizer_ms * MS)
    end = opt_end + int(plan.zero_grad_ms * MS)
    for w, (phases, data_total), a in zip(writers, rank_phases, arrive):
        own, root = w.step_ids(n)
        if plan.ddp:
            name, s, _, attrs = phases[-1]
            phases[-1] = (name, s, together, attrs)  # the all-reduce completes inside backward
        else:
            phases.append(("train.collective", a, together, {"comm.op": "all_reduce", "comm.bytes": 4096}))
        phases.append(("train.optimizer", together, opt_end, {}))
        if plan.zero_grad_ms:
            phases.append(("train.zero_grad", opt_end, end, {}))
        for name, s, e, attrs in phases:
            if plan.device and name in ("train.forward", "train.backward", "train.optimizer"):
                attrs = {**attrs, "device.duration_s": (e - s) / 1e9 * 0.8, "device.lag_s": (e - s) / 1e9 * 0.1,
                         "device.type": "cuda"}
            w.span(name, n, s, e, parent=own, **attrs)
        if n in plan.gc:
            g0 = phases[1][1] + (phases[1][2] - phases[1][1]) // 4
            w.span("train.gc", n, g0, g0 + int(plan.gc[n] * MS))
        tags = [name.split(".", 1)[1] for name, _ in plan.siblings.get(n, ())]
        if n in plan.gc:
            tags.append("gc")
        attrs: dict[str, Any] = {"train.epoch": 0, "train.micro_batches": plan.micro_batches,
                                 "train.step.time_s": (end - t) / 1e9}
        if tags:
            attrs["train.step.tags"] = tags
        w.span("train.step", n, t, end, parent=root, span_id=own, **attrs)
    dur = end - t
    truth.step_ns[n] = dur
    if lost:
        cat["restart"] += dur
    else:
        gc = int(plan.gc.get(n, 0.0) * MS)
        data = sum(d for _, d in rank_phases) // len(rank_phases)
        cat["gc"] += gc
        cat["data"] += data
        compile_ns = int(plan.compile_ms * MS) if first else 0
        cat["compile"] += compile_ns
        cat["productive"] += dur - gc - data - compile_ns
    return end


#: Pipeline scenarios: (trainer's dispatch wait ms a step, actors' generate ms, actors' idle ms between calls)
PIPELINES = {
    "inference-bound": (30.0, 95.0, 5.0),
    "data-transfer-bound": (30.0, 40.0, 60.0),
    "training-bound": (0.5, 30.0, 70.0),
    "balanced": (1.0, 90.0, 10.0),
}


def write_pipeline(kind: str, path: str | os.PathLike[str], steps: int = 40, actors: int = 3,
                   first_wait_ms: float = 0.0, links: bool = False) -> dict[int, str]:
    """One OTLP JSON lines dump (a receiver's view): a trainer whose steps wait in
    `pipeline.dispatch_wait`, and `actors` inference processes calling `infer.generate`,
    timed as `PIPELINES[kind]` says, plus their capacity metrics; `first_wait_ms`: the first
    step's wait for the actors to start (a warm-up, on top of the usual wait). `links`: each step
    links the last generate call that ended before it (returned: step -> that span's id)."""
    wait_ms, gen_ms, idle_ms = PIPELINES[kind]
    rng = random.Random(1)
    plan = Plan(ranks=1, run_id=f"pipe-{kind}")
    trainer = {"service.name": "trainer", "ml.run.id": plan.run_id, "ml.rank": 0, "ml.world_size": 1,
               "ml.role": "trainer", "ml.restart": 0, "service.instance.id": "trainer-0"}
    lines = []
    timing = []  # (step, its start, its phases)
    t = T0
    for n in range(steps):
        cur, phases = t, []
        for name, d in (("pipeline.dispatch_wait", wait_ms + (first_wait_ms if n == 0 else 0.0)),
                        ("train.forward", 30.0), ("train.backward", 60.0), ("train.optimizer", 10.0)):
            phases.append((name, cur, cur + int(d * MS)))
            cur += int(d * MS)
        timing.append((n, t, phases))
        t = cur
    end = t
    produced: list[tuple[int, str]] = []  # (end, span id) of every generate call
    actor_lines = []
    for a in range(actors):
        res = {"service.name": "actor", "ml.run.id": plan.run_id, "ml.role": "inference", "ml.rank": a,
               "service.instance.id": f"actor-{a}"}
        spans, cur = [], T0 + a * MS
        while cur < end:
            g = int(gen_ms * MS)
            span = {**_raw(plan.run_id, "infer.generate", None, cur, cur + g, None, rng),
                    "traceId": f"{rng.getrandbits(128):032x}"}
            spans.append(span)
            produced.append((cur + g, span["spanId"], span["traceId"]))
            cur += g + int(idle_ms * MS)
        actor_lines.append({"resourceSpans": [{"resource": {"attributes": _kv(res)},
                                               "scopeSpans": [{"spans": spans}]}]})
        util = gen_ms / (gen_ms + idle_ms)
        actor_lines.append({"resourceMetrics": [{"resource": {"attributes": _kv(res)}, "scopeMetrics": [{"metrics": [
            {"name": "infer.capacity", "unit": "{sample}/s", "gauge": {"dataPoints": [
                {"startTimeUnixNano": str(T0), "timeUnixNano": str(end), "asDouble": 8 * 1000 / gen_ms * util}]}}]}]}]})
    produced.sort()
    linked: dict[int, str] = {}
    spans = []
    for n, start, phases in timing:
        parent = f"{step_span_id(plan.run_id, n, 0):016x}"
        for name, p0, p1 in phases:
            spans.append(_raw(plan.run_id, name, n, p0, p1, parent, rng))
        step = _raw(plan.run_id, "train.step", n, start, phases[-1][2], None, rng, span_id=parent)
        before = [p for p in produced if p[0] <= phases[0][2]]
        if links and before:
            step["links"] = [{"traceId": before[-1][2], "spanId": before[-1][1]}]
            linked[n] = before[-1][1]
        spans.append(step)
    lines.append({"resourceSpans": [{"resource": {"attributes": _kv(trainer)}, "scopeSpans": [{"spans": spans}]}]})
    lines += actor_lines
    with open(path, "w", encoding="utf-8") as f:
        for doc in lines:
            f.write(json.dumps(doc) + "\n")
    return linked


def _raw(run_id: str, name: str, step: int | None, t0: int, t1: int, parent: str | None, rng: random.Random,
         span_id: str | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"traceId": f"{trace_id_for(run_id, step):032x}",
                         "spanId": span_id or f"{rng.getrandbits(64):016x}", "name": name,
                         "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t1),
                         "attributes": _kv({"train.step": step} if step is not None else {})}
    if parent:
        s["parentSpanId"] = parent
    return s


def main() -> None:
    parser = argparse.ArgumentParser(description="write a scripted run (for measuring diagnose)")
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--straggler", type=int, default=None, help="a rank late by 20 ms a step")
    parser.add_argument("--device", action="store_true")
    parser.add_argument("--sample", type=int, default=None, help="phase spans of K ranks a step (sample:K)")
    args = parser.parse_args()
    plan = Plan(ranks=args.ranks, steps=args.steps, straggler={args.straggler: 20.0} if args.straggler is not None
                else {}, jitter_ms=1.0, device=args.device, siblings={args.steps // 2: [("train.checkpoint", 300.0)]},
                offsets_ms={r: (r % 7 - 3) * 1.5 for r in range(args.ranks)}, sample=args.sample)
    truth = write_run(plan, args.out)
    print(json.dumps({"wall_s": truth.wall_ns / 1e9, "seconds": truth.seconds}))


if __name__ == "__main__":
    main()
