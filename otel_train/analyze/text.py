"""`diagnose`'s human-readable output (the `--json` form is `diagnose.to_json`)."""

from __future__ import annotations

from otel_train.analyze import slow
from otel_train.analyze.diagnose import Diagnosis
from otel_train.analyze.goodput import CATEGORIES
from otel_train.analyze.stragglers import StepRanks

WORST_STEPS = 10


def dur(ns: float) -> str:
    """A duration for people: 850 us, 12.3 ms, 4.56 s, 3 min 20 s."""
    a = abs(ns)
    if a < 1e6:
        return f"{ns / 1e3:.0f} us"
    if a < 1e9:
        return f"{ns / 1e6:.3g} ms" if a < 1e8 else f"{ns / 1e6:.0f} ms"
    if a < 600e9:
        return f"{ns / 1e9:.3g} s"
    return f"{int(ns // 60e9)} min {ns % 60e9 / 1e9:.0f} s"


def signed(ns: float) -> str:
    return ("+" if ns >= 0 else "-") + dur(abs(ns))


def render(d: Diagnosis) -> str:
    lines: list[str] = []
    add = lines.append
    steps = f"steps {d.steps[0]}-{d.steps[-1]}" if d.steps else "no steps"
    add(f"run {d.run_id or '?'}: {len(d.ranks)} rank{'s' if len(d.ranks) != 1 else ''} "
        f"(world size {d.world_size}), {len(d.steps)} steps ({steps}), {d.spans} spans, from {d.source}")
    if d.bad_lines:
        add(f"  ({d.bad_lines} unreadable lines skipped)")
    add("")
    add(f"VERDICT: {d.headline}")
    add("")
    _ranks(d, add)
    _steps(d, add)
    _slow(d, add)
    _goodput(d, add)
    if d.shares:
        add(f"Phases (share of step time, all ranks{', after the warm-up' if d.warmup else ''}): " +
            ", ".join(f"{name} {share:.0%}" for name, share in d.shares.items() if share >= 0.005))
    if d.pipeline is not None:
        add("")
        add(d.pipeline.line())
    return "\n".join(lines) + "\n"


def _ranks(d: Diagnosis, add) -> None:  # type: ignore[no-untyped-def]
    rv = d.ranks_verdict
    add("Ranks")
    if len(d.ranks) < 2:
        add("  one rank: no cross-rank analysis")
        add("")
        return
    after = f" after the warm-up ({rv.warmup_steps} steps left out)" if rv.warmup_steps else ""
    floor = f"; lateness noise floor {dur(rv.noise_floor_ns)}" if rv.noise_floor_ns else ""
    if rv.balanced:
        add(f"  balanced: no rank made the others wait consistently, 5% of the run's step time or more "
            f"({rv.steps_analysed} steps analysed{after}{floor})")
    for s in rv.stragglers:
        if s.seen_steps is not None:  # ranks sampled (OTEL_TRAIN_RANKS): judged where its phases are
            add(f"  straggler: rank {s.rank}, late in {s.steps} of the {s.seen_steps} steps its phases were sampled "
                f"in{after}; the other ranks waited for it {dur(s.lost_ns)} in all ({s.share:.0%} of those steps' "
                f"time)")
        else:
            add(f"  straggler: rank {s.rank}, late in {s.steps} of {rv.steps_analysed} steps{after}; the other ranks "
                f"waited for it {dur(s.lost_ns)} in all ({s.share:.0%} of the run's step time)")
        add(f"    confidence {s.confidence}: late in {s.consistency:.0%} of the steps it was judged in, typically by "
            f"{dur(s.typical_late_ns)}{floor}")
        ev = _evidence(d, s.rank)
        if ev:
            add("    " + ev)
    if rv.occasional:
        add("  occasionally late (not consistently, or under 5% of the run's step time): " +
            ", ".join(f"rank {x.rank} in {x.steps} step{'s' if x.steps != 1 else ''} ({dur(x.lost_ns)})"
                      for x in rv.occasional[:8]) + (" ..." if len(rv.occasional) > 8 else ""))
    medians = rv.per_rank_median_ns
    if medians:
        lo = min(medians, key=lambda r: (medians[r], r))
        hi = max(medians, key=lambda r: (medians[r], -r))
        add(f"  step time by rank (each rank's median): min {dur(medians[lo])} (rank {lo}), median "
            f"{dur(slow.median(list(medians.values())))}, max {dur(medians[hi])} (rank {hi})")
    _skew(d, add)
    add("")


