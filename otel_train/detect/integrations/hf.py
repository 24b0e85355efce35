"""Hugging Face integration: `OtelTrainerCallback`, a `transformers.TrainerCallback` (`otel_train.hf`).

    from otel_train.hf import OtelTrainerCallback
    trainer = Trainer(..., callbacks=[OtelTrainerCallback()])   # or `import otel_train.auto`
                                                                # first: every Trainer gets one

A TrainerCallback cannot tell forward from backward, so phases (data, forward, backward,
optimizer) and step boundaries come from the torch-level detection underneath
(`otel_train.detect`), which the callback installs for the duration of training if nothing
else did. The callback adds the epoch and the end of training, and makes `Trainer.evaluate`
one exact `train.eval` pass and `Trainer._save_checkpoint` / `save_model` one
`train.checkpoint` span each.
"""

from __future__ import annotations

from typing import Any

import transformers
import transformers.trainer as hf_trainer

from otel_train import _imports
from otel_train.detect import integrations as detection

__all__ = ["OtelTrainerCallback"]


class OtelTrainerCallback(transformers.TrainerCallback):  # type: ignore[misc]
    """Traces a transformers Trainer run: steps, phases, epochs, evaluation and checkpoints."""

    def __init__(self) -> None:
        self._installed_here = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        claimed = detection.claim()
        if claimed is None:
            return
        self._installed_here = self._installed_here or claimed
        _patch_trainer()
        detection.set_epoch(int(state.epoch or 0))

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        detection.set_epoch(int(state.epoch or 0))

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        detection.eval_end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        detection.release(self._installed_here)
        self._installed_here = False


def _patch_trainer() -> None:
    trainer = hf_trainer.Trainer
    detection.patch(trainer, "evaluate", detection.eval_wrapper)
    detection.patch(trainer, "_save_checkpoint", detection.checkpoint_wrapper)
    detection.patch(trainer, "save_model", detection.checkpoint_wrapper)


def _add_callback(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    out = wrapped(*args, **kwargs)
    handler = getattr(instance, "callback_handler", None)
    if handler is not None and not any(isinstance(cb, OtelTrainerCallback) for cb in handler.callbacks):
        instance.add_callback(OtelTrainerCallback())
    return out


def attach() -> None:
    """Every Trainer created from now on gets an OtelTrainerCallback (until `uninstrument()`)."""
    detection.patch(hf_trainer.Trainer, "__init__", _add_callback)
    _patch_trainer()


_imports.done(__name__)  # a hook may wait for this module to finish (`otel_train.instrumentation`)
