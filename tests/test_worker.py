"""The worker and what it hands records to (`export/worker.py`, `pacer.py`, `pipe.py`,
`sinks.py`): drains, their pacing, the pipe format, the exporter process and the thread sink."""

from __future__ import annotations

from typing import Any

import pytest

from otel_train.wire import schema


def test_records_cross_to_the_exporter_process_as_plain_values() -> None:
    """The pipe to the exporter carries hot-path tuples as they are; what the exporter (no torch,
    no numpy) could not load, or what would copy a tensor, is converted on the way."""
    import enum
    from collections import namedtuple

    import torch

    from otel_train.export.pipe import FORMAT_MARSHAL, FORMAT_PICKLE, dumps, loads
    from otel_train.record import recorder as _recorder

    class Level(enum.IntEnum):
        HIGH = 3

    Pair = namedtuple("Pair", "a b")

    class StepFailed(Exception):  # a class the exporter process could not import
        pass

    record = (0, "train.forward", 7, None, (1, 1), 10, 20,
              {"t": torch.ones(2, 3), "size": torch.Size([2, 3]), "lvl": Level.HIGH, "pair": Pair(1, 2),
               "f": torch.tensor(0.5).numpy().dtype.type(0.5), "plain": "x", "n": 4}, StepFailed, None)
    payload = dumps(("batch", [(False, [record])], 0, {}))
    assert payload[:1] == FORMAT_PICKLE  # marshal refuses these values: the pickler converts them
    loaded = loads(payload)
    (_, [(_, [out])], _, _) = loaded
    attrs = out[7]
    assert attrs["t"] == "<tensor shape=(2, 3) dtype=torch.float32 device=cpu>"
    assert attrs["t"].type_name == "Tensor"  # the exporter says, once, that a tensor was described
    assert attrs["size"] == (2, 3) and type(attrs["size"]) is tuple
    assert attrs["lvl"] == 3 and type(attrs["lvl"]) is int
    assert attrs["pair"] == (1, 2) and type(attrs["pair"]) is tuple
    assert attrs["f"] == 0.5 and type(attrs["f"]) is float
    assert (attrs["plain"], attrs["n"]) == ("x", 4)
    assert out[8] == "StepFailed"  # the exception class, by name
    assert _recorder.to_wire(out, 0)[schema.W_ERROR] == "StepFailed"
    builtin = loads(dumps((*record[:8], ValueError, None)))
    assert builtin[8] is ValueError
    assert out[:7] == record[:7]
    # The usual batch (plain values only) goes by marshal, and comes back equal.
    plain = ("batch", [(False, [(0, "train.forward", 7, None, (1, 1), 10, 20, {"mb": 1, "lr": 0.5, "ok": True},
                                 None, [("e", 15, None)])])], 3, {"buffer_full": 0})
    payload = dumps(plain)
    assert payload[:1] == FORMAT_MARSHAL and loads(payload) == plain


def test_worker_drains_sooner_only_when_records_would_fill_a_quarter_of_the_buffer_first() -> None:
    from otel_train.export.pacer import _MIN_WAIT_S, next_wait

    # 2 s interval, 65,536-record buffer: a quarter is 16,384 records.
    assert next_wait(2.0, 8_000, 2.0, 65_536) == 2.0  # 4,000/s fills a quarter in 4.1 s
    assert next_wait(2.0, 0, 2.0, 65_536) == 2.0  # nothing arrived
    assert next_wait(2.0, 32_768, 2.0, 65_536) == 1.0  # 16,384/s: a quarter in 1 s
    assert next_wait(2.0, 65_536, 0.5, 65_536) == 0.125
    assert next_wait(2.0, 10**9, 1.0, 65_536) == _MIN_WAIT_S  # a flood: never a busy loop
    assert next_wait(0.01, 32_768, 2.0, 65_536) == 0.01  # a shorter configured interval stands


def test_the_drain_pacer_counts_what_a_full_buffer_dropped_as_arrived() -> None:
    from otel_train.export.pacer import _FIRST_WAIT_S, _MIN_WAIT_S, DrainPacer
    from otel_train.record.clock import SystemClock
    from otel_train.record.recorder import Recorder

    recorder = Recorder(4_096, SystemClock())
    pacer = DrainPacer(2.0, recorder.cap, now=100.0, dropped=recorder.dropped)
    assert pacer.wait == _FIRST_WAIT_S  # a short first wait, to learn the rate

    # A burst of 10,000 records in the first 0.25 s: the buffer keeps 4,096, drops the rest.
    for i in range(10_000):
        recorder.append(("record", i))
    moved = len(recorder.drain(10**6))
    assert (moved, recorder.dropped) == (4_096, 5_904)
    # 10,000 records in 0.25 s fill a quarter of the buffer (1,024) in 25.6 ms; counted
    # from the 4,096 moved alone it would be 62.5 ms.
    assert pacer.drained(moved, recorder.dropped, now=100.25) == pytest.approx(0.0256)

    # Quiet again: 100 records over the next 2 s; the earlier drops are not counted again.
    for i in range(100):
        recorder.append(("record", i))
    assert pacer.drained(len(recorder.drain(10**6)), recorder.dropped, now=102.25) == 2.0
    # A flood never makes it a busy loop.
    assert pacer.drained(0, recorder.dropped + 10**9, now=102.26) == _MIN_WAIT_S