def _evidence(d: Diagnosis, rank: int) -> str:
    """The step where `rank` was latest, told as evidence."""
    best = None
    for s in d.step_ranks:
        for st in s.stragglers:
            if st.rank == rank and (best is None or st.late_ns > best[1].late_ns):
                best = (s, st)
    if best is None:
        return ""
    s, st = best
    return (f"e.g. step {s.step}: its compute ended last, {dur(st.late_ns)} after the median rank's; the others "
            f"waited in {st.wait_phase} ({dur(st.others_wait_ns)} there, rank {rank} {dur(st.own_wait_ns)}); "
            f"its slowest phase: {st.slow_phase} {dur(st.slow_phase_ns)} (other ranks' median "
            f"{dur(st.others_phase_ns)})")


def _skew(d: Diagnosis, add) -> None:  # type: ignore[no-untyped-def]
    sk = d.skew
    if not sk.source:
        add("  clock skew: not estimated (no collective or backward span shared by all ranks); "
            "times as recorded")
        return
    rank, largest = sk.largest
    offsets = ", ".join(f"rank {r} {signed(v)}" for r, v in sk.offsets_ns.items() if r != sk.reference)
    add(f"  clock skew: corrected by up to {dur(abs(largest))} (rank {rank}), from {sk.source} ends in "
        f"{sk.steps_used} steps, against rank {sk.reference}; agreement after correction +/- "
        f"{dur(sk.residual_ns)}")
    if len(sk.offsets_ns) <= 16:
        add(f"    offsets: {offsets}")


def _steps(d: Diagnosis, add) -> None:  # type: ignore[no-untyped-def]
    if len(d.ranks) < 2:
        return
    ranked: list[StepRanks] = sorted((s for s in d.step_ranks if s.stragglers),
                                     key=lambda s: -s.stragglers[0].late_ns)[:WORST_STEPS]
    judged = sum(1 for s in d.step_ranks if s.ranks >= 2 and s.step not in d.warmup)
    add(f"Steps with a straggler: {sum(1 for s in d.step_ranks if s.stragglers)} of {judged}"
        + (" after the warm-up" if d.warmup else "")
        + (f" (the {len(ranked)} worst; --json lists every step)" if ranked else ""))
    if ranked:
        add(f"  {'step':>6}  {'min (rank)':>15}  {'median':>9}  {'max (rank)':>15}  {'straggler':>9}  {'late':>9}  "
            f"{'others waited in':<17} slowest phase on it")
    for s in ranked:
        st = s.stragglers[0]
        more = f" +{len(s.stragglers) - 1}" if len(s.stragglers) > 1 else ""
        add(f"  {s.step:>6}  {dur(s.min_ns) + f' ({s.min_rank})':>15}  {dur(s.median_ns):>9}  "
            f"{dur(s.max_ns) + f' ({s.max_rank})':>15}  "
            f"{'rank ' + str(st.rank) + more:>9}  {dur(st.late_ns):>9}  {st.wait_phase:<17} "
            f"{st.slow_phase} {dur(st.slow_phase_ns)} (others {dur(st.others_phase_ns)})")
    add("")


def _slow(d: Diagnosis, add) -> None:  # type: ignore[no-untyped-def]
    judged = max(0, len(d.steps) - slow.MIN_HISTORY)
    judged = max(0, judged - sum(1 for n in d.warmup if list(d.steps).index(n) >= slow.MIN_HISTORY))
    head = f"Slow steps ({slow.RULE_TEXT}{', warm-up left out' if d.warmup else ''}): {len(d.slow_steps)} of {judged}"
    if d.slow_steps:
        listed = ", ".join(f"{n} ({dur(d.job_step_ns[n])}, {d.severity[n]:.1f}x median)" for n in d.slow_steps[:12])
        head += ": " + listed + (" ..." if len(d.slow_steps) > 12 else "")
    add(head)
    add("")


def _goodput(d: Diagnosis, add) -> None:  # type: ignore[no-untyped-def]
    g = d.goodput
    wall = sum(g.totals.values())
    add(f"Goodput {g.goodput:.1%} of {dur(g.wall_ns)} wall time (from the first "
        f"{'otel_train.init' if g.startup_from == 'init' else 'span'} to the last span"
        + (", mean over ranks" if len(d.ranks) > 1 else "") + ")")
    for c in CATEGORIES:
        v = g.totals.get(c, 0.0)
        if v or c == "productive":
            add(f"  {c:<11} {dur(v):>10}  {v / wall if wall else 0:6.1%}")
    if len(g.per_rank) > 1:  # what each rank's closing line printed ("goodput X% of ... on rank R")
        add("  per rank (each rank's closing line): " +
            ", ".join(f"rank {r} {v:.1%}" for r, v in list(g.per_rank.items())[:8]) +
            (" ..." if len(g.per_rank) > 8 else ""))
    if g.restarts:
        add(f"  restarts: {g.restarts}; {g.redone_steps} step attempts redone (all ranks)")
    add("")
