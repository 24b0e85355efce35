"""Lifecycle: `init` builds the recorder, worker and sink; `shutdown` flushes within a bound.

Shutdown also runs at interpreter exit and on SIGTERM (then the signal's default action is
re-raised). A forked child (a DataLoader worker) inherits a disabled state: it is not a
trainer, must not write into the parent's exporter pipe, and may call `init()` itself.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from otel_train import _resource, _stderr
from otel_train._config import Config
from otel_train._distributed import RunInfo, detect_run_info
from otel_train.export.destination import make_setup
from otel_train.export.samples import Sampler
from otel_train.export.sinks import ENV_CHILD, LocalSink, ProcessSink
from otel_train.export.worker import Worker
from otel_train.record import recorder as _recorder
from otel_train.record import device as _device
from otel_train.record import span
from otel_train.record.clock import Clock, SystemClock
from otel_train.record.misuse import span_name
from otel_train.wire.ids import new_salt
from otel_train.wire.schema import Truncated

_log = logging.getLogger("otel_train")
_lock = threading.RLock()


class _State:
    """What `init` built; `None` fields when disabled."""

    def __init__(self, cfg: Config, run: RunInfo | None, worker: Worker | None, destination: str) -> None:
        self.cfg = cfg
        self.run = run
        self.worker = worker
        self.destination = destination
        self.salt = 0
        self.closed = False
        self.device: Any = None  # the device-timing resolver (`record.device_resolver.DeviceResolver`) when on


_state: _State | None = None
_forked_child = False
_hooks_installed = False


def init(span_processors: Sequence[Any] = (), metric_readers: Sequence[Any] = (),
         clock: Clock | None = None, **overrides: Any) -> RunInfo | None:
    """Configure once; later calls return the existing run. See `otel_train.init`.

    Never raises into the caller: a failure here leaves the process uninstrumented and says so."""
    global _state
    init_ns = (clock or SystemClock()).wall_ns()  # the run's goodput window opens here
    with _lock:
        if _state is not None and not _state.closed:
            if overrides or span_processors or metric_readers:
                _log.debug("otel_train: init() called again; the first configuration stays in force")
            return _state.run
        try:
            return _init(span_processors, metric_readers, clock, overrides, init_ns)
        except Exception as err:  # noqa: BLE001 - instrumentation must never stop training
            _log.warning("otel_train: could not start (%r); this process runs uninstrumented.", err)
            _disable(Config())
            return None


def _disable(cfg: Config) -> None:
    global _state
    _recorder.install(None)
    _state = _State(cfg, None, None, "disabled")
    span.set_disabled(True)  # `otel_train.span(...)` makes the shared no-op


def _init(span_processors: Sequence[Any], metric_readers: Sequence[Any], clock: Clock | None,
          overrides: dict[str, Any], init_ns: int) -> RunInfo | None:
    global _state
    if os.environ.get(ENV_CHILD) == "1":
        overrides["disabled"] = True  # the exporter process never instruments itself
    cfg = Config.resolve(overrides)
    if cfg.disabled:
        _disable(cfg)
        return None
    if _in_dataloader_worker():
        _disable(cfg)
        return None
    run = detect_run_info(cfg.run_id, cfg.role)
    recorder = _recorder.Recorder(cfg.buffer_size, clock)
    salt = new_salt()
    # Light on purpose: the training thread pays for this (often inside its first step), so
    # nothing here imports the SDK, gRPC or the pipeline unless this process exports itself.
    setup = make_setup(cfg, run, _resource.process_attributes(), salt, init_ns)

    def local() -> LocalSink:
        from otel_train.export.pipeline import ExportPipeline  # the SDK and gRPC: only where this process exports
        return LocalSink(ExportPipeline(setup, span_processors, metric_readers))

    sink: Any
    # The console exporter prints on stdout, which in process mode is the child's progress pipe.
    console = "console" in (setup.traces.kind, setup.metrics.kind)
    if cfg.export_mode == "thread" or span_processors or metric_readers or console:
        sink = local()
    else:
        try:
            sink = ProcessSink(setup, local)
        except OSError as err:
            _log.warning("otel_train: cannot start the exporter process (%s); exporting from a thread.", err)
            sink = local()
    if isinstance(sink, ProcessSink) and _recorder._hotpath is not None:  # the exporter unpacks with it too
        try:
            recorder.packing = True  # plain regions as slots: the worker moves them as bytes
        except MemoryError:
            _log.warning("otel_train: no memory for a packed buffer of %d records; records stay tuples.",
                         cfg.buffer_size)
    resolve = None
    if cfg.device_timing == "auto":
        resolve = _device.install(recorder)  # chooses the device lazily; torch is never imported here
    worker = Worker(recorder, sink, cfg.flush_interval_ms / 1000.0, resolve=resolve, sample=Sampler())
    _state = _State(cfg, run, worker, setup.traces.describe())
    _state.salt = salt
    _state.device = resolve
    _recorder.install(recorder)
    span.set_disabled(False)
    worker.start()
    _install_process_hooks()
    return run


def _in_dataloader_worker() -> bool:
    """A torch DataLoader worker (fork, forkserver or spawn) is never a trainer: it records
    nothing (the trainer's `train.data` spans show its batches), and says so once, from worker 0."""
    data = sys.modules.get("torch.utils.data")  # never imported here: a worker has it already
    info = data.get_worker_info() if data is not None else None
    if info is None:
        return False
    if getattr(info, "id", None) == 0 and _first_worker_of_run():
        _log.warning("otel_train: spans made in DataLoader worker processes are not recorded (the trainer's "
                     "train.data spans show the batches they load); otel_train calls there do nothing.")
    return True


def _first_worker_of_run() -> bool:
    """Whether no DataLoader worker of this trainer said the notice yet. Workers are new
    processes each epoch (unless `persistent_workers`), so a flag in memory would say it every
    epoch: the first one creates a marker named by the trainer's pid, atomically."""
    marker = _worker_notice_marker(os.getppid())
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True  # no marker possible: say it (once per epoch) rather than never
    return True


def _worker_notice_marker(trainer_pid: int) -> str:
    """The marker of `_first_worker_of_run`, named by the trainer's pid; the trainer removes it
    at shutdown, so no run leaves a file behind in the temporary folder."""
    import tempfile

    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"otel_train-{uid}-{trainer_pid}-dataloader-notice")


