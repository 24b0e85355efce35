"""Lean OTLP encoding: spans straight to `ExportTraceServiceRequest` protobuf bytes.

The official encoder (`opentelemetry.exporter.otlp.proto.common`) builds one Python protobuf
object per span, attribute and value: ~15 us a span here, most of what exporting costs. A
training run repeats itself: the same span names, the same few attributes (`train.step`,
`train.micro_batch`), one resource. So this encoder writes the wire format by hand and keeps
the encoded bytes of every name and key/value it has seen (bounded), which brings a span to a
few microseconds. The output parses into exactly the message the official encoder builds
(tests/test_otlp.py compares them field by field).

It serves the OTLP/gRPC exporter in `exporters`: `LeanSpanBatch` carries the bytes, and the
exporter's `_translate_data` parses them (in C) into the request its stub sends, so retries,
headers, TLS and compression stay the official exporter's own.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

_log = logging.getLogger("otel_train")

_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
_CACHE_MAX = 65536
_MASK64 = (1 << 64) - 1

# Span flags as the official encoder sets them (trace.proto SpanFlags).
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200

# The fixed-width head of a span in one `pack`: trace_id (field 1, 16 bytes, as two big-endian
# halves), span_id (field 2), and optionally parent_span_id (field 4).
_IDS = struct.Struct(">2sQQ2sQ")
_IDS_PARENT = struct.Struct(">2sQQ2sQ2sQ")
# kind (field 6) = SPAN_KIND_INTERNAL, start (field 7) and end (field 8) as fixed64.
_TIMES = struct.Struct("<2sBQBQ")
KIND_INTERNAL = b"\x30\x01"
# An unset status (field 15, empty) and the flags (field 16) of a local or a remote parent.
_STATUS_UNSET = b"\x7a\x00"
_FLAGS_LOCAL = b"\x85\x01" + _FIXED32.pack(_HAS_IS_REMOTE)
_FLAGS_REMOTE = b"\x85\x01" + _FIXED32.pack(_HAS_IS_REMOTE | _IS_REMOTE)
TAIL_LOCAL = _STATUS_UNSET + _FLAGS_LOCAL
_TAIL_REMOTE = _STATUS_UNSET + _FLAGS_REMOTE
_TAIL_LEN = len(TAIL_LOCAL)
# `region`'s head: trace_id with its tag, span_id (and parent_span_id) as little-endian fixed64s
# (`wire.ids.region_wire_id`), kind, start and end. The public names here (and
# `region_prefix`) are for `fast_path.FastPath.regions`, which inlines `region`.
REGION_HEAD = struct.Struct("<18s2sQ2sBQBQ")
REGION_HEAD_PARENT = struct.Struct("<18s2sQ2sQ2sBQBQ")


def _varint_slow(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives are 10-byte two's complement varints
    if 1 << 14 <= value < 1 << 28:  # a step number, mostly: 3 or 4 bytes without the loop
        if value < 1 << 21:
            return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14 & 0x7F | 0x80, value >> 21))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = tuple(_varint_slow(i) for i in range(1 << 14))  # every length and tag we write


def _varint(value: int) -> bytes:
    if 0 <= value < 16384:
        return _SMALL_VARINTS[value]
    return _varint_slow(value)


#: The tag and length of a `ScopeSpans.spans` field, for every length under REGION_PREFIXES_MAX.
REGION_PREFIXES = tuple(b"\x12" + v for v in _SMALL_VARINTS)
REGION_PREFIXES_MAX = len(REGION_PREFIXES)


def region_prefix(length: int) -> bytes:
    """The tag and length of a `ScopeSpans.spans` field holding `length` bytes."""
    return REGION_PREFIXES[length] if length < REGION_PREFIXES_MAX else b"\x12" + _varint_slow(length)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint((field << 3) | wire_type)


def _len_field(field: int, payload: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(payload)) + payload


def _str_field(field: int, text: str) -> bytes:
    return _len_field(field, text.encode("utf-8"))


def _any_value(value: Any) -> bytes:
    if isinstance(value, str):
        return _str_field(1, value)
    if isinstance(value, bool):
        return _tag(2, 0) + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return _tag(3, 0) + _varint(value)
    if isinstance(value, float):
        return _tag(4, 1) + _DOUBLE.pack(value)
    if isinstance(value, (list, tuple)):
        return _len_field(5, b"".join(_len_field(1, _any_value(v)) for v in value))
    return _str_field(1, str(value))


class LeanEncoder:
    """Encodes span tuples for one resource and scope; caches what repeats."""

    def __init__(self, resource: Mapping[str, Any], scope_name: str, scope_version: str) -> None:
        resource_msg = b"".join(_len_field(1, self._kv_uncached(k, v)) for k, v in resource.items())
        scope_msg = _str_field(1, scope_name) + (_str_field(2, scope_version) if scope_version else b"")
        self._resource_field = _len_field(1, resource_msg)  # ResourceSpans.resource
        self._scope_field = _len_field(1, scope_msg)  # ScopeSpans.scope
        self._kv_cache: dict[tuple[str, type, Any], bytes] = {}
        self._names: dict[str, bytes] = {}
        self._float_prefixes: dict[str, bytes] = {}
        self._keys: dict[str, bytes] = {}
        self.unencodable = 0  # spans `batches` could not encode, dropped (counted as failed)

    def batches(self, spans: Sequence[tuple[Any, ...]], max_spans: int, max_bytes: int) -> list[LeanSpanBatch]:
        """`spans` (`spans.SpanAssembler._build`'s lean tuples) as `ExportTraceServiceRequest`s of
        at most `max_spans` spans and (but for a lone huge span) `max_bytes`."""
        span = self._span
        # ScopeSpans.spans; a usual region (and step) comes encoded already (`region`).
        try:
            fields = [s if type(s) is bytes else _len_field(2, span(s)) for s in spans]
        except Exception:  # noqa: BLE001 - one span that cannot be encoded costs itself, not the batch
            fields = [field for field in map(self._field_or_none, spans) if field is not None]
        out: list[LeanSpanBatch] = []
        start = 0
        while start < len(fields):
            chunk = fields[start:start + max_spans]
            if sum(map(len, chunk)) > max_bytes:  # fill by size: at least one, however large
                size, end = len(chunk[0]), 1
                while end < len(chunk) and size + len(chunk[end]) <= max_bytes:
                    size += len(chunk[end])
                    end += 1
                chunk = chunk[:end]
            out.append(LeanSpanBatch(self._request(chunk), len(chunk)))
            start += len(chunk)
        return out

    def _field_or_none(self, span: Any) -> bytes | None:
        """One span's field, or None (counted in `unencodable`, said once) where it cannot be
        encoded: the exporter process must outlive anything it is handed."""
        try:
            return span if type(span) is bytes else _len_field(2, self._span(span))
        except Exception as err:  # noqa: BLE001 - see above
            if not self.unencodable:
                _log.warning("otel_train: a span could not be encoded (%s, a bug in otel_train: please report "
                             "it); it is counted as failed.", type(err).__name__)
            self.unencodable += 1
            return None

    def _request(self, span_fields: list[bytes]) -> bytes:
        scope_spans = self._scope_field + b"".join(span_fields)
        resource_spans = self._resource_field + _len_field(2, scope_spans)
        return _len_field(1, resource_spans)

    # -- pieces ------------------------------------------------------------------------
    @staticmethod
    def _kv_uncached(key: str, value: Any) -> bytes:
        return _str_field(1, key) + _len_field(2, _any_value(value))

    def kv(self, key: str, value: Any) -> bytes:
        """One `KeyValue` field (tag included), cached by key, value and its type."""
        cache_key = (key, type(value), value if not isinstance(value, list) else tuple(value))
        try:
            return self._kv_cache[cache_key]
        except (KeyError, TypeError):
            encoded = _len_field(9, self._kv_uncached(key, value))
            if len(self._kv_cache) >= _CACHE_MAX:
                self._kv_cache.clear()
            try:
                self._kv_cache[cache_key] = encoded
            except TypeError:  # an unhashable value: encode every time
                pass
            return encoded

    def region(self, name: str, trace_field: bytes, span_wire: int, parent_wire: int | None, start: int,
               end: int, attributes: bytes, remote: bool = False) -> bytes:
        """A span with no events, links or status (a region or a step): the whole
        `ScopeSpans.spans` field in one `pack` and one `join`. `trace_field` is `trace_field()`;
        the ids are in `wire.ids.region_wire_id`'s little-endian form; `attributes` are
        encoded already (`attributes`). Fields go in an order of their own (times before the
        name), which parses into the same message."""
        name_field = self._names.get(name) or self.name_field(name)
        if parent_wire:
            head = REGION_HEAD_PARENT.pack(trace_field, b"\x12\x08", span_wire, b"\x22\x08", parent_wire,
                                           KIND_INTERNAL, 0x39, start, 0x41, end)
        else:
            head = REGION_HEAD.pack(trace_field, b"\x12\x08", span_wire, KIND_INTERNAL, 0x39, start, 0x41, end)
        return b"".join((region_prefix(len(head) + len(name_field) + len(attributes) + _TAIL_LEN), head,
                         name_field, attributes, _TAIL_REMOTE if remote else TAIL_LOCAL))

    @staticmethod
    def trace_field(trace_id: int) -> bytes:
        """`Span.trace_id` with its tag, for `region`."""
        return b"\x0a\x10" + trace_id.to_bytes(16, "big")

    def attributes(self, attrs: Mapping[str, Any]) -> bytes:
        """`Span.attributes` fields for valid attribute values (cleaned already)."""
        return self._attributes(attrs, 9)

    def int_attribute(self, key: str, value: int) -> bytes:
        """One int `Span.attributes` field, uncached (for values that rarely repeat: a step number)."""
        key_field = self._keys.get(key) or self._key(key)
        value_field = b"\x18" + _varint(value)  # AnyValue{int_value}
        body = key_field + b"\x12" + _SMALL_VARINTS[len(value_field)] + value_field
        return b"\x4a" + _varint(len(body)) + body

    def _key(self, key: str) -> bytes:
        if len(self._keys) >= _CACHE_MAX:
            self._keys.clear()
        encoded = self._keys[key] = _str_field(1, key)
        return encoded

    def float_attribute(self, key: str, value: float) -> bytes:
        """One float `Span.attributes` field; only its key's part is cached (the value rarely repeats)."""
        prefix = self._float_prefixes.get(key)
        if prefix is None:
            key_field = self._keys.get(key) or self._key(key)
            prefix = self._float_prefixes[key] = (_tag(9, 2) + _varint(len(key_field) + 11) + key_field
                                                  + b"\x12\x09\x21")  # value: AnyValue{double_value}
        return prefix + _DOUBLE.pack(value)

    def _attributes(self, attrs: Mapping[str, Any] | None, field: int) -> bytes:
        if not attrs:
            return b""
        if field == 9:
            return b"".join([self.kv(k, v) for k, v in attrs.items()])
        return b"".join([_len_field(field, self._kv_uncached(k, v)) for k, v in attrs.items()])

    def name_field(self, name: str) -> bytes:
        """`Span.name` with its tag, cached."""
        encoded = self._names.get(name)
        if encoded is None:
            if len(self._names) >= _CACHE_MAX:
                self._names.clear()
            encoded = self._names[name] = _str_field(5, name)
        return encoded

    def _span(self, span: tuple[Any, ...]) -> bytes:
        (name, trace_id, span_id, parent_id, parent_remote, start, end, attrs, events, links,
         status_code, status_message) = span
        names = self._names
        name_field = names.get(name) or self.name_field(name)
        if parent_id:
            head = _IDS_PARENT.pack(b"\x0a\x10", trace_id >> 64, trace_id & _MASK64, b"\x12\x08", span_id,
                                    b"\x22\x08", parent_id)
        else:
            head = _IDS.pack(b"\x0a\x10", trace_id >> 64, trace_id & _MASK64, b"\x12\x08", span_id)
        parts = [head, name_field, _TIMES.pack(KIND_INTERNAL, 0x39, start, 0x41, end)]
        if attrs:
            kv = self.kv
            parts += [kv(k, v) for k, v in attrs.items()]
        if events or links or status_code or status_message:
            parts.append(self._rare(events, links, status_code, status_message))
        else:
            parts.append(_STATUS_UNSET)
        parts.append(_FLAGS_REMOTE if parent_id and parent_remote else _FLAGS_LOCAL)
        return b"".join(parts)

    def _rare(self, events: Any, links: Any, status_code: int, status_message: str | None) -> bytes:
        """Events, links and the status: fields 11, 13 and 15, in field order."""
        parts = []
        for ev_name, ev_time, ev_attrs in events or ():
            event = b"\x09" + _FIXED64.pack(ev_time) + _str_field(2, ev_name) + self._attributes(ev_attrs, 3)
            parts.append(_len_field(11, event))
        for link_trace, link_span in links or ():
            link = (b"\x0a\x10" + link_trace.to_bytes(16, "big") + b"\x12\x08" + link_span.to_bytes(8, "big")
                    + b"\x35" + _FIXED32.pack(_HAS_IS_REMOTE | _IS_REMOTE))
            parts.append(_len_field(13, link))
        status = (_str_field(2, status_message) if status_message else b"") + \
            (_tag(3, 0) + _varint(status_code) if status_code else b"")
        parts.append(_len_field(15, status))
        return b"".join(parts)


class LeanSpanBatch:
    """Pre-encoded spans handed to the gRPC exporter in place of `ReadableSpan`s."""

    __slots__ = ("payload", "count")

    def __init__(self, payload: bytes, count: int) -> None:
        self.payload = payload
        self.count = count

    def __len__(self) -> int:
        return self.count
