"""Clock skew between ranks, estimated from the trace alone.

Ranks leave a collective together: an all-reduce returns on every rank within microseconds of
the last one's arrival, whatever each rank's clock says. So for every step, the end of the k-th
`train.collective` on rank r minus its end on the reference rank is rank r's clock offset plus
microseconds of noise (and nothing of who was late: lateness moves the *starts*). A run with no
collective spans (DDP: the gradient all-reduce runs inside autograd) uses the end of each step's
last `train.backward`, which returns when DDP's all-reduce has. The estimate is the median over
steps, robust to the odd step where a rank was descheduled on its way out. Only the ranks whose
phases a step has take part (a sampled run, `OTEL_TRAIN_RANKS`, exports some ranks' phases a
step and always rank 0's, the reference).

`residual_ns` says how well the corrected ends agree (median absolute deviation of the
per-step differences): the precision of the correction, and the noise floor below which the
straggler analysis names nobody.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from otel_train import semconv
from otel_train.analyze.model import PHASES, RankStep, traced
from otel_train.analyze.slow import median

SOURCE_COLLECTIVE = semconv.SPAN_COLLECTIVE
SOURCE_BACKWARD = semconv.SPAN_BACKWARD


@dataclass
class Skew:
    """Per-rank clock offsets: subtract `offsets_ns[rank]` from a rank's times to put them on
    the reference rank's clock."""

    reference: int | None = None
    offsets_ns: dict[int, int] = field(default_factory=dict)
    residual_ns: int = 0
    steps_used: int = 0
    source: str = ""  # the span whose ends were aligned; "" when nothing could be estimated

    def of(self, rank: int) -> int:
        return self.offsets_ns.get(rank, 0)

    @property
    def largest(self) -> tuple[int | None, int]:
        """(rank, offset ns) of the largest correction by magnitude."""
        if not self.offsets_ns:
            return None, 0
        rank = max(self.offsets_ns, key=lambda r: (abs(self.offsets_ns[r]), -r))
        return rank, self.offsets_ns[rank]


_COLL = PHASES.index(SOURCE_COLLECTIVE)
_BWD = PHASES.index(SOURCE_BACKWARD)


def _sync_ends(rs: RankStep) -> tuple[list[int], list[int]]:
    """(ends of collectives, end of the last backward as a one-item list or [])."""
    coll, last_bwd_start, last_bwd_end = [], -1, None
    t = rs.times
    for i, code in enumerate(rs.codes):
        if code == _COLL:
            coll.append(t[2 * i + 1])
        elif code == _BWD and t[2 * i] > last_bwd_start:
            last_bwd_start, last_bwd_end = t[2 * i], t[2 * i + 1]
    return coll, ([last_bwd_end] if last_bwd_end is not None else [])


def estimate(by_step: Mapping[int, Mapping[int, RankStep]]) -> Skew:
    """Offsets of every rank against the lowest rank, from the steps all ranks share."""
    diffs: dict[int, list[int]] = {}
    used, source = 0, ""
    ranks_all = sorted({r for per in by_step.values() for r in traced(per)})
    if len(ranks_all) < 2:
        return Skew(reference=ranks_all[0] if ranks_all else None)
    ref = ranks_all[0]
    for per in by_step.values():
        per = traced(per)  # ranks sampled out of a step (OTEL_TRAIN_RANKS) have no phases to align
        if ref not in per or len(per) < 2:
            continue
        ends = {r: _sync_ends(rs) for r, rs in per.items()}
        counts = {len(c) for c, _ in ends.values()}
        if len(counts) == 1 and 0 not in counts:
            which, src = 0, SOURCE_COLLECTIVE  # the same number of collectives on every rank
        elif all(b for _, b in ends.values()):
            which, src = 1, SOURCE_BACKWARD
        else:
            continue
        ref_ends = ends[ref][which]
        for r, pair in ends.items():
            if r != ref:
                diffs.setdefault(r, []).extend(e - e0 for e, e0 in zip(pair[which], ref_ends))
        used += 1
        source = source if source == SOURCE_COLLECTIVE else src
    if not used:
        return Skew(reference=ref)
    offsets = {ref: 0}
    residuals: list[float] = []
    for r, ds in diffs.items():
        offsets[r] = math.floor(median(ds))  # floor, not int(): shifting a rank shifts this exactly
        residuals.extend(abs(d - offsets[r]) for d in ds)
    return Skew(ref, dict(sorted(offsets.items())), int(median(residuals)) if residuals else 0, used, source)