def state() -> _State | None:
    return _state


def sdk_disabled() -> bool:
    """True when OTEL_SDK_DISABLED (or `init(disabled=True)`) is in force: then nothing may be
    instrumented at all, not even a hook that would return at once."""
    if _state is not None and not _state.closed:
        return _state.cfg.disabled
    return Config.resolve({}, {"OTEL_SDK_DISABLED": os.environ.get("OTEL_SDK_DISABLED", "")}).disabled


def auto_init() -> _recorder.Recorder | None:
    """Initialise from the environment on first use; None if disabled, shut down, or a forked child."""
    if _state is None and not _forked_child:
        init()
    return _recorder.active()


def shutdown(timeout_s: float | None = None, reason: str | None = None) -> None:
    """Flush and stop within `timeout_s` (default: OTEL_TRAIN_SHUTDOWN_TIMEOUT_S); print what happened once.
    `reason` (a signal's name): why the process stops, put on what is force-ended."""
    with _lock:
        st = _state
        if st is None or st.closed or st.worker is None:
            if st is not None:
                st.closed = True
            return
        st.closed = True
        bound = st.cfg.shutdown_timeout_s if timeout_s is None else max(0.0, float(timeout_s))
        deadline = time.monotonic() + bound
        global _cut_by
        _cut_by = reason or _uncaught()
        for fn in list(_before_shutdown):
            try:
                fn()
            except Exception as err:  # noqa: BLE001 - an integration must not block shutdown
                _log.warning("otel_train: closing %s at shutdown failed: %r", getattr(fn, "__qualname__", fn), err)
        recorder = st.worker.recorder
        _recorder.install(None)
        held = _SignalsHeld(deadline)
        try:
            _truncate_open(recorder, reason or _uncaught())
            stats = st.worker.stop(deadline)
            if st.device is not None:
                _device.uninstall()
            _report(st, recorder, stats, bound)
        except Exception as err:  # noqa: BLE001 - shutdown runs at exit and in signal handlers
            _log.warning("otel_train: shutdown failed: %r", err)
        finally:
            try:
                os.unlink(_worker_notice_marker(os.getpid()))
            except OSError:
                pass
            held.release(raise_again=not _exiting)


