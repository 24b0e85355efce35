"""Distributed context: who this process is in the run, and the ids every rank agrees on.

The run id and ranks come from torchrun / torchelastic variables, else OTEL_TRAIN_RUN_ID,
else a generated id shared by all ranks of one launch. Trace ids and step span ids are
derived from `(run id, step)` so that all ranks' spans for step N land in one trace with no
communication; other span ids are derived from a per-process salt and a sequence number,
so the worker (or `inject()`) can name a span before it has ended.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_train import semconv

_log = logging.getLogger("otel_train")
MASK64 = (1 << 64) - 1
#: `region_wire_id`'s odd multiplier (the span assembler's fast loop inlines it).
REGION_ID_MULTIPLIER = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class RunInfo:
    """This process's place in the run (the `ml.*` resource attributes)."""

    run_id: str
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0
    restart: int = 0
    role: str = semconv.ROLE_TRAINER
    instance_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def resource_attributes(self) -> dict[str, Any]:
        return {
            semconv.ML_RUN_ID: self.run_id,
            semconv.ML_RANK: self.rank,
            semconv.ML_LOCAL_RANK: self.local_rank,
            semconv.ML_WORLD_SIZE: self.world_size,
            semconv.ML_NODE_RANK: self.node_rank,
            semconv.ML_ROLE: self.role,
            semconv.ML_RESTART: self.restart,
            semconv.SERVICE_INSTANCE_ID: self.instance_id,
        }


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        _log.warning("otel_train: %s=%r is not an integer; using %d.", name, raw, default)
        return default


def detect_run_info(run_id: str | None, role: str, environ: Mapping[str, str] | None = None) -> RunInfo:
    """Ranks from torchrun variables; run id from `run_id`, TORCHELASTIC_RUN_ID, or a shared generated one."""
    environ = os.environ if environ is None else environ
    rank = _env_int(environ, "RANK", 0)
    world = _env_int(environ, "WORLD_SIZE", 1)
    return RunInfo(
        run_id=run_id or _run_id_from_env(environ),
        rank=rank,
        local_rank=_env_int(environ, "LOCAL_RANK", 0),
        world_size=world,
        node_rank=_env_int(environ, "GROUP_RANK", 0),
        restart=_env_int(environ, "TORCHELASTIC_RESTART_COUNT", 0),
        role=role,
    )


def _run_id_from_env(environ: Mapping[str, str]) -> str:
    elastic = environ.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return elastic
    if "WORLD_SIZE" in environ and "MASTER_PORT" in environ:
        # torchrun without --rdzv-id: every rank of this launch shares the launcher's identity.
        # On one node the agent (our parent) and its start time name the launch; across nodes
        # only the rendezvous address is shared, so say how to make it unique.
        seed = f"{environ.get('MASTER_ADDR', '')}:{environ['MASTER_PORT']}"
        local_world = _env_int(environ, "LOCAL_WORLD_SIZE", 0)
        if local_world and local_world == _env_int(environ, "WORLD_SIZE", 1):
            seed += f"/{os.getppid()}/{_process_start_ticks(os.getppid())}"
        else:
            _log.warning("otel_train: multi-node run without --rdzv-id or %s; the run id is derived from "
                         "MASTER_ADDR:MASTER_PORT and may repeat across runs.", semconv.ENV_RUN_ID)
        return "run-" + hashlib.blake2b(seed.encode(), digest_size=6).hexdigest()
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def _process_start_ticks(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "0"


@functools.lru_cache(maxsize=64)
def _hasher(prefix: str, size: int) -> Any:
    return hashlib.blake2b(prefix.encode(), digest_size=size)


def _trace_hasher(run_id: str) -> Any:
    """blake2b state of the prefix every trace id of `run_id` starts from (hashed once)."""
    return _hasher(f"otel_train/trace/{run_id}/", 16)


def _step_hasher(run_id: str) -> Any:
    """The same for the step span ids of `run_id`."""
    return _hasher(f"otel_train/step/{run_id}/", 8)


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


def step_span_id(run_id: str, step: int, rank: int, restart: int = 0) -> int:
    """Span id of rank `rank`'s `train.step` span; rank 0's is the root of the step's trace."""
    return _id_int(_digest(_step_hasher(run_id), f"{step}/{rank}/{restart}"))


_ZERO16, _ZERO8 = bytes(16), bytes(8)


class StepIds:
    """`trace_id_for` and `step_span_id` of one run and rank, as the big-endian bytes of the
    ids (what the OTLP fields hold): the exporter needs both for every step, and the run's
    prefix states are looked up once here, not per call. Returns None for the all-zero digest
    that the int forms map to 1 (never seen: one in 2**64)."""

    def __init__(self, run_id: str, rank: int, restart: int = 0) -> None:
        self._trace = _trace_hasher(run_id)
        self._step = _step_hasher(run_id)
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
    header = carrier if isinstance(carrier, str) else carrier.get("traceparent")
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