def test_a_drain_takes_what_the_buffer_held_when_it_began() -> None:
    from otel_train.export.worker import _SLICE, Worker
    from otel_train.record.clock import SystemClock
    from otel_train.record.recorder import Recorder

    recorder = Recorder(1 << 16, SystemClock())

    class SlowSink:
        """Each slice takes long enough for the training loop to record two more records."""

        def __init__(self) -> None:
            self.slices: list[int] = []

        def send(self, segments, offset, dropped) -> None:
            self.slices.append(sum(len(records) for _, records in segments))
            if len(self.slices) <= 4:  # (a drain that chased them would otherwise never end)
                recorder.append(("meanwhile", 1))
                recorder.append(("meanwhile", 2))

        def close(self, deadline: float) -> dict[str, int]:
            return {}

    for i in range(3 * _SLICE + 10):
        recorder.append(("record", i))
    sink = SlowSink()
    moved = Worker(recorder, sink, 1e9).drain()
    assert moved == 3 * _SLICE + 10 and sink.slices == [_SLICE, _SLICE, _SLICE, 10]
    assert len(recorder.buf) == 8  # what came meanwhile waits for the next drain


def test_thread_mode_makes_one_export_call_per_drain_not_per_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    import otel_train
    from otel_train import _runtime, semconv
    from otel_train.export import pipeline as _pipeline

    calls: list[int] = []

    class CountingDelivery:
        def add(self, payload: bytes, spans: int) -> None:
            calls.append(spans)

        def stats(self) -> dict[str, int]:
            return {"exported": sum(calls), "failed": 0, "overflow": 0, "queued": 0}

        def close(self, deadline: float) -> None:
            pass

    monkeypatch.setattr(_pipeline, "build_span_delivery", lambda dest, capacity: CountingDelivery())
    otel_train.init(run_id="one-call", export_mode="thread", metrics_exporter="none", flush_interval_ms=10**9)
    for n in range(100):  # 1,000 records: four slices of the worker's drain
        with otel_train.step(n):
            for _ in range(9):
                with otel_train.span(semconv.SPAN_FORWARD):
                    pass
    _runtime.state().worker.drain()
    assert calls == [999]  # the last step waits for its tags until the next one (or shutdown)
    otel_train.shutdown()
    assert calls == [999, 1]


