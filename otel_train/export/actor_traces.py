"""An inference actor's traces: each top-level span outside a step starts its own trace.

A trainer's spans belong to step traces (`wire.ids.trace_id_for`). An inference actor
(`ml.role=inference`) has no steps: its `infer.generate` calls keep their own traces, which the
trainer's steps link to (docs/actors.md). The trace is named after the call's top-level
span (`wire.ids.actor_trace_id`, from the process's salt and that span's sequence number), the
same rule `otel_train.inject()` follows inside the call, so a carrier names the trace its
span will be exported in.

A record knows its parent's sequence number, not its root's, and children end (and arrive)
before their parents. So a span with a parent waits here until its top-level ancestor arrives,
then the whole call is emitted with its trace; calls are short and few per second, and what
waits is bounded (`MAX_WAITING`: past it, or at shutdown, the oldest calls go out under the
trace of their highest ancestor seen).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from otel_train.wire.ids import actor_trace_id

MAX_WAITING = 4096
_RECENT = 1024  # ids of emitted spans remembered, for a child that ends after its parent

Make = Callable[[int], Any]  # builds the span once its trace id is known


class ActorTraces:
    """Spans of an inference actor's top-level calls, held until each call's trace is known."""

    def __init__(self, run_id: str, salt: int) -> None:
        self.run_id = run_id
        self.salt = salt
        self.waiting: dict[int, list[tuple[int, Make]]] = {}  # parent seq -> (seq, make) of its children
        self.count = 0
        self.recent: OrderedDict[int, int] = OrderedDict()  # seq -> trace id, of spans emitted

    def place(self, seq: int, parent_seq: int | None, make: Make, out: list[Any]) -> None:
        """A span (`seq`, its parent's `parent_seq`): emitted into `out` with its descendants
        once its trace is known, else held."""
        if parent_seq is None:
            self._emit(seq, actor_trace_id(self.run_id, self.salt, seq), make, out)
            return
        trace = self.recent.get(parent_seq)
        if trace is not None:  # its parent went out already (it ended first)
            self._emit(seq, trace, make, out)
            return
        self.waiting.setdefault(parent_seq, []).append((seq, make))
        self.count += 1
        if self.count > MAX_WAITING:
            self._release_oldest(out)

    def flush(self, out: list[Any]) -> None:
        """Emit everything still held (at shutdown: a call whose top-level span never ended)."""
        while self.waiting:
            self._release_oldest(out)

    def _emit(self, seq: int, trace: int, make: Make, out: list[Any]) -> None:
        out.append(make(trace))
        self._remember(seq, trace)
        self._descendants(seq, trace, out)

    def _descendants(self, seq: int, trace: int, out: list[Any]) -> None:
        """Every held span below `seq`, into `out` with `trace`."""
        stack = [seq]
        while stack:
            for child, child_make in self.waiting.pop(stack.pop(), ()):
                self.count -= 1
                out.append(child_make(trace))
                self._remember(child, trace)
                stack.append(child)

    def _remember(self, seq: int, trace: int) -> None:
        self.recent[seq] = trace
        if len(self.recent) > _RECENT:
            self.recent.popitem(last=False)

    def _release_oldest(self, out: list[Any]) -> None:
        """The oldest held group goes out, with every group below its highest held ancestor,
        under that ancestor's trace: the one it gets if it still arrives as a top-level span."""
        top = next(iter(self.waiting))
        parent_of = {child: parent for parent, group in self.waiting.items() for child, _ in group}
        seen = {top}  # regions exited out of order can name each other as parents: stop at a cycle
        while top in parent_of and parent_of[top] not in seen:
            top = parent_of[top]
            seen.add(top)
        trace = actor_trace_id(self.run_id, self.salt, top)
        self._remember(top, trace)
        self._descendants(top, trace, out)
