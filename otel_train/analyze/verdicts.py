"""One-line verdicts: the pipeline's bottleneck, the phase breakdown, and the run's headline.

Pipeline (a trainer fed by inference actors, the TorchSpec seed's shape). Two numbers decide:

- the trainer's *wait share*: `pipeline.dispatch_wait` time over its step time;
- the actors' *utilisation*: `infer.generate` time over each actor's active window
  (its first span's start to its last span's end), averaged over actors.

| wait share | actors saturated | verdict |
|---|---|---|
| >= 10 % | yes | inference-bound: actors generate flat out and the trainer still waits |
| >= 10 % | no  | data-transfer-bound: actors have spare capacity, yet samples do not arrive |
| <  10 % | no  | training-bound: the trainer never waits, actors idle waiting for it |
| <  10 % | yes | balanced |

Saturated: utilisation >= 80 %, or, where both capacities were exported, the trainer could take
at least 80 % of what the actors can supply (`train.capacity` >= 0.8 x `infer.capacity`, each
summed over processes): the same bound from the capacities, which a short or loaded run's gaps
between calls (the actor idle between two tasks of its queue) do not blur.

10 %: below it the trainer loses less to waiting than a step's usual jitter. 80 %: past it a
producer is saturated (queueing delay grows steeply as utilisation nears 1), below it the
actors demonstrably had 20 % of their time to spare. The capacities `infer.capacity` and
`train.capacity` and the realised `pipeline.throughput` (samples/s, each summed over the
processes that export it: `export/pipeline_metrics.py`) are shown beside the verdict as its numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from otel_train import semconv
from otel_train.analyze.model import OUTSIDE, PHASES, Interval, RankStep

WAIT_SHARE = 0.10
UTILISATION = 0.80
INFERENCE_BOUND, TRANSFER_BOUND, TRAINING_BOUND, BALANCED = (
    "inference-bound", "data-transfer-bound", "training-bound", "balanced")


@dataclass
class PipelineVerdict:
    verdict: str
    wait_share: float  # trainer's dispatch_wait / step time
    utilisation: float  # actors' generate time / active time, mean over actors
    actors: int
    generate_calls: int
    capacities: dict[str, float] = field(default_factory=dict)  # metric name -> last value (sum over processes)
    warmup_steps: int = 0  # the trainer's leading steps left out (actors starting, compilation)

    def line(self) -> str:
        after = f" after the warm-up ({self.warmup_steps} step{'s' if self.warmup_steps != 1 else ''} left out)" \
            if self.warmup_steps else ""
        text = (f"pipeline {self.verdict}: trainer waited {self.wait_share:.0%} of its step time for samples{after}; "
                f"{self.actors} inference actor{'s' if self.actors != 1 else ''} busy {self.utilisation:.0%} "
                f"of their time ({self.generate_calls} generate calls)")
        said = [f"{words} {self.capacities[name]:.1f} samples/s ({name})" for name, words in _CAPACITY_WORDS.items()
                if name in self.capacities]
        if said:
            text += "; " + ", ".join(said)
        return text


#: How the pipeline gauges read in the verdict line (summed over processes), in this order.
_CAPACITY_WORDS = {semconv.METRIC_INFER_CAPACITY: "actors supply", semconv.METRIC_TRAIN_CAPACITY: "trainer takes",
                   semconv.METRIC_PIPELINE_THROUGHPUT: "realised"}


def classify(wait_share: float, utilisation: float, demand_share: float | None = None) -> str:
    """The table in the module docstring; `demand_share`: `train.capacity` / `infer.capacity`."""
    saturated = utilisation >= UTILISATION or (demand_share is not None and demand_share >= UTILISATION)
    if wait_share >= WAIT_SHARE:
        return INFERENCE_BOUND if saturated else TRANSFER_BOUND
    return BALANCED if saturated else TRAINING_BOUND


def pipeline_verdict(steps: Iterable[RankStep], actor_spans: Iterable[Interval],
                     capacities: Mapping[str, float] | None = None, warmup_steps: int = 0) -> PipelineVerdict | None:
    """The verdict, or None when the run has neither dispatch waits nor inference spans; `steps`
    are the steady state's (the caller left `warmup_steps` out: a trainer waiting for actors to
    start is not a transfer bottleneck)."""
    step_ns = wait_ns = 0
    wait_code = PHASES.index(semconv.SPAN_DISPATCH_WAIT)
    for rs in steps:
        step_ns += rs.duration
        wait_ns += rs.totals[wait_code] if rs.totals else 0
    windows: dict[tuple[str, int], list[int]] = {}
    calls = 0
    for s in actor_spans:
        if s.name != semconv.SPAN_INFER_GENERATE:
            continue
        calls += 1
        w = windows.setdefault((s.instance, s.rank), [s.start, s.end, 0])
        w[0], w[1] = min(w[0], s.start), max(w[1], s.end)
        w[2] += s.end - s.start
    if not wait_ns and not calls:
        return None
    utils = [busy / (b - a) for a, b, busy in windows.values() if b > a]
    util = min(1.0, sum(utils) / len(utils)) if utils else 0.0
    share = wait_ns / step_ns if step_ns else 0.0
    caps = dict(capacities or {})
    supply, demand = caps.get(semconv.METRIC_INFER_CAPACITY), caps.get(semconv.METRIC_TRAIN_CAPACITY)
    demand_share = demand / supply if supply and demand is not None else None
    return PipelineVerdict(classify(share, util, demand_share), share, util, len(windows), calls, caps, warmup_steps)


def phase_shares(steps: Iterable[RankStep]) -> dict[str, float]:
    """Each phase's share of the summed step time (phases in `PHASES` order, then the rest)."""
    total = 0
    sums = [0] * len(PHASES)
    for rs in steps:
        total += rs.duration
        for code, ns in enumerate(rs.totals):
            sums[code] += ns
    if not total:
        return {}
    shares = {name: sums[code] / total for code, name in enumerate(PHASES) if sums[code]}
    shares[OUTSIDE] = max(0.0, 1.0 - sum(shares.values()))
    return shares


_PLAIN = {semconv.SPAN_DATA: "data wait", semconv.SPAN_DISPATCH_WAIT: "waiting for samples",
          semconv.SPAN_COLLECTIVE: "collectives", semconv.SPAN_FORWARD: "forward",
          semconv.SPAN_BACKWARD: "backward", semconv.SPAN_OPTIMIZER: "optimizer", semconv.SPAN_ZERO_GRAD: "zero_grad"}


def breakdown_headline(shares: Mapping[str, float]) -> str:
    """'data wait 31% of step time' when data wait is notable (>= 10 %), else the largest phase
    (or the time outside any phase span, when that is larger)."""
    if not shares:
        return "no step phases recorded"
    data = shares.get(semconv.SPAN_DATA, 0.0)
    if data >= WAIT_SHARE:
        return f"data wait {data:.0%} of step time"
    name = max((n for n in shares if n in _PLAIN), key=lambda n: shares[n], default=None)
    outside = shares.get(OUTSIDE, 0.0)
    if name is None or outside > shares[name]:
        return f"{outside:.0%} of step time outside phase spans (code between the phases)"
    return f"{_PLAIN[name]} {shares[name]:.0%} of step time"
