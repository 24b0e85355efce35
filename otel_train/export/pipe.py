"""The pipe between the worker and the exporter process: message framing and serialisation.

Each message is a 4-byte little-endian length, then a format byte, then a marshal or pickle of
a tuple: `("setup", ExportSetup)`, then `("batch", segments, offset, dropped totals)` or
`("packed", slots, side records, wire flags, new strings, offset, dropped totals)` (or
`("strings", new strings)` where such a message had to be dropped), or `("flush", token,
seconds)`, then `("shutdown", seconds)`. Both ends import this module; the exporter
process imports of the training hot path only its C `unpack`. (Not in `exporter_process`, which runs as
`python -m`: imported by the package first, runpy would warn.)
"""

from __future__ import annotations

import io
import marshal
import numbers
import pickle
import struct
from typing import Any

#: The length prefix of every message.
FRAME = struct.Struct("<I")

#: The first byte of a message: how the rest is serialised. Marshal when the message holds only
#: what marshal writes (the usual batch of hot-path tuples: 0.20-0.28 against 0.33-0.37 µs a
#: record pickled, in the training process, where the worker pays it); pickle otherwise.
FORMAT_MARSHAL = b"M"
FORMAT_PICKLE = b"P"

#: Records in order, as runs: `(False, hot-path tuples)` or `(True, wire tuples)`.
Segments = list[tuple[bool, list[tuple[Any, ...]]]]


def segments_count(segments: Segments) -> int:
    return sum(len(records) for _, records in segments)


class _WirePickler(pickle.Pickler):
    """Pickles records as they are, except what the exporter process must not receive.

    The C pickler consults `reducer_override` only for objects that are not plain str, int,
    float, bool, None, bytes, tuple, list, dict or set, so the usual record costs nothing
    extra. What does reach it: a class not in builtins (a span's `exc`: its name goes), a number
    of another type (numpy, IntEnum: as int or float), the package's own setup objects (as they
    are), anything else (a tensor would be copied whole, or its `str()` would sync the device)
    as a short description (`attributes.Described`), which the exporter records as a string and
    says so, as it does in thread mode.
    """

    def reducer_override(self, obj: Any) -> Any:
        try:
            return self._reduce(obj)
        except Exception:  # noqa: BLE001 - a user's `__int__`, `__iter__`, `__name__` raised
            from otel_train.export.attributes import Described  # only when such a value appears
            return Described.of(obj).__reduce__()

    def _reduce(self, obj: Any) -> Any:
        if type(obj).__module__.startswith("otel_train."):
            return NotImplemented  # the setup's dataclasses, `Described`: the exporter imports them
        if isinstance(obj, type):
            if obj.__module__ == "builtins" or obj.__module__.startswith("otel_train."):
                return NotImplemented  # ValueError, or the `str` of a reduction made here: by reference
            return str, (obj.__name__,)  # a user's exception class: the exporter cannot import it
        if isinstance(obj, numbers.Integral):
            return int, (int(obj),)
        if isinstance(obj, numbers.Real):
            return float, (float(obj),)
        if isinstance(obj, (tuple, list)):  # torch.Size, a namedtuple: the exporter has neither
            return tuple, (tuple(obj),)
        from otel_train.export.attributes import Described  # only when such a value appears
        return Described.of(obj).__reduce__()


def dumps(message: tuple[Any, ...]) -> bytes:
    """A message for the exporter process (read back by `loads`). Marshal takes the usual
    batch (str, int, float, None, tuples, lists, dicts) and refuses anything else, such as an
    exception class, a tensor or a numpy number; `_WirePickler` converts those."""
    try:
        return FORMAT_MARSHAL + marshal.dumps(message)
    except ValueError:
        out = io.BytesIO()
        out.write(FORMAT_PICKLE)
        _WirePickler(out, pickle.HIGHEST_PROTOCOL).dump(message)
        return out.getvalue()


def loads(payload: bytes) -> Any:
    """A message from `dumps` (read by the exporter process)."""
    body = memoryview(payload)[1:]
    return marshal.loads(body) if payload[:1] == FORMAT_MARSHAL else pickle.loads(body)
