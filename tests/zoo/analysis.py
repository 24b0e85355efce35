"""What a zoo run's spans say: steps per rank, phases per step, coverage, misplaced events.

Works on the receiver's span dicts (tests/otlp_receiver.py). Span and attribute names are the
wire contract (CONVENTIONS.md §3-4), spelled here as strings so the zoo reads the wire the way
a trace backend does, whatever the package's modules are called.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

STEP, DATA, FORWARD, BACKWARD = "train.step", "train.data", "train.forward", "train.backward"
OPTIMIZER, COLLECTIVE, CHECKPOINT, EVAL, GC = ("train.optimizer", "train.collective", "train.checkpoint",
                                               "train.eval", "train.gc")
SIBLINGS = (CHECKPOINT, EVAL, GC)
A_STEP, A_MICRO_BATCH, A_MICRO_BATCHES = "train.step", "train.micro_batch", "train.micro_batches"
RANK_KEY = "ml.rank"

Span = dict[str, Any]


def rank_of(span: Span) -> int:
    return int(span["resource"].get(RANK_KEY) or 0)


@dataclass
class StepTree:
    """One rank's train.step span and every span below it (any depth), in start order."""

    n: int
    span: Span
    below: list[Span] = field(default_factory=list)

    @property
    def duration_ns(self) -> int:
        return self.span["end_ns"] - self.span["start_ns"]

    def named(self, name: str) -> list[Span]:
        return [s for s in self.below if s["name"] == name]

    def counts(self) -> Counter[str]:
        return Counter(s["name"] for s in self.below)

    def covered_ns(self) -> int:
        """Time of the step covered by at least one span below it."""
        return union_ns(self.below, self.span["start_ns"], self.span["end_ns"])

    def uncovered_s(self) -> float:
        return (self.duration_ns - self.covered_ns()) / 1e9


@dataclass
class RankView:
    rank: int
    steps: dict[int, StepTree]
    outside: list[Span]  # every span of the rank not under a train.step (siblings, pre-loop work)

    def outside_named(self, name: str) -> list[Span]:
        return [s for s in self.outside if s["name"] == name]

    def loop_bounds(self) -> tuple[int, int]:
        """From the first step's start to the last step's end: the training loop's wall time."""
        spans = [t.span for t in self.steps.values()]
        return min(s["start_ns"] for s in spans), max(s["end_ns"] for s in spans)

    def loop_attributed(self) -> float:
        """Share of the loop's wall time inside a span other than train.step itself: a phase
        under a step, or a sibling (eval, checkpoint, GC) between steps."""
        lo, hi = self.loop_bounds()
        phases = [s for t in self.steps.values() for s in t.below] + self.outside
        return union_ns(phases, lo, hi) / (hi - lo) if hi > lo else 1.0


def union_ns(spans: Iterable[Span], lo: int, hi: int) -> int:
    """Length of the union of the spans' intervals, clipped to [lo, hi]."""
    intervals = sorted((max(s["start_ns"], lo), min(s["end_ns"], hi)) for s in spans)
    total, cur_lo, cur_hi = 0, None, None
    for a, b in intervals:
        if b <= a:
            continue
        if cur_hi is None or a > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = a, b
        else:
            cur_hi = max(cur_hi, b)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def by_rank(spans: Iterable[Span]) -> dict[int, RankView]:
    spans = list(spans)
    per_rank: dict[int, list[Span]] = defaultdict(list)
    for span in spans:
        per_rank[rank_of(span)].append(span)
    views = {}
    for rank, mine in sorted(per_rank.items()):
        by_id = {s["span_id"]: s for s in mine}
        steps: dict[int, StepTree] = {}
        for span in mine:
            if span["name"] == STEP:
                n = span["attributes"].get(A_STEP)
                assert n not in steps, f"rank {rank}: two train.step spans for step {n}"
                steps[n] = StepTree(n, span)
        by_step_id = {t.span["span_id"]: t for t in steps.values()}
        outside = []
        for span in sorted(mine, key=lambda s: (s["start_ns"], s["end_ns"])):
            if span["name"] == STEP:
                continue
            owner = _owning_step(span, by_id, by_step_id)
            (owner.below if owner is not None else outside).append(span)
        views[rank] = RankView(rank, dict(sorted(steps.items())), outside)
    return views


