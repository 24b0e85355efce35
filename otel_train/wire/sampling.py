"""Which steps and ranks export their phase spans: a pure function of run id, step and rank.

Every rank decides alone, with no communication, and all ranks decide alike, so a step that is
sampled is complete on every rank sampled for it. Step spans (`train.step`), their siblings
(checkpoint, eval, GC) and every metric stay on for every rank whatever this says (up to 2,048
ranks: `OTEL_TRAIN_STEP_SPANS` below): only phase spans (data, forward, backward, optimizer,
collectives, user regions) are sampled out.

`OTEL_TRAIN_RANKS`:

- `all`: every rank;
- `0`, or a list `0,8,16`: those ranks;
- `first-per-node`: the first rank of each node (`LOCAL_RANK` 0);
- `sample:K`: K ranks per step, a different set each step, spread evenly over the ranks, every
  rank in turn within W/K steps (a shuffled order, from a hash of the run id), and rank 0 in
  every step (the reference the others are compared with); every rank when the world has K
  ranks or fewer.

`OTEL_TRAIN_STEP_SAMPLE=N` keeps every Nth step's spans (step spans included) on top of it.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

ALL = "all"
FIRST_PER_NODE = "first-per-node"
SAMPLE_PREFIX = "sample:"
#: The default: a world of 64 ranks or fewer exports everything; a 1,024-rank step's trace is
#: ~2,000 spans and ~1.2 MB (`otel-train bench scale`, docs/distributed.md).
DEFAULT = "sample:64"
ALLOWED = "all, a rank or comma-separated ranks (0 or 0,8,16), first-per-node, or sample:K (K >= 1)"

#: `OTEL_TRAIN_STEP_SPANS`: whose `train.step` spans (and checkpoint / eval / GC siblings) go out.
#: `all`: every rank's; `sampled`: rank 0's (the trace's root) and those of the ranks whose phases
#: go out for the step; `auto` (default): `all` up to `STEP_SPANS_ALL_UP_TO` ranks, else `sampled`.
#: Every rank's resource rides with its step span: ~1 kB a rank, so 10,240 ranks' step spans
#: alone are ~10 MB a trace, twice Tempo's default limit.
STEP_SPANS = ("auto", "all", "sampled")
STEP_SPANS_ALL_UP_TO = 2048


def parse_ranks(value: object) -> str:
    """The canonical spelling of an `OTEL_TRAIN_RANKS` value; ValueError saying what is allowed."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(f"expected {ALLOWED}")
    text = value.strip().lower().replace(" ", "")
    if text in (ALL, FIRST_PER_NODE):
        return text
    if text.startswith(SAMPLE_PREFIX):
        k = text[len(SAMPLE_PREFIX):]
        if k.isdigit() and int(k) >= 1:
            return f"{SAMPLE_PREFIX}{int(k)}"
        raise ValueError(f"expected {ALLOWED}")
    parts = text.split(",")
    if text and all(p.isdigit() for p in parts):
        return ",".join(str(r) for r in sorted({int(p) for p in parts}))
    raise ValueError(f"expected {ALLOWED}")


@dataclass(frozen=True)
class RankSampling:
    """The decision for one process: `phases(step)` says whether its phase spans of `step` go out."""

    spec: str
    run_id: str
    rank: int
    local_rank: int
    world_size: int
    step_sample: int = 1
    step_spans: str = "all"

    @property
    def fixed(self) -> bool | None:
        """True / False when the answer is the same for every step of this rank (before step
        sampling), None when it changes with the step (`sample:K` on a world wider than K)."""
        spec = self.spec
        if spec == ALL:
            return True
        if spec == FIRST_PER_NODE:
            return self.local_rank == 0
        if spec.startswith(SAMPLE_PREFIX):
            return True if int(spec[len(SAMPLE_PREFIX):]) >= self.world_size else None
        return self.rank in {int(r) for r in spec.split(",")}

    def step(self, step: int | None) -> bool:
        """Whether this rank's step span of `step` (and its siblings) go out: step sampling
        (OTEL_TRAIN_STEP_SAMPLE), and with `OTEL_TRAIN_STEP_SPANS=sampled` rank sampling but for
        rank 0, whose step span is the trace's root."""
        if not (step is None or self.step_sample == 1 or step % self.step_sample == 0):
            return False
        if self.rank == 0 or not self.sampled_steps:
            return True
        return self.phases(step)

    @property
    def sampled_steps(self) -> bool:
        """Whether step spans follow rank sampling (`OTEL_TRAIN_STEP_SPANS`)."""
        spans = self.step_spans
        return spans == "sampled" or (spans == "auto" and self.world_size > STEP_SPANS_ALL_UP_TO)

    def phases(self, step: int | None) -> bool:
        """Whether this rank's phase spans of `step` go out (step and rank sampling)."""
        if not (step is None or self.step_sample == 1 or step % self.step_sample == 0):
            return False
        fixed = self.fixed
        if fixed is not None:
            return fixed
        return sampled_in(self.run_id, step, self.rank, self.world_size, int(self.spec[len(SAMPLE_PREFIX):]))


def sampled_in(run_id: str, step: int | None, rank: int, world_size: int, k: int) -> bool:
    """`sample:K`'s rule: rank 0, and the ranks at positions p from a start with p*K mod W < K.
    Exactly K of the W positions pass (each multiple of g = gcd(K, W) below K is hit g times),
    spaced about W/K apart, so a step's sample spreads over nodes; `_start` picks the start.
    Rank 0 is always in (K+1 ranks when the K do not include it): every other rank's phases are
    compared with it (clock offsets, who waited for whom), and the K change with each step."""
    if k >= world_size or rank == 0:
        return True
    start = _start(run_id, step, world_size, k)
    return ((rank - start) % world_size) * k % world_size < k


def _start(run_id: str, step: int | None, world_size: int, k: int) -> int:
    """The step's start. Starts that differ by a multiple of P = W / gcd(K, W) pick the same
    ranks, so the P classes are dealt out in a shuffled order per run of P steps: every rank
    is sampled at least once in any P consecutive steps aligned on P, and no schedule in the
    training loop (a checkpoint every 64 steps) keeps meeting the same ranks."""
    period = world_size // math.gcd(k, world_size)
    if step is None:
        return int.from_bytes(_hash(f"{run_id}/init"), "big") % period
    deal, position = divmod(step, period)
    return _deal(run_id, deal, period)[position]


@functools.lru_cache(maxsize=8)
def _deal(run_id: str, deal: int, period: int) -> tuple[int, ...]:
    """A permutation of range(period), the same in every process (ordered by a hash; Python's
    `random` is not promised to shuffle alike across versions). Computed once per `period` steps."""
    return tuple(sorted(range(period), key=lambda c: _hash(f"{run_id}/{deal}/{c}")))


def _hash(text: str) -> bytes:
    return hashlib.blake2b(f"otel_train/ranks/{text}".encode(), digest_size=8).digest()


def sampled_ranks(run_id: str, step: int | None, world_size: int, k: int) -> list[int]:
    """The ranks `sample:K` picks for `step` (for tests and `otel-train bench scale`)."""
    return [r for r in range(world_size) if sampled_in(run_id, step, r, world_size, k)]
