"""Automatic instrumentation of PyTorch training: every step, with its phases, without editing the loop.

Four ways in, all the same underneath:

    import otel_train.auto                      # first line of the training script

    otel-train run train.py --lr 3e-4           # the script unmodified
    python -m otel_train.run train.py --lr 3e-4
    torchrun --nproc-per-node 4 -m otel_train.run train.py

    opentelemetry-instrument python train.py    # this instrumentor is registered under the
                                                # `opentelemetry_instrumentor` entry point group

or by hand:

    from otel_train.instrumentation import TorchTrainingInstrumentor
    TorchTrainingInstrumentor().instrument()    # configure from OTEL_* variables, hook torch
    ...
    TorchTrainingInstrumentor().uninstrument()  # every hook removed, every patch restored

What it records (span names: docs/trace-shape.md): one `train.step` per optimizer update, holding the batch
fetches (`train.data`), the outermost module's forward per micro-batch (`train.forward`),
backward (`train.backward`) and the update (`train.optimizer`, with zero_grad and gradient
clipping); as siblings tagging the step they follow: evaluation passes (`train.eval`),
checkpoints (`train.checkpoint`) and garbage-collection pauses (`train.gc`); and
`torch.distributed` collectives (`train.collective`). How steps are found in a plain loop
(gradient accumulation, several optimizers, no optimizer at all, evaluation forwards) is told
in `otel_train/detect/` (its package docstring maps each source to its module).

Frameworks: when Lightning (`lightning.pytorch`) or Hugging Face `transformers` is imported,
every `Trainer` created afterwards gets `otel_train.lightning.OtelCallback` /
`otel_train.hf.OtelTrainerCallback`, which add the epoch, exact evaluation passes and the
framework's own checkpointing to what the torch hooks see. Pass `attach_callbacks=False` to
`instrument()` to attach them yourself.

`instrument()` does nothing (installs no hook at all) when `OTEL_SDK_DISABLED=true`, and
installs no hook where detection's C extensions cannot be imported (`otel_train.detect.native`:
it says so in one line; explicit spans still work). Torch is
never imported by the instrumentor: if the program has not imported it yet, the hooks go in
the moment it does. In a `multiprocessing` child (a spawned DataLoader worker re-importing the
script) the runtime starts only at the first training activity, and never in a DataLoader
worker, so workers are not reported as trainers.

`tracer_provider=` and `meter_provider=` (which contrib instrumentors take) are not used, and
`instrument()` says so once: otel_train does not make spans through a tracer on the training
thread (that is the cost it exists to avoid); it records regions into its own buffer and builds
the spans later, in its exporter process, with its own clocks and ids. To receive them in this
process, call `otel_train.init(span_processors=[...], metric_readers=[...])` before
`instrument()`: your processors and readers get every span and metric.

Limits: forward spans need a `torch.nn.Module` call (a model compiled with `module.compile()`
runs its hooks inside the compiled code, so only `torch.compile(module)` shows `train.forward`);
batches are seen when they come from a `torch.utils.data.DataLoader`; DDP's gradient
all-reduce runs inside backward in C++ and is part of `train.backward`; one training thread
per process.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection
from types import ModuleType
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from otel_train import _children, _compat, _imports, _runtime

_log = logging.getLogger("otel_train")

#: The instrumented library (an extra of this package, never a hard dependency).
_instruments = ("torch >= 2.11",)  # the oldest tested (docs/compatibility.md); pyproject's extra

_LIGHTNING = "lightning.pytorch"
_TRANSFORMERS = "transformers.trainer"


class TorchTrainingInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """An OpenTelemetry instrumentor for PyTorch training loops (see the module docstring)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        given = [name for name in ("tracer_provider", "meter_provider") if kwargs.get(name) is not None]
        if given:
            _log.warning("otel_train: TorchTrainingInstrumentor does not use %s: its spans are built in its "
                         "exporter process, not by a tracer on the training thread. To receive them in this "
                         "process, call otel_train.init(span_processors=[...], metric_readers=[...]) before "
                         "instrument().", " or ".join(given))
        if _runtime.sdk_disabled():
            _log.debug("otel_train: OTEL_SDK_DISABLED is set; nothing is instrumented")
            return
        lazy = _in_multiprocessing_child()
        if not lazy and _runtime.init() is None:
            return
        self._lazy = lazy
        _children.install()  # follow the training into the processes the script starts
        _imports.when_imported("torch", self._install_torch)
        if kwargs.get("attach_callbacks", True):
            _imports.when_imported(_LIGHTNING, _attach_lightning)
            _imports.when_imported(_TRANSFORMERS, _attach_transformers)

    def _uninstrument(self, **kwargs: Any) -> None:
        _children.uninstall()
        _imports.cancel(self._install_torch)
        _imports.cancel(_attach_lightning)
        _imports.cancel(_attach_transformers)
        _imports.cancel(_attach_now)
        install = sys.modules.get("otel_train.detect.install")  # imported only once torch was
        if install is not None:
            install.uninstall()

    def _install_torch(self, module: ModuleType) -> None:
        if _imports.initializing(_DETECT):
            # torch was imported by detection's own import (`import otel_train.lightning` first):
            # install once that import is done.
            _imports.when_imported(_DETECT, self._install_torch)
            return
        from otel_train import detect  # it imports torch: only once the program has
        lazy = getattr(self, "_lazy", False)
        if detect.native.MISSING is not None:
            if not lazy:  # a multiprocessing child's parent said it
                detect.native.say_off()
            return
        detect.install(lazy=lazy)


def _in_multiprocessing_child() -> bool:
    import multiprocessing
    # While a spawned child re-imports the main script, `parent_process()` is not set yet:
    # the process is still `_inheriting` its preparation data (and already has its own name).
    current = multiprocessing.current_process()
    return (multiprocessing.parent_process() is not None or _compat.multiprocessing_inheriting(current)
            or current.name != "MainProcess")


_DETECT = "otel_train.detect"
_LIGHTNING_INTEGRATION = "otel_train.detect.integrations.lightning"
_HF_INTEGRATION = "otel_train.detect.integrations.hf"


def _attach_lightning(module: ModuleType) -> None:
    _attach(_LIGHTNING_INTEGRATION)


def _attach_transformers(module: ModuleType) -> None:
    _attach(_HF_INTEGRATION)


def _attach(integration: str) -> None:
    """Every Trainer gets the integration's callback. When the library was imported by the
    integration module itself (`import otel_train.lightning` before `lightning.pytorch`), that
    module is only half run here: it attaches once it is done (`_imports.done`)."""
    from otel_train.detect import native  # the library imported torch: so has detection (`_install_torch`)
    if native.MISSING is not None:
        return  # no detection to attach to: `_install_torch` said so
    if _imports.initializing(integration):
        _imports.when_imported(integration, _attach_now)
        return
    import importlib
    _attach_now(importlib.import_module(integration))  # its patches are detection's: uninstall undoes them


def _attach_now(integration: ModuleType) -> None:
    integration.attach()
