"""`otel_train.detect.batch_size`: a step's `train.samples` / `train.tokens` from its batches' shape."""

from __future__ import annotations

from collections import UserDict, UserList, namedtuple
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import otel_train  # noqa: E402
from otel_train import detect, semconv  # noqa: E402
from otel_train.detect.batch_size import size_of  # noqa: E402
from otel_train.record.clock import FakeClock  # noqa: E402


Pair = namedtuple("Pair", "inputs targets")


@pytest.mark.parametrize(("batch", "size"), [
    (torch.zeros(4, 16, dtype=torch.long), (4, 64)),  # token ids
    ((torch.zeros(4, 16, dtype=torch.int32), torch.zeros(4)), (4, 64)),  # (inputs, targets)
    ({"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8)}, (2, 16)),  # HF
    ({"pixels": torch.zeros(3, 3, 8, 8)}, (3, 0)),  # a dict without ids: its first value
    ([torch.randn(5, 3)], (5, 0)),  # floats: samples, no tokens
    (torch.zeros(4, 2, 8, dtype=torch.long), (4, 0)),  # 3-D ids: not (batch, sequence)
    (torch.tensor(3), None), ("text", None), ((), None), ({}, None),
    (Pair(torch.zeros(6, 4, dtype=torch.int64), None), (6, 24)),  # a namedtuple
    (UserDict({"input_ids": torch.zeros(2, 3, dtype=torch.int32)}), (2, 6)),  # a Mapping (a BatchEncoding)
    (UserDict({"x": 1}), None), (UserList([torch.zeros(7)]), None), ([], None), (object(), None),
])
def test_size_of_reads_only_the_shape(batch: object, size: tuple[int, int] | None) -> None:
    assert size_of(batch) == size


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    otel_train.init(span_processors=[SimpleSpanProcessor(exporter)], export_mode="thread", clock=FakeClock(),
                    traces_exporter="none", metrics_exporter="none", flush_interval_ms=10)
    detect.install()
    try:
        yield exporter
    finally:
        detect.uninstall()
        otel_train.shutdown()


def test_a_steps_micro_batches_add_up_and_evaluation_batches_do_not(spans: InMemorySpanExporter) -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(4 * 6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = DataLoader(TensorDataset(torch.randint(0, 10, (16, 6)), torch.randn(16, 1)), batch_size=4)
    val = DataLoader(TensorDataset(torch.randint(0, 10, (8, 6))), batch_size=8)
    for i, (x, y) in enumerate(train):
        nn.functional.mse_loss(model(x), y).backward()
        if i % 2:  # two micro-batches a step
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                for (v,) in val:  # an evaluation pass between steps
                    model(v)
    detect.uninstall()
    otel_train.shutdown()
    steps = sorted((s for s in spans.get_finished_spans() if s.name == semconv.SPAN_STEP),
                   key=lambda s: s.attributes[semconv.TRAIN_STEP])
    assert [(s.attributes[semconv.TRAIN_MICRO_BATCHES], s.attributes[semconv.TRAIN_SAMPLES],
             s.attributes[semconv.TRAIN_TOKENS]) for s in steps] == [(2, 8, 48), (2, 8, 48)]
