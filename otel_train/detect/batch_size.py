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

import torch

from otel_train.detect import _loops

_TOKEN_DTYPES = frozenset({torch.int64, torch.int32})


_loops.bind_sizes(torch.Tensor, Mapping, _TOKEN_DTYPES)
#: `size_of(batch)`: (samples, tokens) of a batch, tokens 0 when it holds no token ids; None when
#: unknown. In C: on the training thread at every fetch, exact-type checks first (an ABC
#: `isinstance` costs several times more), one `shape` read, the dtype only for a 2-D tensor.
size_of = _loops.size_of