_exiting = False  # shutdown runs from `atexit`: a signal held meanwhile is not raised again


class _SignalsHeld:
    """SIGINT and SIGTERM held off during the bounded flush (on the main thread, where handlers
    can be set). A second Ctrl-C or SIGTERM there raised KeyboardInterrupt (or killed the
    process) in the middle of it: no closing line, and "Exception ignored in atexit callback".
    Each is said once; the flush ends within its bound anyway. After it the handlers are put
    back, and one held signal is raised again, unless the process is exiting already."""

    _SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.got: list[int] = []
        self.saved: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for name in self._SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:
                continue
            try:
                self.saved[sig] = signal.signal(sig, self._note)
            except (ValueError, OSError, TypeError):
                pass

    def _note(self, signum: int, frame: Any) -> None:
        if signum not in self.got:
            _stderr.line(f"otel_train: {signal.Signals(signum).name} during the final flush: it ends within "
                         f"the shutdown bound ({max(0.0, self.deadline - time.monotonic()):.1f} s left), "
                         "then the closing line says what was sent.")
        self.got.append(signum)

    def release(self, raise_again: bool) -> None:
        for sig, handler in self.saved.items():
            try:
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, OSError, TypeError):
                pass
        if raise_again and self.got and self.saved:
            signal.raise_signal(self.got[0])


def stand_down() -> None:
    """This process only starts the trainers and has recorded nothing (`_children`: the launcher
    of `mp.spawn`): stop at once, with no closing line and no file of its rank (the exporter is
    killed, not flushed), so that a first training activity here may start it again."""
    global _state
    with _lock:
        st = _state
        if st is None or st.closed or st.worker is None:
            return
        _recorder.install(None)
        st.worker._stop = True
        st.worker._wake.set()
        st.worker._thread.join(timeout=1.0)
        st.worker.sink.abort()
        if st.device is not None:
            _device.uninstall()
        st.closed = True
        _state = None


#: Called first by `shutdown()`, while the recorder still records: integrations close what they
#: hold open at its real end (automatic detection's last step waits for a trigger that an
#: explicit shutdown right after the loop would otherwise cut as truncated).
_before_shutdown: list[Callable[[], None]] = []
#: Why the shutdown under way cuts the run short (a signal's name, an uncaught exception's
#: type), None for a plain end: `before_shutdown` hooks leave what is unfinished open then, to
#: be marked truncated.
_cut_by: str | None = None


def cut_by() -> str | None:
    """While `shutdown()` runs its `before_shutdown` hooks: what cuts the run short, if anything."""
    return _cut_by


def before_shutdown(fn: Callable[[], None]) -> None:
    if fn not in _before_shutdown:
        _before_shutdown.append(fn)


def remove_before_shutdown(fn: Callable[[], None]) -> None:
    if fn in _before_shutdown:
        _before_shutdown.remove(fn)


def _uncaught() -> str | None:
    """The type of the exception that is ending the program, if one is (at exit, uncaught)."""
    exc = getattr(sys, "last_exc", None)
    kind = type(exc) if exc is not None else getattr(sys, "last_type", None)
    return kind.__name__ if kind is not None else None


def _truncate_open(recorder: _recorder.Recorder, reason: str | None = None) -> None:
    """Force-end what is still open (a SIGTERM mid-step) and mark it `otel_train.truncated`; with
    a `reason` (a signal, an uncaught exception) it ended in error."""
    now = recorder.now()
    for record in recorder.open_records():
        if not isinstance(record, _recorder.Step) and type(record.name) is not str:
            record.name = span_name(record.name)  # as its exit would have
        record.t1 = now
        record.exc = Truncated(reason) if reason else Truncated
        if isinstance(record, _recorder.Step):
            recorder.step = _recorder.After(record)
        recorder.append(record)


def _unconfirmed(stats: dict[str, Any], failed: int) -> str:
    """The closing line's note on failed spans that were sent and never answered, if any."""
    unconfirmed = min(failed, stats.get("unconfirmed", 0))
    if not unconfirmed:
        return ""
    return (f", {unconfirmed} of them unconfirmed (they may have been sent, and no answer came before the "
            "bound: the collector may have them)")


_KILLED = ("; the exporter process had not finished at the bound (stopped, or starved of CPU) and was killed: "
           "what it had not confirmed is counted as failed")