def _owning_step(span: Span, by_id: dict[str, Span], steps: dict[str, StepTree]) -> StepTree | None:
    seen = set()
    parent = span.get("parent_span_id")
    while parent and parent not in seen:
        if parent in steps:
            return steps[parent]
        seen.add(parent)
        up = by_id.get(parent)
        parent = up.get("parent_span_id") if up is not None else None
    return None


def events_outside(spans: Iterable[Span]) -> list[tuple[str, str, float]]:
    """(span name, event name, ms outside the span) for every event timestamped outside its span."""
    out = []
    for span in spans:
        for event in span.get("events", ()):
            t = event["time_ns"]
            if t < span["start_ns"] or t > span["end_ns"]:
                off = (span["start_ns"] - t) if t < span["start_ns"] else (t - span["end_ns"])
                out.append((span["name"], event["name"], off / 1e6))
    return out


#: Spans exported in different drains are converted to wall time with different (perf_counter,
#: wall) anchors (docs/trace-shape.md, "Timestamps"): edges that touch on the host may differ by
#: a few hundred ns on the wire. Overlaps up to this much are that, not a misplaced span.
ANCHOR_JITTER_NS = 5_000


def inside_any_step(span: Span, view: RankView) -> int | None:
    """The step whose interval contains part of `span` (more than the anchors' jitter), if any."""
    for tree in view.steps.values():
        s = tree.span
        if s["start_ns"] + ANCHOR_JITTER_NS < span["end_ns"] and span["start_ns"] + ANCHOR_JITTER_NS < s["end_ns"]:
            return tree.n
    return None


def uncovered_attribute(step: Span) -> float | None:
    """The value of the step's `*uncovered_s` attribute (the issue's `train.step.uncovered_s`)."""
    for key, value in step["attributes"].items():
        if key.endswith("uncovered_s"):
            return float(value)
    return None


# --- a printable summary, for FINDINGS.md -----------------------------------------------------
def summary(run: Any, spans: list[Span]) -> str:
    lines = [f"## {run.name}: exit {run.returncode}, {run.wall_s:.1f} s wall"]
    counts = run.counts()
    lines.append(f"   independent count: {{rank: steps}} = { {r: c['steps'] for r, c in counts.items()} }"
                 + (f", LBFGS closure calls per step {counts[0]['func_evals']}" if counts.get(0, {}).get(
                     'func_evals') else ""))
    for rank, probe in run.probes().items():
        lines.append(f"   probe rank {rank}: " + ", ".join(f"{k}={v}" for k, v in probe.items()
                                                          if k not in ("pid", "rank")))
    if run.mode != "otel":
        return "\n".join(lines)
    views = by_rank(spans)
    for rank, view in views.items():
        per_step = [dict(t.counts()) for t in view.steps.values()]
        kinds = Counter(tuple(sorted(c.items())) for c in per_step)
        lines.append(f"   rank {rank}: {len(view.steps)} train.step spans; per-step children: "
                     + "; ".join(f"{n}x {dict(k)}" for k, n in kinds.most_common()))
        if view.steps:
            cov = [1 - t.uncovered_s() * 1e9 / t.duration_ns for t in view.steps.values() if t.duration_ns]
            dur = [t.duration_ns / 1e6 for t in view.steps.values()]
            lines.append(f"   rank {rank}: step coverage min {min(cov):.1%} median {sorted(cov)[len(cov) // 2]:.1%}; "
                         f"loop attributed {view.loop_attributed():.2%}; step ms first 10 "
                         f"{[round(d, 1) for d in dur[:10]]}")
        outside = Counter(s["name"] for s in view.outside)
        lines.append(f"   rank {rank}: outside steps: {dict(outside)}; "
                     f"of them inside a step's interval: "
                     f"{[(s['name'], inside_any_step(s, view)) for s in view.outside if inside_any_step(s, view) is not None]}")
    bad = events_outside(spans)
    lines.append(f"   events outside their span: {len(bad)} {bad[:5]}")
    closing = [line for line in run.stderr.splitlines() if line.startswith("otel_train:")]
    lines.append(f"   closing lines: {closing}")
    return "\n".join(lines)
