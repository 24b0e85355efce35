"""Configuration: one dataclass; explicit argument > environment variable > default.

Every field may arrive as a string (from the environment) or as a typed value (from
`otel_train.init(**overrides)`). `__post_init__` parses each one; an invalid value logs one
message naming the setting, the value (never a header's: it may hold a token) and what is
allowed, and falls back to the default, so a typo never stops a training run. Resolved once
in the training process; the exporter process receives the resolved object, never parses
again. docs/configuration.md lists every variable.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_train import semconv
from otel_train.wire import sampling

_log = logging.getLogger("otel_train")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


#: The largest OTEL_TRAIN_BUFFER_SIZE: 4 Mi records, about 300 MB of slots at most.
BUFFER_MAX = 1 << 22


class _Invalid(ValueError):
    """Raised by a parser; its message says what is allowed."""


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise _Invalid("expected true or false")


def _int_at_least(minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            number = int(value.strip()) if isinstance(value, str) else value
        except ValueError:
            number = None
        if isinstance(number, bool) or not isinstance(number, int) or number < minimum:
            raise _Invalid(f"expected an integer >= {minimum}")
        return number

    return parse


def _int_between(minimum: int, maximum: int) -> Callable[[Any], int]:
    at_least = _int_at_least(minimum)

    def parse(value: Any) -> int:
        try:
            number = at_least(value)
        except _Invalid:
            number = None
        if number is None or number > maximum:
            raise _Invalid(f"expected an integer from {minimum} to {maximum}")
        return number

    return parse


def _float_above(minimum: float, maximum: float = float("inf")) -> Callable[[Any], float]:
    allowed = f"expected a number > {minimum:g}" + (f" and <= {maximum:g}" if maximum < float("inf") else "")

    def parse(value: Any) -> float:
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError, OverflowError):
            raise _Invalid(allowed) from None
        if not minimum < number <= maximum or number == float("inf"):  # NaN fails the first test
            raise _Invalid(allowed)
        return number

    return parse


#: The longest shutdown bound or export timeout, in seconds: a day. Past ~9.2e9 s the waits that
#: use them raise OverflowError (at exit, where the closing line is written), and nothing longer
#: than a day is a bound a job scheduler waits for.
SECONDS_MAX = 86400.0


def _optional_float_above(minimum: float) -> Callable[[Any], float | None]:
    parse = _float_above(minimum)

    def parse_optional(value: Any) -> float | None:
        return None if value is None else parse(value)

    return parse_optional


def _one_of(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = value.strip().lower() if isinstance(value, str) else value
        if text not in choices:
            raise _Invalid("expected one of " + ", ".join(choices))
        return text

    return parse


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("expected a non-empty string")
    return value.strip()


def _endpoint(value: Any) -> str | None:
    """An OTLP endpoint URL: scheme http or https, a host, a port from 1 to 65535 if given."""
    if value is None:
        return None
    text = _text(value)
    allowed = "expected a URL such as http://127.0.0.1:4317 (scheme http or https, a host, a port 1-65535)"
    if "://" not in text:
        raise _Invalid(allowed)
    if any(c.isspace() or not c.isprintable() for c in text):
        raise _Invalid("expected a URL without spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # raises for a port that is not a number, or past 65535
    except ValueError:
        raise _Invalid(allowed) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise _Invalid("expected a URL whose scheme is http or https")
    if not parts.hostname or port == 0:
        raise _Invalid(allowed)
    if parts.password is not None and parts.username is None:
        raise _Invalid(allowed)
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


def _run_id(value: Any) -> str | None:
    if value is None:
        return None
    return safe_run_id(_text(value), semconv.ENV_RUN_ID)


def _headers(value: Any) -> dict[str, str] | None:
    """`key=value,key2=value2` (values URL-encoded, as the OTLP specification says) as a dict.

    A malformed item is dropped with a message that names its position, never its text: a
    header may hold a secret (`Authorization=Bearer ...`)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = ",".join(f"{urllib.parse.quote(str(k).strip())}={urllib.parse.quote(str(v).strip())}"
                         for k, v in value.items())
    text = _text(value)
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


def _readable_file(value: Any) -> str | None:
    if value is None:
        return None
    text = _text(value)
    if not os.path.isfile(text) or not os.access(text, os.R_OK):
        raise _Invalid("expected the path of a readable file")
    return text


_CA = "OTEL_EXPORTER_OTLP_CERTIFICATE"
_PAIR = "OTEL_EXPORTER_OTLP_CLIENT_KEY and OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
_tls_said: set[str] = set()


