"""`export/actor_traces.py`: an actor's spans wait for their call's top-level span, then go out
in its trace, whatever order they end in; what waits is bounded and flushed at shutdown."""

from __future__ import annotations

from otel_train.export import actor_traces
from otel_train.export.actor_traces import ActorTraces
from otel_train.wire.ids import actor_trace_id


def _place(traces: ActorTraces, seq: int, parent: int | None, out: list) -> None:
    traces.place(seq, parent, lambda trace: (seq, trace), out)


def test_a_call_goes_out_with_its_root_in_the_roots_trace() -> None:
    traces, out = ActorTraces("run", 7), []
    _place(traces, 3, 2, out)  # grandchild ends first
    _place(traces, 4, 1, out)
    _place(traces, 2, 1, out)
    assert out == [] and traces.count == 3
    _place(traces, 1, None, out)  # the call ends: everything under it goes out
    root = actor_trace_id("run", 7, 1)
    assert sorted(out) == [(1, root), (2, root), (3, root), (4, root)] and traces.count == 0
    _place(traces, 5, None, out)
    assert out[-1] == (5, actor_trace_id("run", 7, 5)) != (5, root)


def test_a_child_that_ends_after_its_parent_joins_the_parents_trace() -> None:
    traces, out = ActorTraces("run", 7), []
    _place(traces, 1, None, out)
    _place(traces, 2, 1, out)
    assert out == [(1, actor_trace_id("run", 7, 1)), (2, actor_trace_id("run", 7, 1))]


def test_what_waits_is_bounded_and_flushed(monkeypatch) -> None:
    monkeypatch.setattr(actor_traces, "MAX_WAITING", 3)
    traces, out = ActorTraces("run", 7), []
    for seq in (10, 11, 12):
        _place(traces, seq, 9, out)  # a call whose top-level span stays open
    assert out == []
    _place(traces, 21, 20, out)  # past the bound: the oldest call goes out, named after its top span
    assert sorted(out) == [(10, actor_trace_id("run", 7, 9)), (11, actor_trace_id("run", 7, 9)),
                           (12, actor_trace_id("run", 7, 9))]
    out.clear()
    traces.flush(out)  # at shutdown
    assert out == [(21, actor_trace_id("run", 7, 20))] and traces.count == 0
    _place(traces, 9, None, out)  # the open call ends after all: its trace is the one its spans got
    assert out[-1] == (9, actor_trace_id("run", 7, 9))
