"""Lightning integration: `OtelCallback`, a `lightning.pytorch.Callback` (`otel_train.lightning`).

    from otel_train.lightning import OtelCallback
    trainer = Trainer(callbacks=[OtelCallback()])     # or just `import otel_train.auto` first:
                                                      # every Trainer then gets one by itself

Phases (data, forward, backward, optimizer) and step boundaries come from the torch-level
detection underneath (`otel_train.detect`), which the callback installs for the duration of
`fit` if nothing else did. The callback adds what only Lightning knows: the epoch, validation
and test loops as exact `train.eval` passes, the end of training (so the last step ends at its
real end), and `Trainer.save_checkpoint` as one `train.checkpoint` span.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from otel_train import _imports
from otel_train.detect import integrations as detection

__all__ = ["OtelCallback"]


class OtelCallback(pl.Callback):
    """Traces a Lightning fit: steps, phases, epochs, validation and checkpoints."""

    def __init__(self) -> None:
        super().__init__()
        self._installed_here = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        claimed = detection.claim()
        if claimed is None:
            return
        self._installed_here = self._installed_here or claimed
        _patch_trainer()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        detection.release(self._installed_here)
        self._installed_here = False

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        detection.set_epoch(trainer.current_epoch)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        detection.eval_begin()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        detection.eval_end()

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        detection.eval_begin()

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        detection.eval_end()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        detection.finish()


def _patch_trainer() -> None:
    detection.patch(pl.Trainer, "save_checkpoint", detection.checkpoint_wrapper)


def _add_callback(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    callbacks = kwargs.get("callbacks")
    if callbacks is None:
        callbacks = []
    elif not isinstance(callbacks, list):
        callbacks = list(callbacks) if isinstance(callbacks, tuple) else [callbacks]
    if not any(isinstance(cb, OtelCallback) for cb in callbacks):
        # Passed in, not appended after: Lightning then orders checkpoint callbacks after ours.
        kwargs["callbacks"] = [*callbacks, OtelCallback()]
    return wrapped(*args, **kwargs)


def attach() -> None:
    """Every Trainer created from now on gets an OtelCallback (until `uninstrument()`)."""
    detection.patch(pl.Trainer, "__init__", _add_callback)
    _patch_trainer()


_imports.done(__name__)  # a hook may wait for this module to finish (`otel_train.instrumentation`)
