"""What each setting accepts: one parser per kind of value, each raising `Invalid` with what is
allowed (`_config` names the setting and falls back). Also the rules other modules share:
an endpoint's credentials redacted in messages (`redact_url`) and sent as Basic authorization
(`userinfo_auth`), and a run id that names exactly one directory (`safe_run_id`).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from otel_train import semconv
from otel_train.wire import sampling

_log = logging.getLogger("otel_train")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


#: The largest OTEL_TRAIN_BUFFER_SIZE: 4 Mi records, about 300 MB of slots at most.
BUFFER_MAX = 1 << 22


class Invalid(ValueError):
    """Raised by a parser; its message says what is allowed."""


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise Invalid("expected true or false")


def int_at_least(minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            number = int(value.strip()) if isinstance(value, str) else value
        except ValueError:
            number = None
        if isinstance(number, bool) or not isinstance(number, int) or number < minimum:
            raise Invalid(f"expected an integer >= {minimum}")
        return number

    return parse


def int_between(minimum: int, maximum: int) -> Callable[[Any], int]:
    at_least = int_at_least(minimum)

    def parse(value: Any) -> int:
        try:
            number = at_least(value)
        except Invalid:
            number = None
        if number is None or number > maximum:
            raise Invalid(f"expected an integer from {minimum} to {maximum}")
        return number

    return parse


def float_above(minimum: float, maximum: float = float("inf")) -> Callable[[Any], float]:
    allowed = f"expected a number > {minimum:g}" + (f" and <= {maximum:g}" if maximum < float("inf") else "")

    def parse(value: Any) -> float:
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError, OverflowError):
            raise Invalid(allowed) from None
        if not minimum < number <= maximum or number == float("inf"):  # NaN fails the first test
            raise Invalid(allowed)
        return number

    return parse


#: The longest shutdown bound or export timeout, in seconds: a day. Past ~9.2e9 s the waits that
#: use them raise OverflowError (at exit, where the closing line is written), and nothing longer
#: than a day is a bound a job scheduler waits for.
SECONDS_MAX = 86400.0


def optional_float_above(minimum: float) -> Callable[[Any], float | None]:
    parse = float_above(minimum)

    def parse_optional(value: Any) -> float | None:
        return None if value is None else parse(value)

    return parse_optional


def one_of(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = value.strip().lower() if isinstance(value, str) else value
        if text not in choices:
            raise Invalid("expected one of " + ", ".join(choices))
        return text

    return parse


def nonempty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Invalid("expected a non-empty string")
    return value.strip()


def endpoint_url(value: Any) -> str | None:
    """An OTLP endpoint URL: scheme http or https, a host, a port from 1 to 65535 if given."""
    if value is None:
        return None
    text = nonempty_text(value)
    allowed = "expected a URL such as http://127.0.0.1:4317 (scheme http or https, a host, a port 1-65535)"
    if "://" not in text:
        raise Invalid(allowed)
    if any(c.isspace() or not c.isprintable() for c in text):
        raise Invalid("expected a URL without spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # raises for a port that is not a number, or past 65535
    except ValueError:
        raise Invalid(allowed) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise Invalid("expected a URL whose scheme is http or https")
    if not parts.hostname or port == 0:
        raise Invalid(allowed)
    if parts.password is not None and parts.username is None:
        raise Invalid(allowed)
    return text


def redact_url(text: Any) -> str:
    """`text` with the user information of a URL (`user:password@`) shown as `***@`: what every
    message and the closing line print of an endpoint. The credentials themselves are sent as
    HTTP Basic authentication (`userinfo_auth`)."""
    text = str(text)
    scheme, sep, rest = text.partition("://")
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if not sep or "@" not in netloc:
        return text
    return f"{scheme}://***@{rest[len(netloc.rpartition('@')[0]) + 1:]}"


def userinfo_auth(text: str) -> str | None:
    """The `Authorization` value that the user information of URL `text` stands for (`Basic`,
    RFC 7617), or None when it has none: userinfo in a URL is not sent as such by either
    transport, so an endpoint written `http://user:password@host:4318` would otherwise reach the
    collector without its credentials."""
    parts = urllib.parse.urlsplit(text)
    if parts.username is None:
        return None
    raw = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(raw.encode("utf-8")).decode("ascii")


#: What a run id may hold: it names a directory (`<output dir>/<run id>/`) and a resource attribute.
_RUN_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]")
RUN_ID_MAX = 128


def safe_run_id(text: str, source: str) -> str:
    """`text` as a run id that names exactly one directory inside the output directory: letters,
    digits, '.', '_' and '-', not starting with '.', at most `RUN_ID_MAX` characters. Anything
    else is replaced (the same way on every rank, so the ranks still agree) and said once."""
    safe = _RUN_ID_CHARS.sub("_", text)[:RUN_ID_MAX]
    if safe.startswith("."):
        safe = "_" + safe[1:]
    if safe != text:
        _log.warning("otel_train: %s=%r is not a valid run id: it names a directory, so only letters, digits, "
                     "'.', '_' and '-' are allowed (not a leading '.', at most %d characters); using %r.",
                     source, text, RUN_ID_MAX, safe)
    return safe


def run_id(value: Any) -> str | None:
    if value is None:
        return None
    return safe_run_id(nonempty_text(value), semconv.ENV_RUN_ID)


def header_list(value: Any) -> dict[str, str] | None:
    """`key=value,key2=value2` (values URL-encoded, as the OTLP specification says) as a dict.

    A malformed item is dropped with a message that names its position, never its text: a
    header may hold a secret (`Authorization=Bearer ...`)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = ",".join(f"{urllib.parse.quote(str(k).strip())}={urllib.parse.quote(str(v).strip())}"
                         for k, v in value.items())
    text = nonempty_text(value)
    items = text.split(",")
    headers: dict[str, str] = {}
    for index, item in enumerate(items, 1):
        key, sep, val = item.partition("=")
        key = urllib.parse.unquote(key.strip()).lower()
        if not sep or not key or not _HEADER_NAME.fullmatch(key):
            _log.warning("otel_train: OTEL_EXPORTER_OTLP_HEADERS item %d of %d is not key=value with a valid "
                         "header name (it is not shown: headers may hold secrets; write Authorization=Bearer%%20<token>, "
                         "not Authorization: Bearer <token>); it is not sent.",
                         index, len(items))
            continue
        text_value = urllib.parse.unquote(val.strip())
        if not all(" " <= c <= "~" for c in text_value):
            # A newline (`%0A`) would make HTTP raise with the value in its message, and gRPC
            # metadata takes printable ASCII only.
            _log.warning("otel_train: OTEL_EXPORTER_OTLP_HEADERS item %d of %d (%r) has a value with a character "
                         "that is not printable ASCII (a newline, %%0A, or a control character; the value is not "
                         "shown: headers may hold secrets); it is not sent.", index, len(items), key)
            continue
        headers[key] = text_value
    return headers or None


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")


