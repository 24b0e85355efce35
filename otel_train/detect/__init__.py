"""Automatic step and phase detection for unmodified PyTorch training loops (internal; imports torch).

`install()` puts in every hook family and `uninstall()` takes every one out; the instrumentor
(`otel_train.instrumentation`) calls them, and framework integrations (`integrations/`) refine
what they see. What each source becomes (span names: docs/trace-shape.md):

| source                                                        | span                              | module        |
|---------------------------------------------------------------|-----------------------------------|---------------|
| global module forward pre/post hooks, outermost module only   | `train.forward`, or `train.eval`  | `forward`     |
| `torch.autograd.backward` (patched; `Tensor.backward` calls it) | `train.backward`                | `backward`    |
| global optimizer step pre/post hooks                          | `train.optimizer`, step boundary  | `optimizer`   |
| `GradScaler.step` (also when it skips the optimizer's step)   | `train.optimizer`, step boundary  | `optimizer`   |
| `Optimizer.zero_grad`, `Module.zero_grad`, `clip_grad_norm_`  | `train.optimizer` inside a step   | `optimizer`   |
| `_BaseDataLoaderIter.__next__`, then its `Tensor.to` copies (with an accelerator) | `train.data`    | `data`        |
| forwards without gradients or in eval mode, framework loops   | `train.eval`                      | `eval`        |
| `torch.save`, `torch.distributed.checkpoint.save/load`        | `train.checkpoint`                | `checkpoint`  |
| `gc.callbacks` (full collections, or any pause >= 1 ms)       | `train.gc`                        | `gc_pauses`   |
| `torch.distributed` collectives                               | `train.collective`                | `collectives` |

How these become steps (boundaries, micro-batches, epochs, siblings): `machine`. The state
they share: `state`. Which modules carry the forward hooks: `roots`. What is patched, and its
undoing: `patches`; the patched functions that call the user's code as C objects (no frame
of ours in a traceback): `entry`. torch.compile: `compile`. The hooks' common calls noted and
run a few steps at a time, not each at its call: `batch`.

Detection runs on its C extensions (`native`): where one cannot be imported, only `native` is
imported here, and the instrumentor says once that automatic detection is off.

Everything on the hot path returns at once when the recorder is off (`recorder._rec is None`)
or while torch.compile traces. It only creates, enters and leaves regions and opens and closes
steps.
"""

from otel_train import _imports
from otel_train.detect import native

if native.MISSING is None:  # else nothing else of detection can be imported (`native`)
    from otel_train.detect.install import claim, install, installed, uninstall

__all__ = ["claim", "install", "installed", "uninstall"]

_imports.done(__name__)  # torch's hook may wait for this package to finish (`otel_train.instrumentation`)
