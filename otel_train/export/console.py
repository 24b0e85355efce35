"""The console summary: one line every N steps, on rank 0, off by default.

    OTEL_TRAIN_CONSOLE_EVERY=100 torchrun ... train.py
    otel_train: step 1199 | step 182 ms | data 3.1% | device 94.0% | tokens/s 45,120 | MFU 41.3% | dropped 0

Each line covers the N steps it closes: mean step time (`train.step.time_s`), data wait and
device busy time as shares of their step time, tokens per second, MFU (`mfu`), and the records
dropped so far in the whole run (`otel_train.spans.dropped`). A value nothing tells is `-`
(device time on the CPU, tokens without token batches, MFU without FLOPs or a peak). Device busy
is the device time of the forward, backward and optimizer spans, so it needs device timing.

It runs where the metrics do, in the exporter process (or the worker thread with
`OTEL_TRAIN_EXPORT_MODE=thread`), never on the training thread, and prints on stderr (the
exporter process's stdout is its progress pipe to the trainer). It may lag a step and a drain
(up to `OTEL_TRAIN_FLUSH_INTERVAL_MS`) behind training. Other ranks print nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from otel_train import _stderr


class ConsoleSummary:
    """Counts steps; every `every`-th prints the line for the window it closes."""

    def __init__(self, every: int, totals: Callable[[], tuple[float, float, int]],
                 write: Callable[[str], None] = _stderr.line) -> None:
        """`totals()` gives the run's cumulative (data wait s, device busy s, records dropped)."""
        self.every = every
        self.totals = totals
        self.write = write
        self.base_data = self.base_device = 0.0
        self._window()

    def _window(self) -> None:
        self.steps = 0
        self.seconds = 0.0
        self.tokens: float | None = 0.0  # None once a step of the window had none
        self.flops = 0.0
        self.flops_seconds = 0.0  # the time of the steps whose FLOPs were known

    def step(self, n: int | None, seconds: float, tokens: float | None, flops: float | None,
             peak: float | None) -> str | None:
        """One step's own time, tokens and FLOPs (None: unknown); the line when one is due."""
        self.steps += 1
        self.seconds += seconds
        self.tokens = None if tokens is None or self.tokens is None else self.tokens + tokens
        if flops is not None:
            self.flops += flops
            self.flops_seconds += seconds
        if self.steps < self.every:
            return None
        data, device, dropped = self.totals()
        span = self.seconds
        cells = [f"step {n if n is not None else '-'}",
                 f"step {_ms(span / self.steps)}",
                 f"data {_share(data - self.base_data, span)}",
                 f"device {_share(device - self.base_device, span) if device > self.base_device else '-'}",
                 f"tokens/s {f'{self.tokens / span:,.0f}' if self.tokens and span > 0 else '-'}",
                 f"MFU {f'{self.flops / self.flops_seconds / peak:.1%}' if self.flops and peak else '-'}",
                 f"dropped {dropped}"]
        line = "otel_train: " + " | ".join(cells)
        self.base_data, self.base_device = data, device
        self._window()
        self.write(line)
        return line


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3g} ms" if ms < 1000 else f"{seconds:.3g} s"


def _share(part: float, whole: float) -> str:
    return f"{min(max(part / whole, 0.0), 1.0):.1%}" if whole > 0 else "-"
