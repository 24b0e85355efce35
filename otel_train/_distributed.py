"""Distributed context: who this process is in the run (the `ml.*` resource attributes).

The run id and ranks come from torchrun / torchelastic variables, else OTEL_TRAIN_RUN_ID,
else a generated id shared by all ranks of one launch. The ids derived from them (trace per
step, step spans, regions) are `otel_train.wire.ids`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_train import _compat, semconv
from otel_train._config_values import safe_run_id

_log = logging.getLogger("otel_train")


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
    #: This launch of the run, shared by its ranks (`launch_id`): two launches given the same run
    #: id (a rerun with OTEL_TRAIN_RUN_ID fixed) get different step span ids.
    launch: str = ""
    #: A `multiprocessing` child with no rank of its own (hogwild workers, a process pool): its
    #: identity there (`1`, `2`, `1:3` for a grandchild), which names its files beside its rank's.
    process: str = ""

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
            **({semconv.ML_RUN_LAUNCH: self.launch} if self.launch else {}),
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
    """Ranks from `torch.distributed` once `init_process_group` has run (however it was given
    them: env, arguments, init_method), else torchrun variables; run id from `run_id`,
    TORCHELASTIC_RUN_ID, or a shared generated one. A `multiprocessing` child that has neither
    (`_children`) is told apart from its siblings by its identity there."""
    environ = os.environ if environ is None else environ
    rank = _env_int(environ, "RANK", 0)
    world = _env_int(environ, "WORLD_SIZE", 1)
    process = ""
    dist = _torch_distributed()
    if dist is not None:
        rank, world = dist
    elif "RANK" not in environ:
        process = _multiprocessing_identity()
    return RunInfo(
        run_id=run_id or safe_run_id(_run_id_from_env(environ), "TORCHELASTIC_RUN_ID"),
        rank=rank,
        local_rank=_env_int(environ, "LOCAL_RANK", 0),
        world_size=world,
        node_rank=_env_int(environ, "GROUP_RANK", 0),
        restart=_env_int(environ, "TORCHELASTIC_RESTART_COUNT", 0),
        role=role,
        launch=launch_id(environ, world),
        process=process,
    )


def _torch_distributed() -> tuple[int, int] | None:
    """(rank, world size) of the default process group, if torch.distributed is initialised
    (never imported here: a program that has not imported it has no group)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - a half-torn-down group: the environment's ranks then
        return None
    return None


def _multiprocessing_identity() -> str:
    """`1`, `2`... for the children `multiprocessing` started; `` for a main process."""
    mp = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None and not _compat.multiprocessing_inheriting(mp.current_process()):
        return ""
    return ":".join(map(str, _compat.multiprocessing_identity(mp.current_process())))


def launch_id(environ: Mapping[str, str], world: int) -> str:
    """What the ranks of this launch share with no communication, and a rerun does not.

    One process: a random token (nobody to agree with). Several ranks: the rendezvous address
    (torchrun picks a free MASTER_PORT per launch unless told one), with the launcher's pid and
    start time when every rank runs on this node. Ranks launched with a fixed MASTER_PORT on
    several nodes and a fixed run id get the same ids on every rerun: set a new
    OTEL_TRAIN_RUN_ID (or --rdzv-id) per launch there."""
    if world <= 1:
        return secrets.token_hex(4)
    if "MASTER_PORT" not in environ:
        return ""
    seed = f"{environ.get('MASTER_ADDR', '')}:{environ['MASTER_PORT']}"
    local_world = _env_int(environ, "LOCAL_WORLD_SIZE", 0)
    if local_world and local_world == world:
        seed += f"/{os.getppid()}/{_process_start_ticks(os.getppid())}"
    return hashlib.blake2b(seed.encode(), digest_size=4).hexdigest()


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