def _report(st: _State, recorder: _recorder.Recorder, stats: dict[str, Any] | None, bound: float) -> None:
    """The closing line: what was exported where, what was lost and why. Under torchrun each
    rank says its own, so each names its rank."""
    buffer_full = recorder.dropped + (stats or {}).get("overflow", 0)
    who = f"otel_train: rank {st.run.rank}:" if st.run is not None and st.run.world_size > 1 else "otel_train:"
    if stats is None:
        # The sink is still busy: what it confirmed so far counts as exported, the rest as lost.
        partial = getattr(st.worker.sink, "partial_stats", lambda: {})()
        buffer_full += partial.get("overflow", 0)
        failed = partial.get("failed", 0) + st.worker.pending()
        msg = (f"{who} {partial.get('exported', 0)} spans exported to {st.destination} when the shutdown bound "
               f"of {bound:g} s was reached; dropped: {buffer_full} (buffer full), "
               f"{failed} (export failed or cut off at shutdown)") + _unconfirmed(partial, failed)
        if getattr(st.worker.sink, "killed", False):
            msg += _KILLED
    else:
        failed = stats.get("failed", 0)
        if st.destination == "none":
            msg = f"{who} {stats.get('built', 0)} spans emitted (no exporter configured)"
        else:
            msg = f"{who} {stats.get('exported', 0)} spans exported to {st.destination}"
        if buffer_full or failed:
            msg += f"; dropped: {buffer_full} (buffer full), {failed} (export failed or cut off at shutdown)"
            msg += _unconfirmed(stats, failed)
        else:
            msg += "; none dropped"
        if stats.get("killed"):
            msg += _KILLED
        duplicated = stats.get("duplicated", 0)
        if duplicated:
            msg += (f"; {duplicated} of the exported may have arrived twice (a request that got no answer in "
                    "OTEL_EXPORTER_OTLP_TIMEOUT was sent again)")
    device = st.device
    if device is not None and (device.timing.skipped or device.unresolved):
        msg += (f"; device timing: {device.timing.skipped} regions without events (event pool empty), "
                f"{device.unresolved} records without device time (events not complete in time)")
    _stderr.line(msg)
    goodput = stats.get("goodput") if stats else None
    if goodput and st.run is not None and st.run.rank == 0:  # one line for the job, not one per rank
        from otel_train.export.goodput import summary_line  # the analysis rules, for rank 0's last line only
        _stderr.line(summary_line(goodput, st.run.rank))


# --- process hooks ------------------------------------------------------------------
def _install_process_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):
            pass


def _at_exit() -> None:
    global _exiting
    _exiting = True
    interrupted = _uncaught() == "KeyboardInterrupt"
    shutdown()
    if interrupted:
        _keep_interrupt_exit_status()


def _keep_interrupt_exit_status() -> None:
    """Leave a Ctrl-C's exit status as it would be without us.

    CPython ends a program stopped by an uncaught KeyboardInterrupt by killing itself with SIGINT
    (status -2, 130 in a shell), if the last code it evaluated the top-level way ended in that
    KeyboardInterrupt. A module imported during exit (our shutdown may import the encoder) can
    evaluate code that way in its initialisation and clear the note, and the status becomes 1.
    Evaluating a `raise KeyboardInterrupt` the same way puts it back."""
    try:
        import ctypes

        run = ctypes.pythonapi.PyRun_String
        run.restype = ctypes.py_object
        run.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
        run(b"raise KeyboardInterrupt", 257, {}, {})  # 257: Py_file_input
    except KeyboardInterrupt:
        pass
    except Exception:  # noqa: BLE001 - not CPython, or no ctypes: the status may read 1
        pass


def _on_sigterm(signum: int, frame: Any) -> None:
    try:
        shutdown(reason="SIGTERM")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _after_fork_in_child() -> None:
    global _state, _forked_child, _lock
    _lock = threading.RLock()  # the parent may have held it mid-fork
    # The child keeps the parent's pipe to the exporter open but never writes to it: its
    # worker thread did not survive the fork and its recorder is gone.
    _recorder.install(None)
    device = sys.modules.get("otel_train.record.device")
    if device is not None:
        device.uninstall()  # the parent's device events are not the child's to touch
    _state = None
    _forked_child = True
