"""Goodput and slow steps while the run goes: `analyze/`'s rules, applied step by step.

The span assembler feeds a `RunAccount` in recording order: every step as it is held (its
start, its device-synchronised end and its own time), the siblings (checkpoint, eval, GC) and
the data-wait durations. From that it keeps, with the rules `otel-train diagnose` applies to
the files afterwards (`analyze/slow.py`, `analyze/goodput.py`):

- **slow steps**: `step()` says whether the step's own time is slow by `analyze/slow.py`'s rule
  (over median + 3 x 1.4826 MAD of the 100 steps before it, from the 11th step on); the
  assembler then tags the step `slow`;
- **goodput**: the wall time from `otel_train.init` to the last record seen, painted step by
  step into categories (`goodput.paint`: each instant to one category, so they add up to the
  wall time by construction). Startup runs from init to the first step (after an elastic
  restart, `ml.restart` > 0, that time is `restart`); data wait is moved out of step time by its
  duration (the fast path gives durations, not intervals); compilation is the warm-up steps'
  excess over the ideal step time less their data wait (`goodput.warmup_excess`: a first batch
  that took 2 s is data wait once, not compilation too), recomputed as the window moves.

What only the files can tell is left to `diagnose`: steps redone after a restart (they need the
earlier attempt's spans), clock skew between ranks, and the job-wide mean over ranks. This is
one rank's account.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from otel_train import semconv
from otel_train.analyze import goodput as gp
from otel_train.analyze.slow import SlowStepRule, ideal_step_time, slow_bound

SLOW_TAG = semconv.TAG_SLOW
COMPILE_TAG = "compile"
#: Spans whose duration is data wait (`data` badput), as in `diagnose`.
DATA_SPANS = frozenset({semconv.SPAN_DATA, semconv.SPAN_DISPATCH_WAIT})
_SIBLING_CATEGORY = {semconv.SPAN_CHECKPOINT: gp.CHECKPOINT, semconv.SPAN_EVAL: gp.EVAL, semconv.SPAN_GC: gp.GC}
#: Leading steps kept for the warm-up's excess: compilation is over long before this.
_LEADING_KEPT = 256


class RunAccount:
    """One rank's goodput and slow-step rule, fed in recording order (wall-clock ns)."""

    def __init__(self, start_ns: int, restart: int = 0, rule: SlowStepRule | None = None) -> None:
        self.start_ns = start_ns
        self.painted_to = start_ns  # categories are final up to here (the last step's end)
        self.last_ns = start_ns  # the latest end of anything seen: the window's end
        self.totals = dict.fromkeys(gp.CATEGORIES, 0)
        self.open: list[tuple[int, int, str]] = []  # intervals not painted yet
        self.startup = gp.RESTART if restart else gp.STARTUP
        self.rule = rule or SlowStepRule()
        self.steps = 0
        self.slow_steps = 0
        self.data_ns = 0
        self._data_before = 0  # data_ns when the previous step ended: the rest is this step's
        #: The first steps' (own time, data wait) ns: the warm-up's candidates.
        self.leading: list[tuple[int, int]] = []
        self.tagged: list[tuple[int, int]] = []  # the same of later steps tagged `compile`

    # -- fed by the span assembler ---------------------------------------------------------
    def sibling(self, name: str, start_ns: int, end_ns: int) -> None:
        """A checkpoint, eval or GC span (other siblings, the latency benchmark, stay `other`)."""
        category = _SIBLING_CATEGORY.get(name)
        if category is not None:
            self.open.append((start_ns, end_ns, category))
        self.seen(end_ns)

    def data(self, ns: int) -> None:
        """Data wait inside steps (`DATA_SPANS`), by duration."""
        self.data_ns += ns

    def seen(self, end_ns: int) -> None:
        if end_ns > self.last_ns:
            self.last_ns = end_ns

    def step(self, start_ns: int, end_ns: int, own_s: float, tags: Iterable[str] = ()) -> bool:
        """A step, in order: paint up to its end; True when it is slow (tag it `slow`)."""
        if self.steps == 0:
            self.open.append((self.painted_to, start_ns, self.startup))
        self.steps += 1
        painted_to = self.painted_to
        if end_ns > painted_to:
            if not self.open:
                # The usual step, nothing beside it: what `paint` would say, without its sort.
                begin = start_ns if start_ns > painted_to else painted_to
                totals = self.totals
                totals[gp.OTHER] += begin - painted_to
                totals[gp.PRODUCTIVE] += end_ns - begin
            else:
                self.open.append((start_ns, end_ns, gp.PRODUCTIVE))
                for category, ns in gp.paint(painted_to, end_ns, self.open).items():
                    self.totals[category] += ns
                self.open = [iv for iv in self.open if iv[1] > end_ns]
            self.painted_to = end_ns
        self.seen(end_ns)
        leading = self.leading
        timed = (int(own_s * 1e9), self.data_ns - self._data_before)
        self._data_before = self.data_ns
        if len(leading) < _LEADING_KEPT and len(leading) == self.steps - 1:
            leading.append(timed)
        elif tags and COMPILE_TAG in tags:
            self.tagged.append(timed)
        slow = self.rule.observe(own_s)
        self.slow_steps += slow
        return slow

    # -- read by the metrics and at shutdown ------------------------------------------------
    def snapshot(self) -> dict[str, int]:
        """ns per category (all of `goodput.CATEGORIES`) from init to the last record seen."""
        out = dict(self.totals)
        if self.last_ns > self.painted_to:
            tail = self.open if self.steps else [*self.open, (self.painted_to, self.last_ns, self.startup)]
            for category, ns in gp.paint(self.painted_to, self.last_ns, tail).items():
                out[category] += ns
        moved = min(self.data_ns, out[gp.PRODUCTIVE])
        out[gp.PRODUCTIVE] -= moved
        out[gp.DATA] += moved
        return gp.take_compile(out, self.compile_ns())

    def compile_ns(self) -> int:
        """The warm-up's excess over the ideal step time, and that of later steps tagged `compile`."""
        recent = list(self.rule.recent)
        bound, ideal = slow_bound(recent), ideal_step_time(recent)
        if bound is None or ideal is None:
            return 0
        bound_ns, ideal_ns = bound * 1e9, ideal * 1e9  # the rule keeps seconds
        excess = gp.warmup_excess(self.leading, bound_ns, ideal_ns)
        return excess + sum(gp.excess(t, data, ideal_ns) for t, data in self.tagged)

    def summary(self) -> dict[str, Any]:
        """What the shutdown line says (JSON-ready: the exporter process reports it on stdout)."""
        totals = self.snapshot()
        wall = sum(totals.values())
        return {"wall_s": wall / 1e9, "goodput": gp.goodput(totals), "steps": self.steps,
                "slow_steps": self.slow_steps, "seconds": {c: ns / 1e9 for c, ns in totals.items()}}


def summary_line(summary: Mapping[str, Any], rank: int) -> str:
    """The one goodput line printed at shutdown, e.g.
    `otel_train: goodput 81.2% of 1m02s since init on rank 0: startup 9.8%, data 6.0%, ...; 2 of 480
    steps slow (over median + 3 sigma, tagged 'slow')`: the window and the figures `diagnose` gives
    for this rank (`goodput.per_rank` in its --json)."""
    wall = float(summary.get("wall_s", 0.0))
    seconds = summary.get("seconds", {})
    parts = [f"{c} {seconds[c] / wall:.1%}" for c in gp.CATEGORIES
             if c != gp.PRODUCTIVE and wall > 0 and seconds.get(c, 0.0) / wall >= 0.0005]
    line = f"otel_train: goodput {float(summary.get('goodput', 0.0)):.1%} of {_duration(wall)} since init on rank {rank}"
    if parts:
        line += ": " + ", ".join(parts)
    steps = int(summary.get("steps", 0))
    if steps:
        line += f"; {int(summary.get('slow_steps', 0))} of {steps} steps slow (over median + 3 sigma, tagged {SLOW_TAG!r})"
    return line


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
