"""A training batch's size from its shape: samples and, for token ids, tokens.

Read at each batch fetch (`data.next_wrapper`) and summed over the step's micro-batches into
the step's `train.samples` and `train.tokens` (`machine.resolve_pending`), which feed
`train.throughput.*` and, as 6·N·tokens, `train.mfu`. Only what the shape tells, with no
device sync (a tensor's shape and dtype live on the host):

- the batch: a tensor, or in a tuple/list its first item (the `(inputs, targets)` convention),
  or in a dict (a Hugging Face batch) its `input_ids`, else its first value;
- samples: that tensor's first dimension;
- tokens: batch x sequence length when that tensor is 2-D integer ids (padding included).

Anything else (an object, a scalar) has no size: the step gets no such attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

try:  # in C (`_loops.c`); `size_of_python` is the fallback
    from otel_train.detect import _loops
except ImportError:
    _loops = None  # type: ignore[assignment]

_Tensor = torch.Tensor
_TOKEN_DTYPES = frozenset({torch.int64, torch.int32})


def size_of_python(batch: Any) -> tuple[int, int] | None:
    """(samples, tokens) of a batch, tokens 0 when it holds no token ids; None when unknown.

    On the training thread at every fetch: exact-type checks first (an ABC `isinstance` costs
    several times more), one `shape` read, the dtype only for a 2-D tensor. `_loops.size_of`
    in C."""
    x = batch
    if not isinstance(x, _Tensor):
        kind = type(x)
        if kind is tuple or kind is list:
            x = x[0] if x else None
        elif kind is dict or isinstance(x, Mapping):
            x = x["input_ids"] if "input_ids" in x else next(iter(x.values()), None)
        elif isinstance(x, (tuple, list)):  # a namedtuple, a list subclass
            x = x[0] if x else None
        if not isinstance(x, _Tensor):
            return None
    shape = x.shape
    if not shape:
        return None
    samples = shape[0]
    if len(shape) == 2 and x.dtype in _TOKEN_DTYPES:
        return samples, samples * shape[1]
    return samples, 0


if _loops is not None:
    _loops.bind_sizes(_Tensor, Mapping, _TOKEN_DTYPES)
size_of = _loops.size_of if _loops is not None else size_of_python
