"""Straggling ranks, step by step, from span data alone.

In a synchronous step every rank leaves the gradient all-reduce at the same moment, so step
times barely differ between ranks even when one rank is late: the late rank's delay shows up as
*waiting* on all the others. The analysis therefore looks for the wait, not for a long step:

1. Match phase occurrences across ranks (the k-th `train.collective`, the k-th
   `train.backward`, ... of the step on each rank), on skew-corrected clocks.
2. An occurrence *absorbed a wait* when its ends agree across ranks while its starts do not
   (end spread at most half the start spread): ranks arrived at different times and left
   together. That is a collective, or DDP's backward (its all-reduce completes inside it).
3. A rank's lateness is how much less than the other ranks' median it spent in those
   occurrences: the time the others waited for it. The straggler is the rank whose compute
   ended last.

A rank is *late* in a step when its lateness is over the step's floor: at least `THRESHOLD` (5 %)
of the step's median time (below it, fixing the rank could not speed the step up by more than a
training loop's step-to-step jitter), above the clock-alignment noise, and above the run's own
noise floor: `K_NOISE` sigma (1.4826 x MAD) over the median of the lateness the *other* ranks
show (each step's latest rank left out, so a persistent straggler does not raise its own bar).
Over the run a rank is *the* straggler when, outside the warm-up steps (lazy initialisation and
compilation differ from rank to rank once; they are judged by nobody), it was late
*consistently* (in at least `CONSISTENCY`, half, of the steps and at least `MIN_STEPS`) and the
waits it caused add up to at least 5 % of the run's step time. Its confidence is "high" when it
was late in at least 80 % of the steps by typically at least 3 x the noise (the run's noise
floor, the clock alignment's), else "medium".
Ranks late in some steps but not consistently are listed as occasional (one long stall is an
incident, not a slow rank); a balanced run's noise names nobody.

A sampled run (`OTEL_TRAIN_RANKS=sample:K`) has every rank's step span but the phases of rank 0
and K others a step: the spread is every rank's, the waits are compared among the ranks whose
phases the step has, and a rank's share is of the steps it was sampled in, so a persistent
straggler is named as in a run with every rank's phases.

Known blind spot: a rank slower inside backward itself (DDP) makes the others wait inside their
backward too, so every rank's backward lasts as long and arrivals agree; device timing
(`device.duration_s`) or explicit collective spans tell that case apart, host spans cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from otel_train.analyze.model import OUTSIDE, PHASES, RankStep, traced
from otel_train.analyze.skew import Skew
from otel_train.analyze.slow import MAD_SCALE, median

THRESHOLD = 0.05
MIN_STEPS = 2
CONSISTENCY = 0.5
K_NOISE = 3.0
#: Confidence "high": late in this share of the steps, typically by this many times the floor.
HIGH_CONSISTENCY, HIGH_MARGIN = 0.8, 3.0


@dataclass
class Straggler:
    """One late rank in one step, with the evidence."""

    rank: int
    late_ns: int  # how long the other ranks (their median) waited for it
    wait_phase: str  # where the others waited
    own_wait_ns: int  # its own time in that phase
    others_wait_ns: int  # the median rank's time there
    slow_phase: str  # its phase with the largest excess over the other ranks' median
    slow_phase_ns: int
    others_phase_ns: int


@dataclass
class StepRanks:
    """Cross-rank view of one step."""

    step: int
    ranks: int
    min_ns: int
    median_ns: int
    max_ns: int
    min_rank: int
    max_rank: int
    stragglers: list[Straggler] = field(default_factory=list)
    #: The ranks whose phases this step has, where not all (a sampled run); None: every rank's.
    traced: frozenset[int] | None = None
    #: Each rank's lateness (ns; negative: earlier than the others' median), where a wait was absorbed.
    late: dict[int, int] = field(default_factory=dict)
    floor_ns: int = 0  # the step's own floor (5 % of its median, the clock noise)


@dataclass
class RankSummary:
    """A rank's stragglings over the run."""

    rank: int
    steps: int  # steps it was named in
    lost_ns: int  # waits it caused, summed
    share: float  # of the run's summed median step time (sampled: of the steps it was seen in)
    seen_steps: int | None = None  # steps whose phases it has, where ranks were sampled (else None)
    consistency: float = 0.0  # steps late / steps it could be judged in
    typical_late_ns: int = 0  # its median lateness over the steps it was late in
    confidence: str = ""  # "high" / "medium" for a straggler, "" for an occasional one


@dataclass
class RanksVerdict:
    balanced: bool
    stragglers: list[RankSummary]  # the run's stragglers (>= THRESHOLD of step time)
    occasional: list[RankSummary]  # named in some steps, below the run-wide threshold
    steps_analysed: int  # steps with at least two ranks
    step_ns_total: int
    per_rank_median_ns: dict[int, int]  # each rank's median step time
    noise_floor_ns: int = 0  # the run's lateness noise floor (see the module docstring)
    warmup_steps: int = 0  # leading steps left out