def readable_file(value: Any) -> str | None:
    if value is None:
        return None
    text = nonempty_text(value)
    if not os.path.isfile(text) or not os.access(text, os.R_OK):
        raise Invalid("expected the path of a readable file")
    return text


def compression(value: Any) -> str:
    return one_of("none", "gzip")(value)


def protocol(value: Any) -> str:
    text = value.strip().lower() if isinstance(value, str) else value
    if text == "http/json":
        # The OTLP exporters here speak grpc and http/protobuf only.
        raise Invalid("expected grpc or http/protobuf (http/json is not available in Python)")
    if text not in ("grpc", "http/protobuf"):
        raise Invalid("expected grpc or http/protobuf")
    return text


def exporter(value: Any) -> str:
    # OTEL_TRACES_EXPORTER may list several; the first one we know wins.
    text = value.strip().lower() if isinstance(value, str) else value
    if not isinstance(text, str):
        raise Invalid("expected one of auto, otlp, file, console, none")
    for name in (part.strip() for part in text.split(",")):
        if name in ("auto", "otlp", "file", "console", "none"):
            return name
    raise Invalid("expected one of auto, otlp, file, console, none")


def ranks(value: Any) -> str:
    try:
        return sampling.parse_ranks(value)
    except ValueError as err:
        raise Invalid(str(err)) from None


def device_timing(value: Any) -> str:
    if isinstance(value, bool):
        return "auto" if value else "off"
    text = value.strip().lower() if isinstance(value, str) else value
    if text in _TRUE:
        return "auto"
    if text in _FALSE:
        return "off"
    return one_of("auto", "off")(text)
