"""Framework integrations (Lightning, Hugging Face) and the one surface they use.

A framework callback cannot tell forward from backward, so phases and step boundaries come from
automatic detection underneath; what the framework adds goes through these few calls:

    claimed = claim()              # detection runs from here (None: disabled, do nothing more)
    set_epoch(n)                   # the framework's epoch wins over the one counted from loaders
    eval_begin() / eval_end()      # its validation loop is one exact `train.eval` pass
    patch(Trainer, "save_checkpoint", checkpoint_wrapper)   # until detection is uninstalled
    with outside_training():       # work between two steps (a benchmark): in no step, unseen
    finish()                       # training is over: the last step ends at its real end
    release(claimed)               # finish, and uninstall detection if `claim()` installed it
"""

from __future__ import annotations

from otel_train.detect import native

if native.MISSING is None:
    from otel_train.detect.aside import outside_training
    from otel_train.detect.checkpoint import checkpoint_wrapper
    from otel_train.detect.eval import eval_begin, eval_end, eval_wrapper
    from otel_train.detect.install import claim, uninstall
    from otel_train.detect.install import patch_once as patch
    from otel_train.detect.machine import finish, set_epoch
else:
    # Detection's C extensions cannot be imported: a user's callback must not stop their
    # training, so the surface is detection switched off (as `claim()` is under
    # OTEL_SDK_DISABLED): `claim()` says so once and answers None, the rest do nothing.
    from contextlib import nullcontext as outside_training
    from typing import Any

    def claim() -> bool | None:
        native.say_off()
        return None

    def _off(*args: Any, **kwargs: Any) -> None:
        return None

    set_epoch = eval_begin = eval_end = finish = uninstall = patch = _off
    checkpoint_wrapper = eval_wrapper = _off

__all__ = ["claim", "release", "set_epoch", "eval_begin", "eval_end", "finish", "patch", "checkpoint_wrapper",
           "eval_wrapper", "outside_training"]


def release(claimed: bool) -> None:
    """Training is over: close the last step, and uninstall detection if `claim()` installed it."""
    finish()
    if claimed:
        uninstall()
