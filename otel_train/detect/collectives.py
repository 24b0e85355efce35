"""Collectives: the `torch.distributed` collective functions are patched.

Each call is a `train.collective` span with `comm.op`, `comm.bytes` and `comm.group_size`. One
right after the optimizer update (a logged loss's all-reduce) extends the update: the step ends
after it. `init_process_group` is watched too: a process whose runtime started before it, with
ranks from the environment that its group contradicts (a launcher that passes `rank=` and sets
no RANK), is told once that its traces carry the environment's rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from otel_train import _distributed, _runtime, semconv
from otel_train.detect.compile import compiled as _c, dynamo_compiling, tc
from otel_train.detect.patches import Patches
from otel_train.detect.state import COLLECTIVE, region
from otel_train.detect.state import s as _s
from otel_train.record import recorder

patches = Patches()
_log = logging.getLogger("otel_train")

#: Collective -> the parameter holding its payload (None: it has none).
_COLLECTIVES: dict[str, str | None] = {
    "all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor", "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor", "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input", "all_to_all": "input_tensor_list",
    "all_to_all_single": "input", "gather": "tensor", "scatter": "scatter_list", "barrier": None,
}


def _nbytes(payload: Any) -> int:
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, (list, tuple)):
        return sum(t.numel() * t.element_size() for t in payload if isinstance(t, torch.Tensor))
    return 0


def collective_wrapper(op: str, payload_at: int | None, payload_name: str | None, group_at: int | None
                       ) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        recorder.settle()
        s = _s
        if s.coll_depth or _c.seen and dynamo_compiling() or tc._is_compiling_flag:
            return wrapped(*args, **kwargs)
        r = recorder._rec
        if r is None:
            return wrapped(*args, **kwargs)
        payload = None
        if payload_at is not None:
            payload = args[payload_at] if len(args) > payload_at else kwargs.get(payload_name)
        group = args[group_at] if group_at is not None and len(args) > group_at else kwargs.get("group")
        attrs = {semconv.COMM_OP: op, semconv.COMM_BYTES: _nbytes(payload)}
        try:
            attrs[semconv.COMM_GROUP_SIZE] = torch.distributed.get_world_size(group)
        except Exception:  # noqa: BLE001 - not a member, or not initialised: the call itself will say
            pass
        s.coll_depth = 1
        try:
            with region(COLLECTIVE, attrs) as live:
                return wrapped(*args, **kwargs)
        finally:
            s.coll_depth = 0
            if live.rec is not None and live.step is s.step and s.step is not None:
                if live.parent is None:
                    s.cover += (live.t0, live.t1)  # `coverage.cover`: a top-level phase of the step
                if s.opt_end is not None:
                    s.opt_end = live.t1  # after the update (a logged loss): the step ends after it
    return wrapper


def _after_init_process_group(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    out = wrapped(*args, **kwargs)
    try:
        _check_rank()
    except Exception:  # noqa: BLE001 - a check, never into the user's init_process_group
        _log.debug("otel_train: checking the rank after init_process_group failed", exc_info=True)
    return out


def _check_rank() -> None:
    """Once: the rank and world size the process group says against those the runtime started
    with (a runtime that waited, in a `multiprocessing` child, reads the group's)."""
    global _rank_checked
    st = _runtime.state()
    if _rank_checked or st is None or st.closed or st.run is None:
        return
    group = _distributed._torch_distributed()
    if group is None or group == (st.run.rank, st.run.world_size):
        return
    _rank_checked = True
    _log.warning("otel_train: torch.distributed says this process is rank %d of %d, but otel_train started "
                 "before init_process_group as rank %d of %d (RANK / WORLD_SIZE); its spans and files carry "
                 "rank %d. Launch with torchrun, or set RANK and WORLD_SIZE for each process.",
                 group[0], group[1], st.run.rank, st.run.world_size, st.run.rank)


_rank_checked = False


def install() -> None:
    if not torch.distributed.is_available():
        return
    import inspect

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    init = getattr(c10d, "init_process_group", None)
    for owner in (dist, c10d):
        if init is not None and getattr(owner, "init_process_group", None) is init:
            patches.wrap(owner, "init_process_group", _after_init_process_group)
    for op, payload_name in _COLLECTIVES.items():
        fn = getattr(c10d, op, None)
        if fn is None:
            continue
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            continue
        payload_at = params.index(payload_name) if payload_name in params else None
        group_at = params.index("group") if "group" in params else None
        wrapper = collective_wrapper(op, payload_at, payload_name, group_at)
        for owner in (dist, c10d):
            if getattr(owner, op, None) is fn:
                patches.wrap(owner, op, wrapper)


def uninstall() -> None:
    patches.undo()
