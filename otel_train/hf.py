"""Hugging Face integration: `OtelTrainerCallback`, a `transformers.TrainerCallback`.

    from otel_train.hf import OtelTrainerCallback
    trainer = Trainer(..., callbacks=[OtelTrainerCallback()])   # or `import otel_train.auto`
                                                                # first: every Trainer gets one

What it records: `otel_train.detect.integrations.hf`.
"""

from otel_train.detect.integrations.hf import OtelTrainerCallback

__all__ = ["OtelTrainerCallback"]
