"""The optimizer phase: one `train.optimizer` span from the first of its calls to the last.

A step's update is often several calls: `clip_grad_norm_`, `optimizer.step()` (or
`GradScaler.step`), `zero_grad()`, with a little host code between them (`scaler.unscale_`,
`scaler.update()`). They are one phase, one span, not a span each: `train.optimizer` runs from
the start of its first call to the end of its last, and `train.optimizer.calls` lists them in
order. It ends when anything else begins (a forward, a backward, a batch fetch, an evaluation, a
checkpoint, the end of the step), at the end of its last call, so host code after the update is
never charged to it.

While one of its calls runs, the phase is the current region: what happens inside `step()` (an
LBFGS closure's forward and backward, collectives of a sharded optimizer, the user's own spans
and events) nests under it. Between its calls it is not: the span is entered at its first call,
taken off the current-region pointer after each, and recorded when the phase ends, with the end
of its last call (and, while a device is timed, the device event recorded there).
"""

from __future__ import annotations

from typing import Any

from otel_train import semconv
from otel_train.detect import _loops
from otel_train.detect.state import OPTIMIZER, State
from otel_train.record import device, direct, recorder
from otel_train.record.recorder import Region
from otel_train.wire.schema import KIND_SPAN, NO_STEP

#: `direct.leave` and `direct.make_current` for the phase: the C ones' own calls where the C hot
#: path is built. The phase goes on and off the current-region pointer as its calls begin and end:
#: this thread's pointer outside an event loop, no ContextVar set (a new context each time).
_leave = recorder._hotpath.leave if recorder._hotpath is not None else direct.leave
_make_current = recorder._hotpath.make_current if recorder._hotpath is not None else direct.make_current

#: `train.optimizer.calls` attribute dicts, one per distinct sequence of calls (never mutated).
_CALLS: dict[tuple[str, ...], dict[str, Any]] = {}
CLIP, STEP, ZERO_GRAD = "clip_grad_norm_", "step", "zero_grad"


_loops.bind_phase(OPTIMIZER, Region, KIND_SPAN, NO_STEP, _leave, _make_current, _CALLS,
                  semconv.TRAIN_OPTIMIZER_CALLS, device.end_event, direct.finish, STEP, ZERO_GRAD, CLIP)
#: `part_begin(s, name)`: a call of the update starts; the phase opens (if it is not open) and is
#: current while it runs. In C, as the two below: each runs at every update.
part_begin = _loops.part_begin
#: `part_end(r, s)`: that call is over; the phase is current no more and, for now, ends here (the
#: device event recorded there, while a device is timed). Returns the time.
part_end = _loops.part_end
#: `end(r, s)`: something else begins (or a call raised through its hook); the phase is recorded,
#: from its first call's start to its last's end, with `train.optimizer.calls` (`_CALLS`), and
#: covers the step where it is top level.
end = _loops.phase_end


def abandon(s: State) -> None:
    """Forget the phase unrecorded (detection uninstalled or reset mid-phase)."""
    running = s.part_phase
    s.part_phase = None
    if running is not None:
        _leave(running)
    phase = s.phase
    s.phase = None
    if phase is not None:
        device.drop_events(phase)
