"""`diagnose`: read a run, align its clocks, and answer where the time went.

`analyse(path)` streams the files once (`reader` -> `model.build`), then runs the analyses on
the reduced data: clock skew (`skew`), stragglers per step and over the run (`stragglers`),
slow steps (`slow`), goodput (`accounting`), the pipeline verdict and the phase breakdown
(`verdicts`). The result, a `Diagnosis`, is what `diagnose` prints (`text`), what `--json`
writes (`to_json`) and what `report` draws.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from otel_train import semconv
from otel_train.analyze import reader, slow
from otel_train.analyze.accounting import Goodput, account
from otel_train.analyze.load import load
from otel_train.analyze.model import RunData, traced
from otel_train.analyze.skew import Skew, estimate
from otel_train.analyze.stragglers import RanksVerdict, StepRanks, analyse_step, verdict
from otel_train.analyze.verdicts import PipelineVerdict, breakdown_headline, phase_shares, pipeline_verdict


@dataclass
class Diagnosis:
    source: str
    note: str
    run_id: str
    ranks: list[int]
    world_size: int
    steps: list[int]
    spans: int
    bad_lines: int
    skew: Skew
    step_ranks: list[StepRanks]
    ranks_verdict: RanksVerdict
    job_step_ns: dict[int, int]  # step -> median over ranks of its duration
    slow_steps: list[int]
    severity: dict[int, float]  # slow step -> its time over the median it was judged against
    warmup: frozenset[int]
    goodput: Goodput
    pipeline: PipelineVerdict | None
    shares: dict[str, float]
    headline: str
    restarts: int
    data: RunData = field(repr=False)


def analyse(path: str | Path, workers: int | None = None, run_id: str | None = None) -> Diagnosis:
    """Read `path` (see `reader.find_sources`) and diagnose the run (`workers`, `run_id`: see
    `load.load`)."""
    sources = reader.find_sources(path)
    stats = reader.Stats()
    data, capacities = load(sources, stats, workers, run_id)
    if not data.steps:
        detail = f" ({stats.bad_lines} unreadable lines)" if stats.bad_lines else ""
        which = f" of run {run_id!r}" if run_id else ""
        raise reader.InputError(f"{sources.label}: no train.step spans{which} in {stats.spans} spans read{detail}; "
                                f"expected {reader.ACCEPTED}")
    by_step = data.by_step()
    skew = estimate(by_step)
    step_ranks = [analyse_step(n, per, skew) for n, per in by_step.items()]
    job_step_ns = {s.step: s.median_ns for s in step_ranks}
    per_rank: dict[int, list[int]] = {}
    for per in by_step.values():
        for r, rs in per.items():
            per_rank.setdefault(r, []).append(rs.duration)
    warm = warmup_steps(job_step_ns)
    rv = verdict(step_ranks, {r: int(slow.median(v)) for r, v in sorted(per_rank.items())}, warmup=warm,
                 residual_ns=skew.residual_ns)
    # A warm-up step is compilation or start-up, not an anomaly (the rule may judge one when a
    # warm-up outlasts its first `MIN_HISTORY` steps).
    severity = {n: x for n, x in zip(job_step_ns, slow.judge(list(job_step_ns.values())))
                if x is not None and n not in warm}
    good = account(data, skew, list(job_step_ns.values()))
    # Phase breakdowns from the steps whose phases are there (a sampled run has every rank's step
    # spans but some ranks' phases: the others would count as time outside any phase).
    trainer_steps = [rs for per in by_step.values() for rs in traced(per).values()] or \
        [rs for per in by_step.values() for rs in per.values()]
    # The verdicts describe the steady state: a run's warm-up (actors starting, compilation) is
    # accounted by goodput, not blamed on the pipeline or a phase.
    steady = [rs for n, per in by_step.items() if n not in warm for rs in traced(per).values()]
    pipe = pipeline_verdict(steady or trainer_steps, data.pipeline, capacities, len(warm) if steady else 0)
    shares = phase_shares(steady or trainer_steps)
    return Diagnosis(sources.label, sources.note, data.run_id, data.ranks, data.world_size, list(by_step),
                     stats.spans, stats.bad_lines, skew, step_ranks, rv, job_step_ns, list(severity), severity, warm, good, pipe,
                     shares, headline(rv, pipe, shares, len(data.ranks)), good.restarts, data)


def warmup_steps(job_step_ns: dict[int, int]) -> frozenset[int]:
    """The run's warm-up (`slow.warmup_length`: its leading steps over the slow-step bound of the
    whole run); `accounting` counts their excess as compilation or data wait."""
    return frozenset(list(job_step_ns)[:slow.warmup_length(list(job_step_ns.values()))])


def headline(rv: RanksVerdict, pipe: PipelineVerdict | None, shares: dict[str, float], n_ranks: int) -> str:
    """The one line at the top: stragglers, else the pipeline's bottleneck, else the breakdown."""
    if not rv.balanced:
        s = rv.stragglers[0]
        others = "" if len(rv.stragglers) == 1 else \
            " (also " + ", ".join(f"rank {x.rank}" for x in rv.stragglers[1:]) + ")"
        after = " after the warm-up" if rv.warmup_steps else ""
        if s.seen_steps is not None:  # ranks sampled: judged on the steps its phases were exported in
            return (f"rank {s.rank} straggles{others}: the other ranks waited for it {s.share:.0%} of the step "
                    f"time of the {s.seen_steps} steps it was sampled in{after}, late in {s.steps} of them "
                    f"(confidence {s.confidence})")
        return (f"rank {s.rank} straggles{others}: the other ranks waited for it "
                f"{s.share:.0%} of the run's step time, late in {s.steps} of {rv.steps_analysed} steps{after} "
                f"(confidence {s.confidence})")
    if pipe is not None and pipe.verdict != "balanced":
        return pipe.line()
    prefix = "ranks balanced; " if n_ranks > 1 else ""
    if pipe is not None:
        prefix += "pipeline balanced; "
    return prefix + breakdown_headline(shares)


