"""Span attributes as OpenTelemetry allows them: user values cleaned, device values added.

A user's attribute value may be anything (a tensor, a numpy number, a list of mixed types);
what leaves is str, bool, int (64 bits), float or a list of one of them, with one warning per
(span, key) saying what was changed and why: strings cut to OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT
characters, lists to as many items (a request stays far below a collector's 4 MiB limit), None
left out, anything else described as a string. Never `str()` of a tensor: that copies it to the
host, a device sync (`describe`).
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

_log = logging.getLogger("otel_train")
SCALARS = (str, bool, int, float)


class AttributeCleaner:
    """Makes user attributes valid OTel values; says once per (span, key) what it changed and why."""

    def __init__(self, value_limit: int) -> None:
        self.limit = value_limit
        self._warned: set[tuple[str, str]] = set()

    def clean(self, span_name: str, attrs: Mapping[Any, Any] | None) -> dict[str, Any]:
        if not attrs:
            return {}
        out: dict[str, Any] = {}
        for key, value in attrs.items():
            if not isinstance(key, str) or not key:
                key = describe(key) or "_"
                self._warn(span_name, key, "attribute keys must be non-empty strings; key made a string")
            if value is None:
                self._warn(span_name, key, "None is not an attribute value; the attribute is left out")
                continue
            try:
                out[key] = self._value(span_name, key, value)
            except Exception:  # noqa: BLE001 - a user's value (its __len__, __iter__, __int__) raised
                self._warn(span_name, key, f"a value of type {_type_name(value)} raised when read; recorded "
                                           "as a description")
                out[key] = self._cut(span_name, key, describe(value))
        return out

    def _value(self, span_name: str, key: str, value: Any) -> Any:
        if type(value) is Described:  # described by the training process (`pipe`): not allowed as it was
            self._warn(span_name, key, f"type {value.type_name} is not allowed (str, bool, int, float or a list of "
                                       "one of them); recorded as a string")
            return self._cut(span_name, key, str(value))
        if isinstance(value, str):
            return self._cut(span_name, key, value)
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            if -(1 << 63) <= value < (1 << 63):
                return value
            self._warn(span_name, key, "integer does not fit in 64 bits; recorded as a string")
            return str(value)
        if isinstance(value, float):
            return value
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            return float(value)
        if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
            items = list(value)
            if len(items) > self.limit:
                self._warn(span_name, key, f"list of {len(items)} items cut to {self.limit} "
                                           "(OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT)")
                items = items[: self.limit]
            kinds = {type(item) for item in items}
            if len(kinds) <= 1 and kinds <= set(SCALARS):
                return tuple(self._cut(span_name, key, item) if isinstance(item, str) else item for item in items)
            self._warn(span_name, key, "a list attribute must hold one type of str, bool, int or float; "
                                       "recorded as a list of strings")
            return tuple(self._cut(span_name, key, describe(item)) for item in items)
        self._warn(span_name, key, f"type {type(value).__name__} is not allowed (str, bool, int, float or "
                                   "a list of one of them); recorded as a string")
        return self._cut(span_name, key, describe(value))

    def _cut(self, span_name: str, key: str, text: str) -> str:
        if len(text) <= self.limit:
            return text
        self._warn(span_name, key, f"value of {len(text)} characters cut to {self.limit} "
                                   "(OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT)")
        return text[: self.limit]

    def _warn(self, span_name: str, key: str, why: str) -> None:
        if (span_name, key) in self._warned:
            return
        self._warned.add((span_name, key))
        _log.warning("otel_train: span %r attribute %r: %s.", span_name, key, why)


def add_device(attrs: dict[str, Any], dev: Mapping[str, Any]) -> None:
    """Device attributes from the wire's device dict, minus its private ("_") keys."""
    for key, value in dev.items():
        if not key.startswith("_"):
            attrs[key] = value


def describe(value: Any) -> str:
    """A value as a string attribute, without a device sync; never raises (a user's `__str__`
    may: then the value is named by its type)."""
    try:
        # A tensor's str() would copy it to the host (a device sync): describe it instead.
        if type(value).__name__ in ("Tensor", "Parameter") and hasattr(value, "shape"):
            return f"<tensor shape={tuple(value.shape)} dtype={value.dtype} device={value.device}>"
        if isinstance(value, (bytes, bytearray)):
            return value.hex()
        text = str(value)
        if type(text) is not str:  # a str subclass may carry anything: plain text only
            text = str.__str__(text)
        return text
    except Exception:  # noqa: BLE001 - the user's code
        return f"<{_type_name(value)}: str() failed>"


def _type_name(value: Any) -> str:
    try:
        return str(type(value).__name__)
    except Exception:  # noqa: BLE001 - a metaclass's __name__ may be anything
        return "object"


class Described(str):
    """A value that is not a valid attribute, described as text by the training process (`pipe`,
    which must not send a tensor across); the cleaner records the text and says why, as it does
    for the value itself in thread mode."""

    type_name: str

    def __new__(cls, text: str, type_name: str) -> Described:
        obj = super().__new__(cls, text)
        obj.type_name = type_name
        return obj

    @classmethod
    def of(cls, value: Any) -> Described:
        return cls(describe(value), _type_name(value))

    def __reduce__(self) -> Any:
        return Described, (str(self), self.type_name)
