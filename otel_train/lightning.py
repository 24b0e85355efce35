"""Lightning integration: `OtelCallback` and `TrainingLatencyCallback`, `lightning.pytorch.Callback`s.

    from otel_train.lightning import OtelCallback
    trainer = Trainer(callbacks=[OtelCallback()])     # or just `import otel_train.auto` first:
                                                      # every Trainer then gets one by itself

    trainer = Trainer(callbacks=[TrainingLatencyCallback(start_step=500)])   # forward and
                                                      # forward+backward latency, once, between steps

What `OtelCallback` records: `otel_train.detect.integrations.lightning`. What
`TrainingLatencyCallback` measures: `otel_train.bench.latency_lightning` (docs/bench-latency.md).
"""

from otel_train.bench.latency_lightning import TrainingLatencyCallback
from otel_train.detect.integrations.lightning import OtelCallback

__all__ = ["OtelCallback", "TrainingLatencyCallback"]