def to_json(d: Diagnosis) -> dict[str, Any]:
    """The diagnosis as plain JSON values (times in seconds)."""
    s = 1e-9
    g = d.goodput
    largest_rank, largest = d.skew.largest
    return {
        "source": d.source, "run_id": d.run_id, "ranks": d.ranks, "world_size": d.world_size,
        "steps": len(d.steps), "first_step": d.steps[0] if d.steps else None,
        "last_step": d.steps[-1] if d.steps else None, "spans": d.spans, "unreadable_lines": d.bad_lines,
        "headline": d.headline,
        "balanced": d.ranks_verdict.balanced,
        "stragglers": [_seconds(asdict(x)) for x in d.ranks_verdict.stragglers],
        "occasional_stragglers": [_seconds(asdict(x)) for x in d.ranks_verdict.occasional],
        "step_time_by_rank_s": {str(r): v * s for r, v in d.ranks_verdict.per_rank_median_ns.items()},
        "clock_skew": {"reference_rank": d.skew.reference, "source": d.skew.source,
                       "steps_used": d.skew.steps_used, "residual_s": d.skew.residual_ns * s,
                       "offsets_s": {str(r): v * s for r, v in d.skew.offsets_ns.items()},
                       "largest_correction_s": largest * s, "largest_correction_rank": largest_rank},
        "per_step": [{"step": x.step, "ranks": x.ranks, "min_s": x.min_ns * s, "median_s": x.median_ns * s,
                      "max_s": x.max_ns * s, "min_rank": x.min_rank, "max_rank": x.max_rank,
                      "slow": x.step in d.severity, "severity": d.severity.get(x.step),
                      "stragglers": [_seconds(asdict(st)) for st in x.stragglers]}
                     for x in d.step_ranks],
        "slow_steps": d.slow_steps,
        "slow_severity": {str(n): x for n, x in d.severity.items()},
        "warmup_steps": sorted(d.warmup),
        "slow_rule": slow.RULE_TEXT,
        "lateness_noise_floor_s": d.ranks_verdict.noise_floor_ns * s,
        "goodput": {"goodput": g.goodput, "wall_s": g.wall_ns * s, "start_from": g.startup_from,
                    "seconds": {k: v * s for k, v in g.totals.items()},
                    "per_rank": {str(r): v for r, v in g.per_rank.items()},
                    "restarts": g.restarts, "redone_step_attempts": g.redone_steps},
        "phase_shares": d.shares,
        "pipeline": None if d.pipeline is None else asdict(d.pipeline) | {"line": d.pipeline.line()},
    }


def _seconds(fields: dict[str, Any]) -> dict[str, Any]:
    """`*_ns` fields as `*_s` seconds."""
    return {(k[:-3] + "_s" if k.endswith("_ns") else k): (v * 1e-9 if k.endswith("_ns") else v)
            for k, v in fields.items()}