def test_the_pipe_to_the_exporter_process_holds_a_whole_drain(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    fcntl = pytest.importorskip("fcntl")
    limit = Path("/proc/sys/fs/pipe-max-size")
    if not limit.exists() or int(limit.read_text()) < 1 << 20:
        pytest.skip("no Linux pipe resizing to 1 MiB here")
    import otel_train
    from otel_train import _runtime
    from otel_train.export.sinks import ProcessSink

    monkeypatch.chdir(tmp_path)
    otel_train.init(run_id="pipe", export_mode="process")
    sink = _runtime.state().worker.sink
    assert isinstance(sink, ProcessSink)
    assert fcntl.fcntl(sink.proc.stdin.fileno(), fcntl.F_GETPIPE_SZ) == 1 << 20  # 64 KiB by default
    otel_train.shutdown()


def _packing_recorder_with_a_step() -> Any:
    """A packing recorder holding one step: 9 regions (slots) and the step's record (a side object)."""
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import FakeClock

    if _recorder._hotpath is None:
        pytest.skip("packing needs the C hot path")
    recorder = _recorder.Recorder(1 << 12, FakeClock())
    recorder.packing = True
    _recorder.install(recorder)
    try:
        with _recorder.Step(0, None):
            for mb in range(9):
                with _recorder.Region("train.forward", mb=mb):
                    pass
    finally:
        _recorder.install(None)
    assert (recorder.pending(), len(recorder.buf)) == (10, 1)
    return recorder


class _RecordingSink:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.packed: list[tuple[Any, ...]] = []

    def send(self, segments, offset, dropped) -> None:
        self.sent.extend(r for _, records in segments for r in records)

    def send_packed(self, count, slots, side, wire, strings, offset, dropped) -> None:
        self.packed.append((count, slots, side, wire, list(strings)))

    def close(self, deadline: float) -> dict[str, int]:
        return {}


def test_a_packing_recorder_moves_its_records_to_the_sink_as_slots() -> None:
    from otel_train.export.worker import Worker
    from otel_train.record.recorder import unpack

    recorder = _packing_recorder_with_a_step()
    sink = _RecordingSink()
    worker = Worker(recorder, sink, 1e9)
    assert worker.packed and worker.drain() == 10
    assert sink.sent == [] and len(sink.packed) == 1
    count, slots, side, wire, strings = sink.packed[0]
    records = [r for _, rs in unpack(slots, side, wire, strings) for r in rs]
    assert count == 10 and wire is None and [r[7] for r in records[:9]] == [{"mb": mb} for mb in range(9)]
    assert records[9][0] == 1 and recorder.pending() == 0  # the step, last
    # A sink without `send_packed` gets records, unpacked in the process.
    class PlainSink:
        def __init__(self) -> None:
            self.sent: list[Any] = []

        def send(self, segments, offset, dropped) -> None:
            self.sent.extend(r for _, records in segments for r in records)

        def close(self, deadline: float) -> dict[str, int]:
            return {}

    plain = PlainSink()
    worker = Worker(_packing_recorder_with_a_step(), plain, 1e9)
    assert not worker.packed and worker.drain() == 10
    assert [r[7] for r in plain.sent[:9]] == [{"mb": mb} for mb in range(9)] and plain.sent[9][0] == 1


def test_with_a_device_timed_slots_still_move_packed_and_wait_only_behind_pending_events() -> None:
    """Device timing keeps the packed path: the regions before a side record whose events are
    pending go at once as slots; that record and everything after it wait for the next drain, and
    the resolver sees only the side records (never a region unpacked in the training process)."""
    from otel_train.export.worker import Worker
    from otel_train.record.recorder import unpack

    recorder = _packing_recorder_with_a_step()

    class Resolver:
        def __init__(self) -> None:
            self.pending = True  # the step's end event has not completed yet
            self.asked: list[Any] = []

        def idle(self) -> bool:
            return False  # a device is timed

        def ready(self, side: list[Any], held: int) -> int:
            self.asked.extend(side)
            return 0 if self.pending else len(side)

        def release(self, side: list[Any]) -> int:
            return len(side)

        def tidy(self) -> None:
            pass

    resolver, sink = Resolver(), _RecordingSink()
    worker = Worker(recorder, sink, 1e9, resolve=resolver)
    assert worker.drain() == 9  # the nine regions; the step waits
    assert [count for count, *_ in sink.packed] == [9] and sink.sent == []
    assert resolver.asked and all(r[0] == 1 for r in resolver.asked)  # the step's record alone (KIND_STEP)
    resolver.pending = False
    assert worker.drain() == 1
    assert [count for count, *_ in sink.packed] == [9, 1]
    records = [r for count, slots, side, wire, strings in sink.packed
               for _, run in unpack(slots, side, wire, strings) for r in run]
    assert [r[7] for r in records[:9]] == [{"mb": mb} for mb in range(9)] and records[9][0] == 1


def test_the_exporter_process_gets_slots_and_a_thread_exporter_records(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import otel_train
    from otel_train import _runtime
    from otel_train.record import recorder as _recorder

    if _recorder._hotpath is None:
        pytest.skip("packing needs the C hot path")
    monkeypatch.chdir(tmp_path)
    for mode, packs in (("process", True), ("thread", False)):
        otel_train.init(run_id=f"packs-{mode}", export_mode=mode, metrics_exporter="none")
        worker = _runtime.state().worker
        assert (worker.packed, worker.recorder.packing) == (packs, packs), mode
        otel_train.shutdown()


def test_with_a_device_timed_the_worker_paces_itself_by_the_event_pool() -> None:
    """A drain gives the resolved events back to the pool: the pacer drains before a quarter of
    the pool can be out (4,096 events: 2,048 records), not a quarter of the buffer."""
    from otel_train.export.worker import Worker
    from otel_train.record import device
    from otel_train.record.clock import FakeClock
    from otel_train.record.device_resolver import DeviceResolver
    from otel_train.record.recorder import Recorder

    timing = device.DeviceTiming()
    resolver = DeviceResolver(timing, FakeClock())
    worker = Worker(Recorder(1 << 16, FakeClock()), _RecordingSink(), 2.0, resolve=resolver)
    assert worker.capacity() == 1 << 16  # no device chosen yet
    timing.pool = device.EventPool(lambda: None, 4096)
    assert worker.capacity() == 2048
