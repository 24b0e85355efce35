"""Span trees per training step, for asserting exactly what automatic instrumentation emitted.

Works on the receiver's span dicts (`OTLPReceiver.spans()`) and on SDK `ReadableSpan`s alike
(`as_dicts`). `tree(spans)` groups them: one `StepView` per `train.step` span with its children
in start order, the step siblings (eval, checkpoint, GC) and whatever else is left.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_train import semconv

PHASE_NAMES = {semconv.SPAN_DATA: "data", semconv.SPAN_FORWARD: "forward", semconv.SPAN_BACKWARD: "backward",
               semconv.SPAN_OPTIMIZER: "optimizer", semconv.SPAN_ZERO_GRAD: "zero_grad",
               semconv.SPAN_COLLECTIVE: "collective", semconv.SPAN_OTHER: "other"}


def as_dicts(spans: Iterable[Any]) -> list[dict[str, Any]]:
    """SDK ReadableSpans -> the receiver's dict shape (dicts pass through)."""
    out = []
    for span in spans:
        if isinstance(span, dict):
            out.append(span)
            continue
        parent = span.parent.span_id if span.parent is not None else None
        out.append({
            "name": span.name, "trace_id": f"{span.context.trace_id:032x}",
            "span_id": f"{span.context.span_id:016x}",
            "parent_span_id": f"{parent:016x}" if parent else None,
            "start_ns": span.start_time, "end_ns": span.end_time,
            "attributes": dict(span.attributes or {}),
            "resource": dict(span.resource.attributes) if span.resource is not None else {},
        })
    return out


@dataclass
class StepView:
    n: int
    span: dict[str, Any]
    children: list[dict[str, Any]] = field(default_factory=list)

    @property
    def attrs(self) -> dict[str, Any]:
        return self.span["attributes"]

    @property
    def tags(self) -> set[str]:
        return set(self.attrs.get(semconv.TRAIN_STEP_TAGS) or ())

    def shape(self, other: bool = False) -> list[tuple[str, int | None]]:
        """Children as (short name, micro-batch) in start order, GC pauses left out, and the
        `train.other` spans covering the script's own code unless `other`."""
        return [(PHASE_NAMES.get(c["name"], c["name"]), c["attributes"].get(semconv.TRAIN_MICRO_BATCH))
                for c in self.children if c["name"] != semconv.SPAN_GC
                and (other or c["name"] != semconv.SPAN_OTHER)]

    def phases(self) -> list[dict[str, Any]]:
        """Children other than `train.other` and GC pauses, in start order."""
        return [c for c in self.children if c["name"] not in (semconv.SPAN_GC, semconv.SPAN_OTHER)]

    def named(self, name: str) -> list[dict[str, Any]]:
        return [c for c in self.children if c["name"] == name]


@dataclass
class Tree:
    steps: dict[int, StepView]
    siblings: list[dict[str, Any]]  # eval, checkpoint, gc: parented outside any step
    others: list[dict[str, Any]]
    between: list[dict[str, Any]] = field(default_factory=list)  # train.other between steps

    def siblings_named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.siblings if s["name"] == name]


def tree(spans: Iterable[Any]) -> Tree:
    spans = sorted(as_dicts(spans), key=lambda s: (s["start_ns"], s["end_ns"]))
    steps: dict[int, StepView] = {}
    for span in spans:
        if span["name"] == semconv.SPAN_STEP:
            n = span["attributes"][semconv.TRAIN_STEP]
            assert n not in steps, f"two train.step spans for step {n}"
            steps[n] = StepView(n, span)
    by_id = {s.span["span_id"]: s for s in steps.values()}
    siblings, between, others = [], [], []
    for span in spans:
        if span["name"] == semconv.SPAN_STEP:
            continue
        parent = by_id.get(span["parent_span_id"])
        if parent is not None:
            parent.children.append(span)
        elif span["name"] in semconv.STEP_SIBLING_SPANS:
            siblings.append(span)
        elif span["name"] == semconv.SPAN_OTHER and span["parent_span_id"] not in by_id:
            between.append(span)
        else:
            others.append(span)
    return Tree(dict(sorted(steps.items())), siblings, others, between)


def check_invariants(t: Tree, times: bool = True) -> None:
    """What holds for every run: consecutive 0-based steps; each child names its step; siblings
    have their step's parent (roots on rank 0) and tag the step they follow, and so, untagged,
    does the script's own time between steps (`train.other`); with `times`, children lie inside
    their step, steps do not overlap and no sibling lies inside a step."""
    assert list(t.steps) == list(range(len(t.steps))), f"steps not 0..n-1: {list(t.steps)}"
    for view in t.steps.values():
        for child in view.children:
            assert child["attributes"].get(semconv.TRAIN_STEP) == view.n, (child["name"], view.n)
            assert child["trace_id"] == view.span["trace_id"]
            if times:
                assert view.span["start_ns"] <= child["start_ns"] <= child["end_ns"] <= view.span["end_ns"], \
                    f"{child['name']} outside step {view.n}"
    for sibling in t.siblings:
        n = sibling["attributes"].get(semconv.TRAIN_STEP)
        if n is None:
            assert sibling["parent_span_id"] is None, sibling
            continue
        # a sibling of its step: the same parent (rank 0's step span; none on rank 0)
        assert sibling["parent_span_id"] == t.steps[n].span["parent_span_id"], sibling
        tag = {semconv.SPAN_EVAL: semconv.TAG_EVAL, semconv.SPAN_CHECKPOINT: semconv.TAG_CHECKPOINT,
               semconv.SPAN_GC: semconv.TAG_GC}[sibling["name"]]
        assert tag in t.steps[n].tags, f"{sibling['name']} after step {n} did not tag it"
        assert sibling["trace_id"] == t.steps[n].span["trace_id"]
    for span in t.between:
        n = span["attributes"][semconv.TRAIN_STEP]
        assert span["parent_span_id"] == t.steps[n].span["parent_span_id"], span
        assert span["trace_id"] == t.steps[n].span["trace_id"]
    for view in t.steps.values():
        if semconv.TAG_GC in view.tags:
            assert any(s["name"] == semconv.SPAN_GC and s["attributes"].get(semconv.TRAIN_STEP) == view.n
                       for s in t.siblings), f"step {view.n} tagged gc without a gc span"
    if not times:
        return
    ordered = list(t.steps.values())
    for a, b in zip(ordered, ordered[1:]):
        assert a.span["end_ns"] <= b.span["start_ns"], f"steps {a.n} and {b.n} overlap"
    for sibling in t.siblings + t.between:
        if sibling["name"] == semconv.SPAN_GC:
            continue
        for view in ordered:
            inside = view.span["start_ns"] < sibling["start_ns"] < view.span["end_ns"] or \
                view.span["start_ns"] < sibling["end_ns"] < view.span["end_ns"]
            assert not inside, f"{sibling['name']} inside step {view.n}"


def plain_tags(view: StepView) -> set[str]:
    """The step's tags without `gc` and `slow` (GC pauses and slow steps on a busy machine come
    when they come)."""
    return view.tags - {semconv.TAG_GC, semconv.TAG_SLOW}
