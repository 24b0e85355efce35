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

native.require()  # the callbacks need automatic detection: a clear ImportError without its C extensions

from otel_train.detect.aside import outside_training  # noqa: E402
from otel_train.detect.checkpoint import checkpoint_wrapper  # noqa: E402
from otel_train.detect.eval import eval_begin, eval_end, eval_wrapper  # noqa: E402
from otel_train.detect.install import claim, uninstall  # noqa: E402
from otel_train.detect.install import patch_once as patch  # noqa: E402
from otel_train.detect.machine import finish, set_epoch  # noqa: E402

__all__ = ["claim", "release", "set_epoch", "eval_begin", "eval_end", "finish", "patch", "checkpoint_wrapper",
           "eval_wrapper", "outside_training"]


def release(claimed: bool) -> None:
    """Training is over: close the last step, and uninstall detection if `claim()` installed it."""
    finish()
    if claimed:
        uninstall()