def _check_tls(cfg: Config, rejected: list[str]) -> None:
    """The TLS files, checked together before any transport sees them. gRPC's C core aborts the
    whole process (SIGABRT, `Check failed: cert_chain != nullptr`) for a client key without its
    certificate or the reverse, and takes a file that is not PEM for a collector that is not
    reachable; the standard library's `ssl` raises with a traceback. Here each problem is said
    once, naming the settings, and the run goes on without what was wrong: the system's CA
    roots for a bad CA file, no client certificate for a bad or half-given pair."""
    import ssl

    problems: list[tuple[str, str, tuple[str, ...]]] = []
    if cfg.certificate:
        try:
            ssl.create_default_context(cafile=cfg.certificate)
        except (ssl.SSLError, OSError, ValueError):
            problems.append((_CA, "not a PEM file of CA certificates; TLS uses the system's CA roots",
                             ("certificate",)))
    key, chain = cfg.client_key, cfg.client_certificate
    if bool(key) != bool(chain):
        given, missing = ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")[::1 if key else -1]
        problems.append((_PAIR, f"mutual TLS needs both: {given} is set and {missing} is not; no client "
                                "certificate is presented", ("client_key", "client_certificate")))
    elif key and chain:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(chain, key, password=lambda: b"")
        except (ssl.SSLError, OSError, ValueError):
            problems.append((_PAIR, "not a PEM certificate chain and its unencrypted private key (or they "
                                    "do not match); no client certificate is presented",
                             ("client_key", "client_certificate")))
    for settings, why, fields in problems:
        for name in fields:
            setattr(cfg, name, None)
            rejected.append(name)
        if settings + why not in _tls_said:
            _tls_said.add(settings + why)
            _log.warning("otel_train: %s: %s.", settings, why)


def _compression(value: Any) -> str:
    return _one_of("none", "gzip")(value)


def _protocol(value: Any) -> str:
    text = value.strip().lower() if isinstance(value, str) else value
    if text == "http/json":
        # The OTLP exporters here speak grpc and http/protobuf only.
        raise _Invalid("expected grpc or http/protobuf (http/json is not available in Python)")
    if text not in ("grpc", "http/protobuf"):
        raise _Invalid("expected grpc or http/protobuf")
    return text


def _exporter(value: Any) -> str:
    # OTEL_TRACES_EXPORTER may list several; the first one we know wins.
    text = value.strip().lower() if isinstance(value, str) else value
    if not isinstance(text, str):
        raise _Invalid("expected one of auto, otlp, file, console, none")
    for name in (part.strip() for part in text.split(",")):
        if name in ("auto", "otlp", "file", "console", "none"):
            return name
    raise _Invalid("expected one of auto, otlp, file, console, none")


def _ranks(value: Any) -> str:
    try:
        return sampling.parse_ranks(value)
    except ValueError as err:
        raise _Invalid(str(err)) from None


def _device_timing(value: Any) -> str:
    if isinstance(value, bool):
        return "auto" if value else "off"
    text = value.strip().lower() if isinstance(value, str) else value
    if text in _TRUE:
        return "auto"
    if text in _FALSE:
        return "off"
    return _one_of("auto", "off")(text)


@dataclass
class _Spec:
    env: tuple[str, ...]
    parse: Callable[[Any], Any]
    #: Never printed (a header may hold a token): messages name the setting, not its value.
    secret: bool = False
    #: What a rejected value falls back to, when that is not simply the default.
    fallback: str | None = None


