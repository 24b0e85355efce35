"""The benchmark's training steps: a ~20 ms and a ~2.5 ms step, plain, instrumented or with SDK spans."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from otel_train import semconv
from otel_train.bench.harness import as_script

PHASE_ATTR = semconv.TRAIN_MICRO_BATCH
CLIP_SPAN = "bench.clip_grad_norm"  # a user span: the ninth region of the small step


class Workload:
    """A model, optimizer and cycling batches; `plain()` / `instrumented()` run one step."""

    def __init__(self, size: str, seed: int = 0) -> None:
        import torch
        from torch import nn

        torch.manual_seed(seed)
        if size == "large":  # ~20 ms per step here
            vocab, d, layers, batch, seq, self.accum = 512, 128, 2, 8, 64, 1
        else:  # ~2.5 ms per step with accumulation 2
            vocab, d, layers, batch, seq, self.accum = 64, 32, 1, 4, 8, 2
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.model = nn.Sequential(nn.Embedding(vocab, d), nn.TransformerEncoder(layer, layers,
                                                                                 enable_nested_tensor=False),
                                   nn.Linear(d, vocab))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.loss = nn.CrossEntropyLoss()
        self.vocab = vocab
        batches = [(torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq)))
                   for _ in range(8)]
        self._batches = batches
        self.data = self._cycle()

    def _cycle(self) -> Iterator[Any]:
        while True:
            yield from self._batches

    plain: Callable[[Workload], None]  # `_PLAIN`, compiled as a script's code (below)

    def instrumented(self, span: Callable[..., Any] | None = None) -> None:
        import otel_train
        self._spanned(span or otel_train.span, otel_train.step)

    def sdk(self, tracer: Any) -> None:
        def span(name: str, **attrs: Any) -> Any:
            return tracer.start_as_current_span(name, attributes=attrs or None)
        self._spanned(span, lambda: span(semconv.SPAN_STEP))

    def _spanned(self, span: Callable[..., Any], step: Callable[[], Any]) -> None:
        """The plain step with 5 regions (accumulation 1) or 9 (accumulation 2) around its phases."""
        import torch
        with step():
            for mb in range(self.accum):
                with span(semconv.SPAN_DATA, **{PHASE_ATTR: mb}):
                    x, y = next(self.data)
                with span(semconv.SPAN_FORWARD, **{PHASE_ATTR: mb}):
                    out = self.model(x)
                    loss = self.loss(out.reshape(-1, self.vocab), y.reshape(-1)) / self.accum
                with span(semconv.SPAN_BACKWARD, **{PHASE_ATTR: mb}):
                    loss.backward()
            with span(semconv.SPAN_OPTIMIZER):
                with span(CLIP_SPAN):
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)


#: The plain step, which automatic mode also runs: compiled as a user's script (`as_script`), as
#: a user's loop is. Until 2026-11-27 it was a method of this module, so detection
#: placed its `zero_grad()` by the benchmark's frames, not the step's: at the top of the next
#: step, through the Python path no user's loop takes.
_PLAIN = """
def plain(self):
    for _ in range(self.accum):
        x, y = next(self.data)
        out = self.model(x)
        loss = self.loss(out.reshape(-1, self.vocab), y.reshape(-1)) / self.accum
        loss.backward()
    import torch
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
"""

Workload.plain = as_script(_PLAIN, "bench_workload_step")["plain"]  # type: ignore[method-assign]
