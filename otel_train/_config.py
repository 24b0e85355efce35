"""Configuration: one dataclass; explicit argument > environment variable > default.

Every field may arrive as a string (from the environment) or as a typed value (from
`otel_train.init(**overrides)`). `__post_init__` parses each one; an invalid value logs one
message naming the setting, the value (never a header's: it may hold a token) and what is
allowed, and falls back to the default, so a typo never stops a training run. Resolved once
in the training process; the exporter process receives the resolved object, never parses
again. docs/configuration.md lists every variable. This module is the table (`_SPECS`: each
field's variables and parser) and how it is read; what each kind of value accepts is
`_config_values`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_train import _config_values as values
from otel_train import semconv
from otel_train.wire import sampling

_log = logging.getLogger("otel_train")

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


@dataclass
class _Spec:
    env: tuple[str, ...]
    parse: Callable[[Any], Any]
    #: Never printed (a header may hold a token): messages name the setting, not its value.
    secret: bool = False
    #: What a rejected value falls back to, when that is not simply the default.
    fallback: str | None = None
    #: The variables give milliseconds where the field holds seconds (the OTLP timeouts).
    env_ms: bool = False


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
            except values.Invalid as err:
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
                    values[name] = _checked(name, spec, _env_value(spec, raw), var, None, warned, rejected)
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
            elif _SPECS[name].env_ms:
                ms = value * 1000.0
                text = str(int(ms)) if ms == int(ms) else repr(ms)
            else:
                text = str(value)
            out[_SPECS[name].env[0]] = text
        return out


def _env_value(spec: _Spec, raw: str) -> str:
    """A variable's text as the field's parser takes it (`as_environment` writes the reverse)."""
    if spec.env_ms:
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
    except values.Invalid as err:
        default = _DEFAULTS[name]
        rejected.append(name)
        if source not in warned:
            warned.add(source)
            _warn_invalid(source, value, str(err), default, spec)
        if environ is not None:
            for var in spec.env:
                raw = environ.get(var)
                if raw is not None and raw.strip():
                    return _checked(name, spec, _env_value(spec, raw), var, None, warned, rejected)
        return default


def _warn_invalid(source: str, value: Any, why: str, default: Any, spec: _Spec | None = None) -> None:
    """The one message a bad setting gets: what, which value, what is allowed, what is used."""
    shown = ("(value not shown)" if spec is not None and spec.secret
             else repr(values.redact_url(value)) if isinstance(value, str) else repr(value))
    instead = spec.fallback if spec is not None and spec.fallback else f"using the default {default!r}"
    _log.warning("otel_train: %s=%s is not valid: %s; %s.", source, shown, why, instead)


_INVALID_ENDPOINT = "using the default: local files (the embedded default), never another endpoint"

_SPECS: dict[str, _Spec] = {
    "disabled": _Spec(("OTEL_SDK_DISABLED",), values.boolean),
    "service_name": _Spec(("OTEL_SERVICE_NAME",), values.nonempty_text),
    "run_id": _Spec((semconv.ENV_RUN_ID,), values.run_id),
    "role": _Spec((semconv.ENV_ROLE,), values.one_of(semconv.ROLE_TRAINER, semconv.ROLE_INFERENCE)),
    "traces_exporter": _Spec(("OTEL_TRACES_EXPORTER",), values.exporter),
    "metrics_exporter": _Spec(("OTEL_METRICS_EXPORTER",), values.exporter),
    "endpoint": _Spec(("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"), values.endpoint_url,
                      fallback=_INVALID_ENDPOINT),
    "metrics_endpoint": _Spec(("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
                              values.endpoint_url, fallback=_INVALID_ENDPOINT),
    "protocol": _Spec(("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"), values.protocol),
    "output_dir": _Spec((semconv.ENV_OUTPUT_DIR,), values.nonempty_text),
    "device_timing": _Spec((semconv.ENV_DEVICE_TIMING,), values.device_timing),
    "span_time": _Spec((semconv.ENV_SPAN_TIME,), values.one_of("device", "host")),
    "step_sample": _Spec((semconv.ENV_STEP_SAMPLE,), values.int_at_least(1)),
    "ranks": _Spec((semconv.ENV_RANKS,), values.ranks),
    "step_spans": _Spec((semconv.ENV_STEP_SPANS,), values.one_of(*sampling.STEP_SPANS)),
    "buffer_size": _Spec((semconv.ENV_BUFFER_SIZE,), values.int_between(64, values.BUFFER_MAX)),
    "export_mode": _Spec((semconv.ENV_EXPORT_MODE,), values.one_of("process", "thread")),
    "exporter_priority": _Spec((semconv.ENV_EXPORTER_PRIORITY,), values.one_of("low", "idle", "normal")),
    "flush_interval_ms": _Spec((semconv.ENV_FLUSH_INTERVAL,), values.int_between(1, 10**9)),
    "export_delay_ms": _Spec(("OTEL_BSP_SCHEDULE_DELAY",), values.int_between(0, 10**9)),
    "shutdown_timeout_s": _Spec((semconv.ENV_SHUTDOWN_TIMEOUT,), values.float_above(0.0, values.SECONDS_MAX)),
    "attribute_value_limit": _Spec(("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",), values.int_between(1, 1 << 24)),
    "export_batch_size": _Spec(("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",), values.int_between(1, 1 << 20)),
    "export_timeout_s": _Spec(("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"),
                              values.float_above(0.0, values.SECONDS_MAX), env_ms=True),
    "metric_interval_ms": _Spec(("OTEL_METRIC_EXPORT_INTERVAL",), values.int_between(1, 86_400_000)),
    "headers": _Spec(("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"), values.header_list, secret=True),
    "certificate": _Spec(("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"),
                         values.readable_file, fallback="TLS uses the system's CA roots"),
    "client_key": _Spec(("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY"), values.readable_file,
                        fallback="no client certificate is presented"),
    "client_certificate": _Spec(("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                                 "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"), values.readable_file,
                                fallback="no client certificate is presented"),
    "compression": _Spec(("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"), values.compression),
    "flops_per_step": _Spec((semconv.ENV_FLOPS_PER_STEP,), values.optional_float_above(0.0)),
    "peak_flops": _Spec((semconv.ENV_PEAK_FLOPS,), values.optional_float_above(0.0)),
    "console_every": _Spec((semconv.ENV_CONSOLE_EVERY,), values.int_between(0, 10**9)),
}
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Config) if f.name != "rejected"}
assert set(_SPECS) == set(_DEFAULTS), "every Config field needs a spec"


def env_names() -> dict[str, tuple[str, ...]]:
    """Field name -> the environment variables read for it (docs/configuration.md lists them all)."""
    return {name: spec.env for name, spec in _SPECS.items()}