@dataclass
class Config:
    """Everything `otel_train.init()` can be told; docs/configuration.md documents each field."""

    disabled: bool = False
    """OTEL_SDK_DISABLED: when true every API call is a no-op and nothing is instrumented."""
    service_name: str = semconv.DEFAULT_SERVICE_NAME
    """OTEL_SERVICE_NAME: the `service.name` resource attribute."""
    run_id: str | None = None
    """OTEL_TRAIN_RUN_ID (after TORCHELASTIC_RUN_ID): shared by all ranks of one run; generated when unset."""
    role: str = semconv.ROLE_TRAINER
    """OTEL_TRAIN_ROLE: `trainer` or `inference` (the `ml.role` resource attribute)."""
    traces_exporter: str = "auto"
    """OTEL_TRACES_EXPORTER: auto (otlp when an endpoint is set, else file), otlp, file, console, none."""
    metrics_exporter: str = "auto"
    """OTEL_METRICS_EXPORTER: same choices as traces_exporter."""
    endpoint: str | None = None
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT: the OTLP receiver."""
    metrics_endpoint: str | None = None
    """OTEL_EXPORTER_OTLP_METRICS_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT."""
    protocol: str = "grpc"
    """OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL: grpc or http/protobuf."""
    output_dir: str = "otel-train"
    """OTEL_TRAIN_OUTPUT_DIR: where the embedded default writes `<run id>/traces-rank<R>.jsonl`."""
    device_timing: str = "auto"
    """OTEL_TRAIN_DEVICE_TIMING: auto (device events when the model is on an accelerator) or off."""
    span_time: str = "device"
    """OTEL_TRAIN_SPAN_TIME: where device-timed spans are drawn: device (the interval the device
    worked on them; a step between its device boundaries) or host (the host's dispatch)."""
    step_sample: int = 1
    """OTEL_TRAIN_STEP_SAMPLE: export the spans of every Nth step (metrics always see every step)."""
    step_spans: str = "auto"
    """OTEL_TRAIN_STEP_SPANS: whose train.step spans are exported: all (every rank's), sampled
    (rank 0's and the ranks OTEL_TRAIN_RANKS picks for the step), or auto: all up to 2,048 ranks,
    else sampled (10,240 ranks' step spans alone are ~10 MB a trace, past Tempo's 5 MB)."""
    ranks: str = sampling.DEFAULT
    """OTEL_TRAIN_RANKS: whose phase spans are exported: all, a rank list (0 or 0,8,16),
    first-per-node, or sample:K (K ranks a step, rotating, and rank 0). Step spans, their
    checkpoint / eval / GC siblings and metrics stay on for every rank (`wire/sampling.py`,
    docs/distributed.md)."""
    buffer_size: int = 65536
    """OTEL_TRAIN_BUFFER_SIZE: records the hot-path buffer holds before dropping the oldest (64 to
    4194304; a record is about 72 bytes). Also bounds what waits for a collector that is down."""
    export_mode: str = "process"
    """OTEL_TRAIN_EXPORT_MODE: process (a per-rank exporter process encodes and sends) or thread."""
    exporter_priority: str = "low"
    """OTEL_TRAIN_EXPORTER_PRIORITY: the exporter process's CPU priority. low (nice +10), idle
    (Linux SCHED_IDLE: it runs only on CPU time nothing else wants, so it can starve on a
    saturated node) or normal."""
    flush_interval_ms: int = 2000
    """OTEL_TRAIN_FLUSH_INTERVAL_MS: how often the worker drains the buffer (sooner while records
    arrive fast enough to fill a quarter of it in less). Each drain has a fixed cost in both
    processes, paid with cold caches: 2000 against 500 cut the exporter's CPU by 30 % on the
    ~20 ms benchmark step and 14 % on the ~2.5 ms one."""
    export_delay_ms: int = 5000
    """OTEL_BSP_SCHEDULE_DELAY: how long built spans may wait for an export call (sooner when a
    full request is ready), the SDK's default. Each call costs 0.4-1.4 ms of CPU: 5000 against
    2000 cut the exporter's CPU by 5-9 % on the ~20 ms benchmark step."""
    shutdown_timeout_s: float = 5.0
    """OTEL_TRAIN_SHUTDOWN_TIMEOUT_S: the bound on flush-and-stop at exit or SIGTERM."""
    attribute_value_limit: int = 2048
    """OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT: longer string attribute values are cut to this length."""
    export_batch_size: int = 2048
    """OTEL_BSP_MAX_EXPORT_BATCH_SIZE: the most spans per OTLP export request (the SDK's 512 is for
    its BatchSpanProcessor; each request costs about 0.3 ms of CPU, and pre-encoded requests are
    also cut at 1 MiB, well under the 4 MiB a collector's gRPC receiver accepts by default)."""
    export_timeout_s: float = 10.0
    """OTEL_EXPORTER_OTLP_TIMEOUT (ms in the environment): the bound on one export request."""
    metric_interval_ms: int = 10000
    """OTEL_METRIC_EXPORT_INTERVAL: how often metrics are exported."""
    headers: dict[str, str] | None = field(default=None, repr=False)
    """OTEL_EXPORTER_OTLP_HEADERS: `key=value,key2=value2` sent with every export (values never printed)."""
    certificate: str | None = None
    """OTEL_EXPORTER_OTLP_CERTIFICATE: the CA bundle (PEM) that verifies an https endpoint; the
    system's roots when unset."""
    client_key: str | None = None
    """OTEL_EXPORTER_OTLP_CLIENT_KEY: the private key (PEM) for mutual TLS."""
    client_certificate: str | None = None
    """OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: the certificate chain (PEM) for mutual TLS."""
    compression: str = "none"
    """OTEL_EXPORTER_OTLP_COMPRESSION: none or gzip."""
    flops_per_step: float | None = None
    """OTEL_TRAIN_FLOPS_PER_STEP: floating-point operations one rank computes in one optimizer step,
    for `train.mfu` (a step's `train.flops` attribute wins; unset: 6 x parameters x tokens when
    detection sees token batches)."""
    peak_flops: float | None = None
    """OTEL_TRAIN_PEAK_FLOPS: peak FLOP/s of one device, for `train.mfu` (unset: from the device's
    name, bf16 dense, `export/peak_flops.py`; on the CPU no MFU unless this is set)."""
    console_every: int = 0
    """OTEL_TRAIN_CONSOLE_EVERY: print one summary line on rank 0 every N steps (0: never)."""
    rejected: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """The fields given a value that was not valid (each said once): set by `resolve`, read where a
    fallback depends on it (an invalid endpoint sends to local files, never to the default one)."""

    def __post_init__(self) -> None:
        rejected = list(self.rejected)
        for name, spec in _SPECS.items():
            value = getattr(self, name)
            default = _DEFAULTS[name]
            if value is None or value == default:
                continue
            try:
                setattr(self, name, spec.parse(value))
            except _Invalid as err:
                _warn_invalid(spec.env[0] if spec.env else name, value, str(err), default, spec)
                setattr(self, name, default)
                rejected.append(name)
        _check_tls(self, rejected)
        self.rejected = tuple(dict.fromkeys(rejected))

    @classmethod
    def resolve(cls, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
        """Build the config: each field from `overrides`, else the environment, else its default."""
        environ = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(_SPECS))
        for key in unknown:
            _log.warning("otel_train: init() got an unknown setting %r; allowed settings: %s. It is ignored.",
                         key, ", ".join(sorted(_SPECS)))
            overrides.pop(key)
        values: dict[str, Any] = {}
        warned: set[str] = set()  # one variable can feed two fields: say it once
        rejected: list[str] = []
        for name, spec in _SPECS.items():
            if name in overrides and overrides[name] is not None:
                values[name] = _checked(name, spec, overrides[name], f"init({name}=...)", environ, warned, rejected)
                continue
            for var in spec.env:
                raw = environ.get(var)
                if raw is not None and raw.strip():
                    values[name] = _checked(name, spec, _env_value(var, raw), var, None, warned, rejected)
                    break
        return cls(**values, rejected=tuple(rejected))

    def as_environment(self, names: Iterable[str]) -> dict[str, str]:
        """The variables that make another process resolve the fields `names` to this config's
        values: each field's most specific variable (the one `resolve` reads first), its value
        written as that variable is read (`true`/`false`; headers as URL-encoded `key=value,...`).
        Fields that are None are left out. For the processes a run starts (`otel_train.ray`)."""
        out: dict[str, str] = {}
        for name in names:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, Mapping):
                text = ",".join(f"{urllib.parse.quote(str(k))}={urllib.parse.quote(str(v))}" for k, v in value.items())
            else:
                text = str(value)
            out[_SPECS[name].env[0]] = text
        return out


