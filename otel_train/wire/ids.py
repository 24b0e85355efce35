"""The ids every rank agrees on with no communication, and how they travel (W3C trace context).

- A step's **trace id** is derived from `(run id, step)`: every rank's spans for step N land in
  one trace. A rank's **step span id** from `(run id, launch, step, rank, restart)`: rank 0's
  is the root of the step's trace, and the other ranks' step spans are its children; the
  launch (`_distributed.launch_id`) keeps a rerun under the same run id from repeating them.
- A **region's span id** from the process's random salt and the region's sequence number
  (`region_wire_id`), so the worker (or `inject()`) can name a span before it has ended.
- An **inference actor's** span outside any step has the trace of its top-level span
  (`actor_trace_id`, from the salt and that span's sequence number): one trace per call.
  `region_wire_id` is the one definition of a region's span id: the exporter's fast path calls
  it (one or two a span); `tests/test_fast_path.py` pins the values.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Mapping
from typing import Any

MASK64 = (1 << 64) - 1
#: `region_wire_id`'s odd multiplier.
REGION_ID_MULTIPLIER = 0x9E3779B97F4A7C15


@functools.lru_cache(maxsize=64)
def _hasher(prefix: str, size: int) -> Any:
    return hashlib.blake2b(prefix.encode(), digest_size=size)


def _trace_hasher(run_id: str) -> Any:
    """blake2b state of the prefix every trace id of `run_id` starts from (hashed once)."""
    return _hasher(f"otel_train/trace/{run_id}/", 16)


def _step_hasher(run_id: str, launch: str = "") -> Any:
    """The same for the step span ids of `run_id`'s launch `launch` (`RunInfo.launch`)."""
    return _hasher(f"otel_train/step/{run_id}/" + (f"{launch}/" if launch else ""), 8)


def _digest(prefix: Any, rest: str) -> bytes:
    """blake2b of the prefix state `prefix` followed by `rest` (the state is copied, not changed)."""
    hasher = prefix.copy()
    hasher.update(rest.encode())
    return hasher.digest()


def _id_int(digest: bytes) -> int:
    return int.from_bytes(digest, "big") or 1  # all-zero ids are invalid in OTLP


def trace_id_for(run_id: str, step: int | None) -> int:
    """The trace of step `step` of run `run_id` (one per step, the same on every rank)."""
    return _id_int(_digest(_trace_hasher(run_id), "init" if step is None else str(step)))


def step_span_id(run_id: str, step: int, rank: int, restart: int = 0, launch: str = "") -> int:
    """Span id of rank `rank`'s `train.step` span; rank 0's is the root of the step's trace.
    `launch` (shared by the ranks of one launch) keeps two launches of one run id apart."""
    return _id_int(_digest(_step_hasher(run_id, launch), f"{step}/{rank}/{restart}"))


_ZERO16, _ZERO8 = bytes(16), bytes(8)


class StepIds:
    """`trace_id_for` and `step_span_id` of one run and rank, as the big-endian bytes of the
    ids (what the OTLP fields hold): the exporter needs both for every step, and the run's
    prefix states are looked up once here, not per call. Returns None for the all-zero digest
    that the int forms map to 1 (never seen: one in 2**64)."""

    def __init__(self, run_id: str, rank: int, restart: int = 0, launch: str = "") -> None:
        self._trace = _trace_hasher(run_id)
        self._step = _step_hasher(run_id, launch)
        self._suffix = f"/{rank}/{restart}"

    def trace(self, step: int) -> bytes | None:
        digest = _digest(self._trace, str(step))
        return digest if any(digest) else None

    def step_span(self, step: int) -> bytes | None:
        digest = _digest(self._step, f"{step}{self._suffix}")
        return digest if any(digest) else None

    def both(self, step: int) -> tuple[bytes | None, bytes | None]:
        """`(trace(step), step_span(step))`, the step's text made once (the exporter needs both
        for every step)."""
        text = str(step)
        trace = self._trace.copy()
        trace.update(text.encode())
        span = self._step.copy()
        span.update((text + self._suffix).encode())
        trace_id, span_id = trace.digest(), span.digest()
        return (trace_id if trace_id != _ZERO16 else None, span_id if span_id != _ZERO8 else None)


def actor_trace_id(run_id: str, salt: int, root_seq: int) -> int:
    """The trace of an inference actor's top-level span (the `root_seq`-th region of the process
    with `salt`) and of everything inside it: an actor's spans keep their own traces, one per
    top-level call (docs/actors.md), which a trainer's step links to."""
    return _id_int(_digest(_hasher(f"otel_train/actor/{run_id}/", 16), f"{salt:x}/{root_seq}"))


def region_wire_id(salt: int, seq: int) -> int:
    """The `seq`-th region's span id as the exporter writes it: a little-endian fixed64 of this
    number is the id's 8 bytes. A multiply by an odd constant and an xor with the process's
    random salt: a bijection of `seq`, so ids never repeat in a process, and three operations,
    since the exporter computes one or two per span."""
    return ((seq * REGION_ID_MULTIPLIER) ^ salt) & MASK64 or 1


def region_span_id(salt: int, seq: int) -> int:
    """Span id of the `seq`-th region of the process with `salt` (never zero)."""
    return int.from_bytes(region_wire_id(salt, seq).to_bytes(8, "little"), "big")


def wire_id(span_id: int) -> int:
    """`span_id` in the exporter's little-endian form (`region_wire_id`)."""
    return int.from_bytes(span_id.to_bytes(8, "big"), "little")


def new_salt() -> int:
    return secrets.randbits(64)


def format_traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def parse_traceparent(carrier: Mapping[str, Any] | str | None) -> tuple[int, int] | None:
    """`(trace_id, span_id)` from a W3C `traceparent` (a dict carrier or the header itself)."""
    if carrier is None:
        return None
    try:  # a carrier is the user's object: anything but a str or a mapping names no span
        header = carrier if isinstance(carrier, str) else carrier.get("traceparent") \
            if isinstance(carrier, Mapping) else None
    except Exception:  # noqa: BLE001 - a mapping whose get raises
        return None
    if not isinstance(header, str):
        return None
    parts = header.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace_id, span_id
