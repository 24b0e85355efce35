"""`otel_train.detect.aside.outside_training`: work between two steps lands in no step, unseen.

A real torch loop under automatic detection, on a FakeClock that the loop moves by hand.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import otel_train  # noqa: E402
from otel_train import detect, semconv  # noqa: E402
from otel_train.detect import state  # noqa: E402
from otel_train.detect.integrations import outside_training  # noqa: E402
from otel_train.record.clock import FakeClock  # noqa: E402

MS = 1_000_000


@pytest.fixture
def spans() -> Iterator[tuple[InMemorySpanExporter, FakeClock]]:
    exporter, clock = InMemorySpanExporter(), FakeClock()
    otel_train.init(span_processors=[SimpleSpanProcessor(exporter)], export_mode="thread", clock=clock,
                    traces_exporter="none", metrics_exporter="none", flush_interval_ms=10)
    detect.install()
    try:
        yield exporter, clock
    finally:
        detect.uninstall()
        otel_train.shutdown()


class Ticking(nn.Module):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock, self.body = clock, nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(MS)
        return self.body(x)


def test_the_block_is_in_no_step_and_the_next_step_starts_after_it(spans: tuple[InMemorySpanExporter,
                                                                                FakeClock]) -> None:
    exporter, clock = spans
    model = Ticking(clock)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.randn(16, 4), batch_size=4)
    block = None
    for i, x in enumerate(loader):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        if i == 1:
            with outside_training():
                assert not model._forward_pre_hooks and state.s.step is None  # closed, paused
                t0 = clock.now_ns
                with otel_train.span("aside.work"):
                    with outside_training():  # nested: one block
                        clock.advance(50 * MS)
                        model(torch.randn(2, 4)).sum().backward()  # unseen by detection
                block = (t0, clock.now_ns)
                model.zero_grad()
    detect.uninstall()
    otel_train.shutdown()
    done = exporter.get_finished_spans()
    steps = sorted((s for s in done if s.name == semconv.SPAN_STEP), key=lambda s: s.start_time)
    forwards = [s for s in done if s.name == semconv.SPAN_FORWARD]
    assert [s.attributes[semconv.TRAIN_STEP] for s in steps] == [0, 1, 2, 3] and len(forwards) == 4
    assert block is not None
    aside = next(s for s in done if s.name == "aside.work")
    # Step 1 ended before the block, step 2 began after it: 50 ms of it is in neither.
    assert steps[1].end_time <= aside.start_time and steps[2].start_time >= aside.end_time
    assert aside.end_time - aside.start_time == block[1] - block[0] == 51 * MS  # the sleep and one forward
    assert all(s.end_time - s.start_time < 5 * MS for s in steps)