def _env_value(var: str, raw: str) -> str:
    if var in ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"):
        # The spec gives this one in milliseconds; the field holds seconds.
        try:
            return str(float(raw) / 1000.0)
        except ValueError:
            return raw
    return raw


def _checked(name: str, spec: _Spec, value: Any, source: str, environ: Mapping[str, str] | None,
             warned: set[str], rejected: list[str]) -> Any:
    """Parse one value; on failure warn naming `source` and fall back (to the env, then default)."""
    try:
        return spec.parse(value)
    except _Invalid as err:
        default = _DEFAULTS[name]
        rejected.append(name)
        if source not in warned:
            warned.add(source)
            _warn_invalid(source, value, str(err), default, spec)
        if environ is not None:
            for var in spec.env:
                raw = environ.get(var)
                if raw is not None and raw.strip():
                    return _checked(name, spec, _env_value(var, raw), var, None, warned, rejected)
        return default


def _warn_invalid(source: str, value: Any, why: str, default: Any, spec: _Spec | None = None) -> None:
    """The one message a bad setting gets: what, which value, what is allowed, what is used."""
    shown = ("(value not shown)" if spec is not None and spec.secret
             else repr(redact_url(value)) if isinstance(value, str) else repr(value))
    instead = spec.fallback if spec is not None and spec.fallback else f"using the default {default!r}"
    _log.warning("otel_train: %s=%s is not valid: %s; %s.", source, shown, why, instead)


