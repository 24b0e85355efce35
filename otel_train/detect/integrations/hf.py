"""Hugging Face integration: `OtelTrainerCallback`, a `transformers.TrainerCallback`.

    from otel_train.hf import OtelTrainerCallback
    trainer = Trainer(..., callbacks=[OtelTrainerCallback()])   # or `import otel_train.auto`
                                                                # first: every Trainer gets one

A TrainerCallback cannot tell forward from backward, so phases (data, forward, backward,
optimizer) and step boundaries come from the torch-level detection underneath
(`otel_train.detect.hooks`), which the callback installs for the duration of training if nothing
else did. The callback adds the epoch and the end of training, and makes `Trainer.evaluate`
one exact `train.eval` pass and `Trainer._save_checkpoint` / `save_model` one
`train.checkpoint` span each.
"""

from __future__ import annotations

from typing import Any

import transformers
import transformers.trainer as hf_trainer

from otel_train.detect import hooks as _detect

__all__ = ["OtelTrainerCallback"]


class OtelTrainerCallback(transformers.TrainerCallback):  # type: ignore[misc]
    """Traces a transformers Trainer run: steps, phases, epochs, evaluation and checkpoints."""

    def __init__(self) -> None:
        self._installed_here = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        claimed = _detect.claim()
        if claimed is None:
            return
        self._installed_here = self._installed_here or claimed
        _patch_trainer()
        _detect.set_epoch(int(state.epoch or 0))

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _detect.set_epoch(int(state.epoch or 0))

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _detect.eval_end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _detect.finish()
        if self._installed_here:
            _detect.uninstall()
            self._installed_here = False


def _patch_trainer() -> None:
    trainer = hf_trainer.Trainer
    _detect.patch_once(trainer, "evaluate", _detect.eval_wrapper)
    _detect.patch_once(trainer, "_save_checkpoint", _detect.checkpoint_wrapper)
    _detect.patch_once(trainer, "save_model", _detect.checkpoint_wrapper)


def _add_callback(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    out = wrapped(*args, **kwargs)
    handler = getattr(instance, "callback_handler", None)
    if handler is not None and not any(isinstance(cb, OtelTrainerCallback) for cb in handler.callbacks):
        instance.add_callback(OtelTrainerCallback())
    return out


def _attach() -> None:
    """Every Trainer created from now on gets an OtelTrainerCallback (until `uninstrument()`)."""
    _detect.patch_once(hf_trainer.Trainer, "__init__", _add_callback)
    _patch_trainer()