def _occurrences(rs: RankStep, offset: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(phase code, k) -> skew-corrected (start, end) of the k-th such phase in the step."""
    seen = [0] * len(PHASES)
    out = {}
    t = rs.times
    for i, code in enumerate(rs.codes):
        k = seen[code]
        seen[code] = k + 1
        out[(code, k)] = (t[2 * i] - offset, t[2 * i + 1] - offset)
    return out


def _totals(rs: RankStep) -> dict[str, int]:
    totals = {PHASES[c]: ns for c, ns in enumerate(rs.totals) if ns}
    totals[OUTSIDE] = max(0, rs.duration - sum(rs.totals))
    return totals


def _median_without(values: list[int], i: int) -> float:
    """The median of sorted `values` without the item at `i` (the other ranks' median)."""
    m = len(values) - 1

    def at(j: int) -> int:
        return values[j] if j < i else values[j + 1]

    return float(at(m // 2)) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2.0


def analyse_step(step: int, per: Mapping[int, RankStep], skew: Skew, threshold: float = THRESHOLD
                 ) -> StepRanks:
    """The cross-rank spread of step `step` and its stragglers (`per`: rank -> RankStep)."""
    durations = {r: rs.duration for r, rs in per.items()}
    order = sorted(durations, key=lambda r: (durations[r], r))
    out = StepRanks(step, len(per), durations[order[0]], int(median(list(durations.values()))),
                    durations[order[-1]], order[0], order[-1])
    phased = traced(per)  # the ranks whose phases this step has (all, unless ranks were sampled)
    if len(phased) < len(per):
        out.traced = frozenset(phased)
    per = phased
    if len(per) < 2:
        return out
    occ = {r: _occurrences(rs, skew.of(r)) for r, rs in per.items()}
    keys = set.intersection(*(set(o) for o in occ.values()))
    floor = out.floor_ns = int(max(threshold * out.median_ns, 3 * skew.residual_ns))
    late: dict[int, int] = dict.fromkeys(per, 0)
    wait_by_key: list[tuple[int, tuple[int, int]]] = []
    for key in keys:
        starts = [occ[r][key][0] for r in per]
        ends = [occ[r][key][1] for r in per]
        start_spread, end_spread = max(starts) - min(starts), max(ends) - min(ends)
        if start_spread < floor or end_spread * 2 > start_spread:
            continue  # no wait absorbed here
        ordered = sorted((occ[r][key][1] - occ[r][key][0], r) for r in per)
        values = [v for v, _ in ordered]
        for i, (v, r) in enumerate(ordered):
            late[r] += int(_median_without(values, i) - v)
        wait_by_key.append((int(_median_without(values, 0) - values[0]), key))
    if not wait_by_key:
        return out
    out.late = late
    wait_key = max(wait_by_key)[1]
    totals = {r: _totals(rs) for r, rs in per.items()}
    for r in sorted(per, key=lambda r: -late[r]):
        if late[r] < floor:
            break
        others = [x for x in per if x != r]
        wait_d = {x: occ[x][wait_key][1] - occ[x][wait_key][0] for x in per}
        slow, excess, mine, theirs = OUTSIDE, None, 0, 0
        for phase, own in totals[r].items():
            med = median([totals[x].get(phase, 0) for x in others])
            if excess is None or own - med > excess:
                slow, excess, mine, theirs = phase, own - med, own, int(med)
        out.stragglers.append(Straggler(r, late[r], PHASES[wait_key[0]], wait_d[r],
                                        int(median([wait_d[x] for x in others])), slow, mine, theirs))
    return out


def _seen_ns(steps: list[StepRanks], rank: int, total: int) -> int:
    """The summed median step time of the steps whose phases `rank` has: all of them (`total`)
    unless ranks were sampled, where a rank's waits are judged against the steps it was seen in."""
    if all(s.traced is None for s in steps):
        return total
    return sum(s.median_ns for s in steps if s.traced is None or rank in s.traced)


def noise_floor(steps: list[StepRanks]) -> int:
    """The run's lateness noise floor: median + `K_NOISE` x 1.4826 x MAD of the positive lateness
    of every rank but each step's latest one (0 where none is positive)."""
    pool = []
    for s in steps:
        if len(s.late) < 2:
            continue
        top = max(s.late, key=lambda r: s.late[r])
        pool += [max(0, v) for r, v in s.late.items() if r != top]
    if not pool:
        return 0
    m = median(pool)
    return int(m + K_NOISE * MAD_SCALE * median([abs(v - m) for v in pool]))


def verdict(steps: list[StepRanks], per_rank_median_ns: dict[int, int], threshold: float = THRESHOLD,
            warmup: frozenset[int] = frozenset(), residual_ns: int = 0) -> RanksVerdict:
    """The run's verdict from its per-step analyses. Steps in `warmup` are left out and their
    stragglers dropped; every other step keeps only the stragglers over the run's noise floor
    (`steps` is updated in place, so every output names the same late ranks)."""
    for s in steps:
        if s.step in warmup:
            s.stragglers = []
    analysed = [s for s in steps if s.ranks >= 2 and s.step not in warmup]
    noise = noise_floor(analysed)
    for s in analysed:
        s.stragglers = [st for st in s.stragglers if st.late_ns > noise]
    total = sum(s.median_ns for s in analysed)
    sums: dict[int, list[int]] = {}
    for s in analysed:
        for st in s.stragglers:
            sums.setdefault(st.rank, []).append(st.late_ns)
    sampled = any(s.traced is not None for s in analysed)
    summaries = []
    for r, lates in sums.items():
        seen = _seen_ns(analysed, r, total)
        seen_steps = sum(s.traced is None or r in s.traced for s in analysed)
        lost = sum(lates)
        summaries.append(RankSummary(r, len(lates), lost, lost / seen if seen else 0.0,
                                     seen_steps if sampled else None, len(lates) / seen_steps if seen_steps else 0.0,
                                     int(median(lates))))
    summaries.sort(key=lambda x: -x.lost_ns)
    big = [x for x in summaries if x.share >= threshold and x.steps >= MIN_STEPS and x.consistency >= CONSISTENCY]
    floor = max(noise, 3 * residual_ns) or 1
    for x in big:
        x.confidence = "high" if x.consistency >= HIGH_CONSISTENCY and x.typical_late_ns >= HIGH_MARGIN * floor \
            else "medium"
    small = [x for x in summaries if x not in big]
    return RanksVerdict(not big, big, small, len(analysed), total, per_rank_median_ns, noise, len(warmup))
