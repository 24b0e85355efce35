"""Model FLOPs utilisation: the FLOPs a step did over what the device could have done meanwhile.

    MFU = FLOPs of the step / its step time (`train.step.time_s`) / the device's peak FLOP/s

FLOPs of a step, the first one known of:

1. the step's `train.flops` attribute (`with otel_train.step(**{"train.flops": f}):`), for a
   step whose work varies;
2. `OTEL_TRAIN_FLOPS_PER_STEP` / `init(flops_per_step=...)`: the same every step;
3. 6·N·tokens, the usual estimate for a transformer (forward 2·N, backward 4·N a token), with
   N the trainable parameters of the model automatic detection found (`samples`) and tokens
   the step's `train.tokens` (counted from the batches' shape: `detect.batch_size`).

FLOPs are one rank's, and the peak one device's: `OTEL_TRAIN_PEAK_FLOPS`, else the table
(`peak_flops`, bf16 dense) by the device's name. On the CPU there is no MFU unless
`OTEL_TRAIN_PEAK_FLOPS` is set. Pure arithmetic: the exporter process runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_train import semconv
from otel_train.export.peak_flops import peak_flops


class Mfu:
    """The inputs MFU needs as they become known, and the arithmetic."""

    def __init__(self, flops_per_step: float | None = None, peak: float | None = None) -> None:
        self.flops_per_step = flops_per_step
        self.peak_override = peak
        self.peak = peak
        self.parameters: int | None = None
        self.device_name: str | None = None

    def device(self, name: str) -> None:
        """The device's name (from the worker's reading): its peak, unless overridden."""
        self.device_name = name
        if self.peak_override is None:
            self.peak = peak_flops(name)

    def flops(self, attrs: Mapping[str, Any] | None) -> float | None:
        """FLOPs of a step with these attributes (module docstring), or None."""
        if attrs:
            given = attrs.get(semconv.TRAIN_FLOPS)
            if _number(given):
                return float(given)
        if self.flops_per_step is not None:
            return self.flops_per_step
        tokens = attrs.get(semconv.TRAIN_TOKENS) if attrs else None
        if self.parameters and _number(tokens):
            return 6.0 * self.parameters * float(tokens)
        return None

    def of(self, flops: float | None, seconds: float) -> float | None:
        """MFU of `flops` done in `seconds`, or None (no FLOPs, no peak, no time)."""
        if flops is None or self.peak is None or seconds <= 0:
            return None
        return flops / seconds / self.peak


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
