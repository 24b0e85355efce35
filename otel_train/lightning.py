"""Lightning integration: `OtelCallback`, a `lightning.pytorch.Callback`.

    from otel_train.lightning import OtelCallback
    trainer = Trainer(callbacks=[OtelCallback()])     # or just `import otel_train.auto` first:
                                                      # every Trainer then gets one by itself

What it records: `otel_train.detect.integrations.lightning`.
"""

from otel_train.detect.integrations.lightning import OtelCallback

__all__ = ["OtelCallback"]
