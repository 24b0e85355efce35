"""Where detection is in the current step: one `State` per process, shared by every hook family.

Also the few helpers every family uses: the live phase region (`region`), the shared attribute
dicts of micro-batches (`mb_attrs`) and the recorder in force (`active`).
"""

from __future__ import annotations

import weakref
from typing import Any

from otel_train import _children, semconv
from otel_train.record import recorder
from otel_train.record.recorder import Region, Step

DATA = semconv.SPAN_DATA
FORWARD = semconv.SPAN_FORWARD
BACKWARD = semconv.SPAN_BACKWARD
OPTIMIZER = semconv.SPAN_OPTIMIZER
EVAL = semconv.SPAN_EVAL
CHECKPOINT = semconv.SPAN_CHECKPOINT
GC = semconv.SPAN_GC
COLLECTIVE = semconv.SPAN_COLLECTIVE
ZERO_GRAD = semconv.SPAN_ZERO_GRAD
OTHER = semconv.SPAN_OTHER

# What the outermost forward in flight is.
FWD_TRAIN, FWD_EVAL, FWD_AUX, FWD_SKIP = range(4)
# Which training phase reaches `machine.train_activity`.
PH_FWD, PH_BWD, PH_OPT = range(3)
# Pending entry fields: [name, t0, t1, dataset, iterator, (samples, tokens) or None]
# (a batch fetch, or a zero_grad).
P_NAME, P_T0, P_T1, P_SRC, P_ITER, P_SIZE = range(6)

#: One shared, never mutated attribute dict per micro-batch index: no dict per call.
MB_ATTRS = tuple({semconv.TRAIN_MICRO_BATCH: i} for i in range(256))

#: Whether detection is installed (`install.install`); the hooks themselves never look.
installed = False


def mb_attrs(i: int) -> dict[str, int]:
    return MB_ATTRS[i] if i < 256 else {semconv.TRAIN_MICRO_BATCH: i}


def region(name: str, attrs: dict[str, Any] | None = None) -> Region:
    """A live phase region, as `otel_train.span` makes it (device-timed while a device is)."""
    live = Region(name)
    if attrs is not None:
        live.attrs = attrs
    return live


class State:
    """Where the detector is in the current step; one per process (`s`)."""

    __slots__ = ("step", "boundary", "opt_end", "last_end", "stepped", "mb", "mb_fwd", "mb_bwd",
                 "pending", "data_driven", "train_src", "train_iter", "epoch", "epoch_fixed", "uses_opt",
                 "fetching", "copying", "fwd_depth", "fwd_kind", "fwd_region", "fwd_nested", "bwd_depth", "opt_depth",
                 "opt_owner", "opt_frame", "opt_closure", "opt_t0", "nest", "evaluations", "scaling", "aux_depth",
                 "phase", "phase_end", "phase_parts", "part_phase", "step_site", "site_probe", "last_callers", "cover",
                 "after", "ckpt_depth", "coll_depth", "eval_t0", "eval_t1", "eval_data", "eval_module",
                 "eval_region", "eval_explicit", "gc_t0", "lazy", "replay")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.step: Step | None = None  # the step this module opened and has not closed
        self.boundary: int | None = None  # perf ns where the next step begins
        self.opt_end: int | None = None  # end of the open step's last update: the step is complete
        self.last_end: int | None = None  # end of the open step's last phase
        self.stepped: list[int] = []  # ids of the optimizers that stepped in the open step
        self.mb = 0
        self.mb_fwd = False  # the current micro-batch had a forward
        self.mb_bwd = False  # ... and a backward
        self.pending: list[list[Any]] = []  # fetches (and zero_grads) not yet given to a step
        self.data_driven: bool | None = None  # batches come from a DataLoader; False: not one per step
        self.train_src: Any = None  # the loader (its sampler) training batches come from
        self.train_iter: weakref.ref[Any] | None = None  # the iterator of the current epoch
        self.epoch: int | None = None
        self.epoch_fixed = False  # a framework callback sets the epoch
        self.uses_opt: bool | None = None
        self.fetching = False
        self.copying = False  # a fetched batch's `Tensor.to` copies may come (`data.copy_edge`)
        self.fwd_depth = 0
        self.fwd_kind = FWD_SKIP
        self.fwd_region: Region | None = None
        self.fwd_nested = False  # the forward in flight is a closure evaluation inside the update
        self.bwd_depth = 0
        self.opt_depth = 0  # inside optimizer.step() (or GradScaler.step)
        self.opt_owner: Any = None
        self.opt_frame: Any = None  # the frame that called our pre-hook (torch's step wrapper)
        self.opt_closure = False  # that step() was given a closure
        self.opt_t0 = 0  # when that step() began
        self.nest = False  # its closure evaluations nest under the update (`optimizer.nests`)
        self.evaluations = 0  # closure evaluations (forwards) in that step() so far
        self.scaling = False  # inside GradScaler.step: its optimizer's own step() is nested
        self.aux_depth = 0
        # The optimizer phase (`phase`): one `train.optimizer` span from its first part to its last.
        self.phase: Region | None = None  # entered, then taken off the current-region pointer
        self.phase_end = 0  # end of its last part (perf ns)
        self.phase_parts: list[str] = []  # what it covered, in order
        self.part_phase: Any = None  # while a part runs: the phase, which it made current
        self.step_site: Any = None  # where the update was called from (`sites`), while probing
        self.site_probe = True
        self.last_callers: Any = None  # (id, code, f_lasti) of the 2 frames that called the last update (`sites.callers`)
        # Coverage (`coverage`): the open step's top-level intervals [t0, t1, t0, t1, ...], and
        # the end of what covers the time between steps (the last step or sibling).
        self.cover: list[int] = []
        self.after: int | None = None
        self.ckpt_depth = 0
        self.coll_depth = 0
        self.eval_t0: int | None = None
        self.eval_t1: int | None = None
        self.eval_data: list[list[Any]] = []  # the fetches an implicit evaluation pass absorbed
        self.eval_module: Any = None  # the module it last ran
        self.eval_region: Region | None = None  # the live region of an explicit (framework) pass
        self.eval_explicit = False
        self.gc_t0: int | None = None
        self.lazy = False
        # While `batch` replays a call: what only its moment knew (`batch._facts`), else None.
        self.replay: tuple[Any, ...] | None = None


#: The detector's state: every hook reads and moves it.
s = State()


def caught_up(busy: Any, s: State) -> bool:
    """For a wrapper whose guard `busy(s)` held: the guard again once detection's calls that
    wait (`batch`) have run, since until then the state lags the calls."""
    recorder.settle()
    return bool(busy(s))


def active() -> recorder.Recorder | None:
    """The recorder, initialising it on first training activity in a process that waits to know
    whether it is a trainer (a `multiprocessing` child, see `install.install(lazy=True)`)."""
    r = recorder._rec
    if r is None and s.lazy:
        s.lazy = False
        from torch.utils.data import get_worker_info
        if get_worker_info() is None:  # a DataLoader worker is never a trainer
            r = _children.start_runtime()
    return r
