"""Synthetic batches for the latency benchmark: random tensors shaped like a real batch.

A batch is described once (`SyntheticBatches`) from a token spec (batch size x sequence
length of ids below a vocabulary size), a plain tensor shape, or one example batch (a tensor,
or tuples / lists / dicts of them, nested). Each call then builds a fresh batch with the same
structure, shapes, dtypes and device, filled with random values; the real data loader is never
read. Values come from the global torch RNG (callers that must leave it untouched fork it).

- floating tensors: standard normal (in the dtype asked for, else the example's);
- integer tensors: uniform in [0, vocab_size) when a vocabulary size is given, else in
  [max(min, 0), max] of the example's own values (so ids stay valid embedding indices, class
  targets valid classes, and an ignore index such as -100 never appears);
- bool tensors: all True (a mask that hides nothing); anything that is not a tensor: as is.

The batch size is dim 0 of the first tensor; the sequence length dim 1 of the first integer
tensor with two dimensions or more (token ids); tokens per batch = batch size x sequence length.
`batch_size` / `seq_len` overrides resize every tensor whose dim 0 / dim 1 had that size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch


@dataclass(frozen=True)
class _Leaf:
    """One tensor of the batch: what a fresh one is built from."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    low: int = 0  # integer tensors: values drawn from [low, high)
    high: int = 1


class SyntheticBatches:
    """Builds random batches shaped like one described batch; call it for a fresh one."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        leaves = list(_leaves(spec, ""))
        if not leaves:
            raise ValueError("the example batch holds no tensor to build synthetic batches from")
        self.inputs = [{"path": path or "(batch)", "shape": list(leaf.shape), "dtype": _dtype_name(leaf.dtype)}
                       for path, leaf in leaves]
        first = leaves[0][1]
        #: Samples per batch (dim 0 of the first tensor).
        self.batch_size: int = first.shape[0] if first.shape else 1
        #: Sequence length: dim 1 of the first integer tensor of 2+ dims, None where there is none.
        self.seq_len: int | None = next((leaf.shape[1] for _, leaf in leaves
                                         if _is_int(leaf.dtype) and len(leaf.shape) >= 2), None)

    @property
    def tokens(self) -> int | None:
        """Tokens per batch, where the batch has token ids."""
        return None if self.seq_len is None else self.batch_size * self.seq_len

    def __call__(self) -> Any:
        return _build(self.spec)

    # --- ways to describe a batch ------------------------------------------------------
    @classmethod
    def tokens_of(cls, batch_size: int, seq_len: int, vocab_size: int, device: torch.device) -> SyntheticBatches:
        """A (batch_size, seq_len) int64 tensor of token ids below `vocab_size`."""
        return cls(_Leaf((batch_size, seq_len), torch.int64, device, 0, vocab_size))

    @classmethod
    def shaped(cls, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> SyntheticBatches:
        """One tensor of `shape` (batch dimension first): normal floats, or ints in [0, 2)."""
        return cls(_Leaf(tuple(shape), dtype, device, 0, 2))

    @classmethod
    def like(cls, example: Any, *, batch_size: int | None = None, seq_len: int | None = None,
             vocab_size: int | None = None, device: torch.device | None = None,
             float_dtype: torch.dtype | None = None) -> SyntheticBatches:
        """The structure of `example`, resized and retyped as asked.

        Reads the example's integer tensors once for their value range when no `vocab_size` is
        given (a device-to-host copy: call it where a synchronisation costs nothing)."""
        spec = _describe(example, vocab_size, device, float_dtype)
        found = cls(spec)
        if seq_len is not None and found.seq_len is None:
            raise ValueError("seq_len was given but the batch has no integer tensor of 2+ dimensions "
                             "(token ids) to take a sequence length from")
        resize: dict[int, tuple[int, int]] = {}
        if batch_size is not None and batch_size != found.batch_size:
            resize[0] = (found.batch_size, batch_size)
        if seq_len is not None and seq_len != found.seq_len:
            resize[1] = (found.seq_len, seq_len)  # type: ignore[assignment]
        return cls(_map(spec, lambda leaf: _resized(leaf, resize))) if resize else found


def _is_int(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _describe(example: Any, vocab_size: int | None, device: torch.device | None,
              float_dtype: torch.dtype | None) -> Any:
    def leaf(t: torch.Tensor) -> _Leaf:
        dtype = float_dtype if float_dtype is not None and t.dtype.is_floating_point else t.dtype
        low, high = 0, 1
        if _is_int(t.dtype):
            if vocab_size is not None:
                high = vocab_size
            elif t.numel():
                # CPU-GPU sync point (once, before the benchmark): the example's value range.
                lo, hi = (int(v) for v in torch.stack([t.min(), t.max()]).tolist())
                low = max(lo, 0) if hi >= 0 else lo
                high = hi + 1
        return _Leaf(tuple(t.shape), dtype, device if device is not None else t.device, low, high)
    return _map(example, leaf, tensors=True)


def _resized(leaf: _Leaf, resize: Mapping[int, tuple[int, int]]) -> _Leaf:
    shape = list(leaf.shape)
    for dim, (old, new) in resize.items():
        if len(shape) > dim and shape[dim] == old:
            shape[dim] = new
    return replace(leaf, shape=tuple(shape))


def _map(tree: Any, fn: Any, tensors: bool = False) -> Any:
    """`tree` with `fn` applied to its tensors (`tensors`) or its `_Leaf`s."""
    if isinstance(tree, torch.Tensor if tensors else _Leaf):
        return fn(tree)
    if isinstance(tree, Mapping):
        return {k: _map(v, fn, tensors) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return type(tree)(*(_map(v, fn, tensors) for v in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map(v, fn, tensors) for v in tree)
    return tree


def _leaves(tree: Any, path: str) -> Any:
    if isinstance(tree, _Leaf):
        yield path, tree
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(tree, (tuple, list)):
        for index, value in enumerate(tree):
            yield from _leaves(value, f"{path}.{index}" if path else str(index))


def _build(spec: Any) -> Any:
    return _map(spec, _fresh)


def _fresh(leaf: _Leaf) -> torch.Tensor:
    if leaf.dtype.is_floating_point or leaf.dtype.is_complex:
        return torch.randn(leaf.shape, dtype=leaf.dtype, device=leaf.device)
    if leaf.dtype == torch.bool:
        return torch.ones(leaf.shape, dtype=torch.bool, device=leaf.device)
    return torch.randint(leaf.low, max(leaf.high, leaf.low + 1), leaf.shape, dtype=leaf.dtype, device=leaf.device)
