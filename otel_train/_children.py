"""Following training into the processes a script starts, as `opentelemetry-instrument` would.

`multiprocessing` (and `torch.multiprocessing`, `mp.spawn`, `ProcessPoolExecutor`) start every
process through `BaseProcess.start`; `install()` wraps it, so each process the script starts
(but a DataLoader worker, which is never a trainer) is followed, whatever its start method:

- **spawn, forkserver**: the child is a fresh interpreter that reads its preparation data
  (`multiprocessing.spawn.get_preparation_data`) before it re-imports the main script. The data
  of a followed process carries one more entry, whose unpickling imports `otel_train.auto` in
  the child first: so the script's `import torch` there is hooked as in the parent, and the
  child's `prepare()` ignores the entry. Unknown keys are ignored by every CPython since 3.4.
- **fork**: the child is a copy of the parent with every hook in place; an at-fork handler
  resets detection's state there and lets the runtime start again.

In the child, detection waits (`install(lazy=True)`): the runtime starts at the first training
activity, so a process that never trains (an idle pool worker, a data producer) writes no file
and prints no closing line. By then `init_process_group` has run, so the child's rank and world
size come from `torch.distributed` whichever way they were given (`_distributed.detect_run_info`);
a child with no distributed rank is named by its `multiprocessing` identity (`rank0-p1`). A
fork or forkserver child leaves through `os._exit`, past `atexit`: a `multiprocessing` finalizer
runs our shutdown there. The parent gives its children its run id (`OTEL_TRAIN_RUN_ID`) and, if
it has recorded nothing yet and starts a function of the user's (the launcher of `mp.spawn`),
stands down: it stops without a closing line, its rank's files are the child's, and it starts
again if it trains later (a `Manager`'s or a pool's start leaves it running).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from otel_train import _compat, _runtime, semconv
from otel_train.record import recorder

_log = logging.getLogger("otel_train")

_original_start: Any = None
_original_prep: Any = None
#: True in the parent while a followed process starts (a forked child inherits it set).
_following = False
_at_fork_registered = False
#: This process is a forked child that `_children` follows: its runtime may start again.
_forked_trainer = False

#: Run in the child while it unpickles its preparation data, before it re-imports the script:
#: the child's first line, as `import otel_train.auto` is the parent's (detection waits there for
#: training, `install(lazy=True)`). The parent's `sys.path` is there for the import only:
#: `prepare()` sets the child's own next.
_BOOT = """
import os
import sys
_saved = sys.path[:]
sys.path[:0] = [p for p in path if p not in sys.path]
try:
    import otel_train.auto
except Exception as err:
    sys.stderr.write("otel_train: %s (pid %d) is not traced: importing otel_train there failed (%r)\\n"
                     % (name, os.getpid(), err))
finally:
    sys.path[:] = _saved
"""


class _Boot:
    """The entry a followed child's preparation data carries: unpickled, it runs `_BOOT`. Only
    builtins are named in the pickle, so a child that cannot import otel_train still starts."""

    def __init__(self, path: list[str], name: str) -> None:
        self.path = path
        self.name = name  # the process's, which the child has not taken yet while this runs

    def __reduce__(self) -> tuple[Any, ...]:
        return exec, (_BOOT, {"path": self.path, "name": self.name})


def install() -> None:
    """Follow the processes `multiprocessing` starts from now on (idempotent)."""
    global _original_start, _original_prep, _at_fork_registered
    if _original_start is not None:
        return
    import multiprocessing.process
    import multiprocessing.spawn
    _original_start = multiprocessing.process.BaseProcess.start
    _original_prep = multiprocessing.spawn.get_preparation_data
    multiprocessing.process.BaseProcess.start = _start  # type: ignore[method-assign]
    multiprocessing.spawn.get_preparation_data = _preparation_data
    if not _at_fork_registered:
        _at_fork_registered = True
        os.register_at_fork(after_in_child=_after_fork_in_child)


def uninstall() -> None:
    global _original_start, _original_prep
    if _original_start is None:
        return
    import multiprocessing.process
    import multiprocessing.spawn
    multiprocessing.process.BaseProcess.start = _original_start  # type: ignore[method-assign]
    multiprocessing.spawn.get_preparation_data = _original_prep
    _original_start = _original_prep = None


def _start(self: Any) -> None:
    """`BaseProcess.start`, following the process unless it is a DataLoader worker."""
    global _following
    if _original_start is None or not _follows(self):
        return (_original_start or type(self).start)(self)
    try:
        _before_child(_runs_users_code(self))
    except Exception:  # noqa: BLE001 - never into the user's start(): the child is still started
        _log.debug("otel_train: preparing to follow a child failed", exc_info=True)
    _following = True
    try:
        return _original_start(self)
    finally:
        _following = False


def _follows(process: Any) -> bool:
    target = _compat.process_target(process)
    return getattr(target, "__module__", None) != "torch.utils.data._utils.worker"


def _runs_users_code(process: Any) -> bool:
    """The process runs a function of the user's (or `mp.spawn`'s wrapper of one), not the
    standard library's own machinery (a `Manager`'s server, a pool's worker loop)."""
    module = getattr(_compat.process_target(process), "__module__", None) or ""
    return not module.startswith(("multiprocessing.", "concurrent.futures."))


def _preparation_data(name: str) -> dict[str, Any]:
    data = _original_prep(name)
    if _following:
        data["otel_train"] = _Boot(list(sys.path), name)
    return data


def _before_child(may_stand_down: bool) -> None:
    """In the parent: the child shares the run id. A parent that recorded nothing and starts a
    function of the user's (the `mp.spawn` launcher: its child may be rank 0) stands down; one
    that starts a `Manager` or a pool keeps its runtime (their children are named apart)."""
    st = _runtime.state()
    if st is None or st.closed or st.run is None:
        return
    os.environ.setdefault(semconv.ENV_RUN_ID, st.run.run_id)
    r = recorder._rec
    if may_stand_down and r is not None and r.next_step == 0 and r.step is None and r.pending() == 0 and _idle_detection():
        _runtime.stand_down()
        _wait_for_training()


def _idle_detection() -> bool:
    detect = sys.modules.get("otel_train.detect.state")
    return detect is None or (detect.s.step is None and not detect.s.pending and detect.s.eval_t0 is None)


def _wait_for_training() -> None:
    """Detection starts the runtime again at this process's first training activity."""
    state = sys.modules.get("otel_train.detect.state")
    if state is not None and state.installed:
        state.s.lazy = True


def _after_fork_in_child() -> None:
    global _following
    if not _following:
        return  # a DataLoader worker, or a fork we did not start: stays off (`_runtime`)
    _following = False
    global _forked_trainer
    _forked_trainer = True
    detect = sys.modules.get("otel_train.detect.install")
    if detect is not None:
        detect.forked_trainer()


def start_runtime() -> Any:
    """Detection's first training activity in a process that waited (`state.active`): start the
    runtime, also in a followed fork (`_runtime` keeps a forked child off unless told)."""
    if _forked_trainer and _runtime.state() is None:
        _runtime.init()
    r = recorder.auto_init()
    if r is not None:
        _exit_runs_shutdown()
    return r


def _exit_runs_shutdown() -> None:
    """A fork or forkserver child ends with `os._exit`, past `atexit`; `multiprocessing` runs its
    finalizers first (`util._exit_function`). Registered once the runtime runs: the child's
    bootstrap clears the registry it inherited."""
    import multiprocessing
    import multiprocessing.util
    if multiprocessing.parent_process() is None:
        return
    multiprocessing.util.Finalize(None, _runtime.shutdown, exitpriority=-100)
