"""otel_train: OpenTelemetry traces and metrics for PyTorch training loops.

The public API is this small facade (docs/api.md); everything else is private.
Importing the package is light: no torch, no OpenTelemetry SDK until `init()` runs.

    import otel_train

    otel_train.init()                        # once; optional (the first span initialises from OTEL_* env)
    for batch in loader:
        with otel_train.step():              # one training step
            with otel_train.span("train.forward"):
                loss = model(batch)
            ...
    otel_train.shutdown()                    # optional: also at exit and on SIGTERM
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_train import _runtime, semconv
from otel_train._distributed import RunInfo
from otel_train.export.attributes import describe
from otel_train.record import attach as _attach
from otel_train.record import recorder as _recorder
from otel_train.wire.ids import actor_trace_id, format_traceparent, region_span_id, step_span_id, trace_id_for

__all__ = ["init", "span", "step", "tag", "event", "inject", "link", "shutdown", "RunInfo"]

_recorder.auto_init = _runtime.auto_init


def init(**overrides: Any) -> RunInfo | None:
    """Configure once (idempotent): settings as keyword arguments beat `OTEL_*` / `OTEL_TRAIN_*`
    environment variables, which beat the defaults (docs/configuration.md).

    Also accepts `span_processors=[...]` and `metric_readers=[...]`: your own OpenTelemetry SDK
    span processors / metric readers, which then run in this process beside the exporter.
    Returns this process's `RunInfo` (run id, ranks), or None when disabled.
    """
    return _runtime.init(**overrides)


#: `otel_train.span(name, *, device_time=None, **attrs)`: time a region — `with span("train.forward"):`,
#: `@span("load")` on a sync or async function, or `async with span(...)`. Attribute values
#: are str, bool, int, float or lists of one of them (others are recorded as strings).
#: `device_time=True` also records device events at its start and end (on the current stream;
#: resolved off-thread into `device.duration_s` / `device.lag_s`), `False` never does; by default
#: only `semconv.DEVICE_TIMED_SPANS` do (forward, backward, optimizer, collective, checkpoint, eval).
#: One object for the life of the process (the region class, C where built): what a call makes
#: follows the mode (`record/span.py`: a device-timed region while a device is, if ever, in use;
#: a shared no-op when disabled), so a name imported before `init()` behaves as after it.
span = _recorder.Region


#: `otel_train.step(n=None, epoch=None, **attrs)`: mark one training step, `with otel_train.step(n):`
#: (n defaults to the previous step + 1). A C function where the hot path was built (no Python
#: frame per step), `record.recorder._py_new_step` otherwise.
step = _recorder.new_step


def tag(name: str) -> None:
    """Tag the current step (`checkpoint`, `eval`, `gc` or any word); between steps, the one just ended."""
    _attach.tag(name if type(name) is str else describe(name))


def event(name: str, **attrs: Any) -> None:
    """Record an instant (a loss spike, an LR change) on the current span."""
    _attach.event(name if type(name) is str else describe(name), attrs)


def inject() -> dict[str, str]:
    """The W3C trace context of the current span (`{"traceparent": ...}`), to send with a sample."""
    st = _runtime.state()
    if st is None or st.run is None or st.closed:
        return {}
    run = st.run
    region = _attach.current_region()
    rec = _recorder.active()
    if region is not None:
        step_n, _ = _recorder._step_ref(region.step)
        if step_n is None and run.role != semconv.ROLE_TRAINER:
            # An actor's call keeps its own trace, named after its top-level span (`export/actor_traces.py`).
            root, seen = region, {id(region)}  # regions exited out of order can be each other's parents
            while root.parent is not None and root.parent.rec is root.rec and id(root.parent) not in seen:
                root = root.parent
                seen.add(id(root))
            trace = actor_trace_id(run.run_id, st.salt, root.seq)
        else:
            trace = trace_id_for(run.run_id, step_n)
        return {"traceparent": format_traceparent(trace, region_span_id(st.salt, region.seq))}
    if rec is not None and isinstance(rec.step, _recorder.Step):
        n = rec.step.n
        return {"traceparent": format_traceparent(trace_id_for(run.run_id, n),
                                                  step_span_id(run.run_id, n, run.rank, run.restart, run.launch))}
    return {}


def link(carrier: Mapping[str, str] | str | None) -> None:
    """Link the current step (or, between steps, the next one) to the span in `carrier`."""
    _attach.link(carrier)


def shutdown(timeout_s: float | None = None) -> None:
    """Flush and stop, bounded by `timeout_s` (default OTEL_TRAIN_SHUTDOWN_TIMEOUT_S, 5 s)."""
    _runtime.shutdown(timeout_s)