_INVALID_ENDPOINT = "using the default: local files (the embedded default), never another endpoint"

_SPECS: dict[str, _Spec] = {
    "disabled": _Spec(("OTEL_SDK_DISABLED",), _parse_bool),
    "service_name": _Spec(("OTEL_SERVICE_NAME",), _text),
    "run_id": _Spec((semconv.ENV_RUN_ID,), _run_id),
    "role": _Spec((semconv.ENV_ROLE,), _one_of(semconv.ROLE_TRAINER, semconv.ROLE_INFERENCE)),
    "traces_exporter": _Spec(("OTEL_TRACES_EXPORTER",), _exporter),
    "metrics_exporter": _Spec(("OTEL_METRICS_EXPORTER",), _exporter),
    "endpoint": _Spec(("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"), _endpoint,
                      fallback=_INVALID_ENDPOINT),
    "metrics_endpoint": _Spec(("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
                              _endpoint, fallback=_INVALID_ENDPOINT),
    "protocol": _Spec(("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"), _protocol),
    "output_dir": _Spec((semconv.ENV_OUTPUT_DIR,), _text),
    "device_timing": _Spec((semconv.ENV_DEVICE_TIMING,), _device_timing),
    "span_time": _Spec((semconv.ENV_SPAN_TIME,), _one_of("device", "host")),
    "step_sample": _Spec((semconv.ENV_STEP_SAMPLE,), _int_at_least(1)),
    "ranks": _Spec((semconv.ENV_RANKS,), _ranks),
    "step_spans": _Spec((semconv.ENV_STEP_SPANS,), _one_of(*sampling.STEP_SPANS)),
    "buffer_size": _Spec((semconv.ENV_BUFFER_SIZE,), _int_between(64, BUFFER_MAX)),
    "export_mode": _Spec((semconv.ENV_EXPORT_MODE,), _one_of("process", "thread")),
    "exporter_priority": _Spec((semconv.ENV_EXPORTER_PRIORITY,), _one_of("low", "idle", "normal")),
    "flush_interval_ms": _Spec((semconv.ENV_FLUSH_INTERVAL,), _int_between(1, 10**9)),
    "export_delay_ms": _Spec(("OTEL_BSP_SCHEDULE_DELAY",), _int_between(0, 10**9)),
    "shutdown_timeout_s": _Spec((semconv.ENV_SHUTDOWN_TIMEOUT,), _float_above(0.0, SECONDS_MAX)),
    "attribute_value_limit": _Spec(("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",), _int_between(1, 1 << 24)),
    "export_batch_size": _Spec(("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",), _int_between(1, 1 << 20)),
    "export_timeout_s": _Spec(("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"),
                              _float_above(0.0, SECONDS_MAX)),
    "metric_interval_ms": _Spec(("OTEL_METRIC_EXPORT_INTERVAL",), _int_between(1, 86_400_000)),
    "headers": _Spec(("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"), _headers, secret=True),
    "certificate": _Spec(("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"),
                         _readable_file, fallback="TLS uses the system's CA roots"),
    "client_key": _Spec(("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY"), _readable_file,
                        fallback="no client certificate is presented"),
    "client_certificate": _Spec(("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                                 "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"), _readable_file,
                                fallback="no client certificate is presented"),
    "compression": _Spec(("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"), _compression),
    "flops_per_step": _Spec((semconv.ENV_FLOPS_PER_STEP,), _optional_float_above(0.0)),
    "peak_flops": _Spec((semconv.ENV_PEAK_FLOPS,), _optional_float_above(0.0)),
    "console_every": _Spec((semconv.ENV_CONSOLE_EVERY,), _int_between(0, 10**9)),
}
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Config) if f.name != "rejected"}
assert set(_SPECS) == set(_DEFAULTS), "every Config field needs a spec"


def env_names() -> dict[str, tuple[str, ...]]:
    """Field name -> the environment variables read for it (docs/configuration.md lists them all)."""
    return {name: spec.env for name, spec in _SPECS.items()}
