"""Where spans and metrics go, decided once: OTLP (gRPC or HTTP), local files, the console, or nowhere.

`resolve(cfg, run)` turns the configuration into two `Destination`s (traces, metrics) in the
training process; the exporter process receives them as they are (`pipeline.Setup`) and
builds its senders from them (`exporters`), so the choice is written here and nowhere else.

- `auto` means OTLP when an endpoint is configured, else the embedded default: OTLP JSON
  files under `<output dir>/<run id>/` (`traces-rank<R>.jsonl`, `metrics-rank<R>.jsonl`; an
  inference actor's `traces-inference-<id>.jsonl`, `process_label`).
- An endpoint that was given but is not valid (`_config` said so) never falls back to the
  specification's default endpoint, where another local service may listen: it goes to the
  local files instead, so nothing is lost.

Light: imports neither the SDK nor gRPC (the training process imports it at `init()`).
"""

from __future__ import annotations

import time

import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from typing import Any

from otel_train import semconv
from otel_train._config import Config
from otel_train._config_values import redact_url, userinfo_auth
from otel_train._distributed import RunInfo

KINDS = ("otlp", "file", "console", "none")


@dataclass(frozen=True)
class Destination:
    """One signal's destination, resolved."""

    signal: str
    """`traces` or `metrics`."""
    kind: str
    """`otlp`, `file`, `console` or `none`."""
    protocol: str = "grpc"
    """`grpc` or `http/protobuf` (OTLP only)."""
    endpoint: str = ""
    """The endpoint as configured (or the specification's default), for messages: its user
    information, if any, redacted (`_config_values.redact_url`; sent as `headers`' Basic authorization)."""
    target: str = ""
    """gRPC: `host:port`; HTTP: the full URL of `/v1/<signal>`."""
    secure: bool = False
    """TLS (an `https` endpoint)."""
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """Sent with every request; never printed."""
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    compression: str = "none"
    timeout_s: float = 10.0
    """The bound on one request."""
    path: str = ""
    """The file (`file`)."""

    def describe(self) -> str:
        """What the closing line says it exported to."""
        if self.kind == "file":
            return self.path
        if self.kind == "otlp":
            return f"{self.endpoint} (OTLP {self.protocol})"
        return self.kind


def run_dir(cfg: Config, run: RunInfo) -> Path:
    """`<output dir>/<run id>`: the run id is a single safe path component (`_config_values.safe_run_id`)."""
    return Path(cfg.output_dir) / run.run_id


def process_label(run: RunInfo) -> str:
    """What names a process's files: `rank<R>` for a trainer; `<role>-<instance>` for another
    role (an inference actor has no rank of its own, and several may share a run directory)."""
    if run.role == semconv.ROLE_TRAINER:
        return f"rank{run.rank}-p{run.process}" if run.process else f"rank{run.rank}"
    return f"{run.role}-{run.instance_id.replace('-', '')[:12]}"


def default_endpoint(protocol: str) -> str:
    """The OTLP specification's default receiver for `protocol`."""
    return "http://localhost:4317" if protocol == "grpc" else "http://localhost:4318"


def _kind(choice: str, endpoint: str | None, endpoint_rejected: bool) -> str:
    if endpoint_rejected and choice in ("auto", "otlp"):
        return "file"  # said once by `_config`: never the default endpoint instead of a mistyped one
    if choice == "auto":
        return "otlp" if endpoint else "file"
    return choice


def resolve(cfg: Config, run: RunInfo) -> tuple[Destination, Destination]:
    """(traces, metrics)."""
    metrics_endpoint = cfg.metrics_endpoint or cfg.endpoint
    return (_resolve("traces", cfg, run, cfg.traces_exporter, cfg.endpoint, "endpoint" in cfg.rejected),
            _resolve("metrics", cfg, run, cfg.metrics_exporter, metrics_endpoint,
                     "metrics_endpoint" in cfg.rejected or ("endpoint" in cfg.rejected and not cfg.metrics_endpoint)))


def _resolve(signal: str, cfg: Config, run: RunInfo, choice: str, endpoint: str | None,
             rejected: bool) -> Destination:
    kind = _kind(choice, endpoint, rejected)
    if kind == "file":
        return Destination(signal, kind, path=str(run_dir(cfg, run) / f"{signal}-{process_label(run)}.jsonl"))
    if kind != "otlp":
        return Destination(signal, kind)
    endpoint = endpoint or default_endpoint(cfg.protocol)
    parts = urllib.parse.urlsplit(endpoint)
    secure = parts.scheme.lower() == "https"
    if cfg.protocol == "grpc":
        host = parts.hostname or "localhost"
        host = f"[{host}]" if ":" in host else host
        target = f"{host}:{parts.port or (443 if secure else 4317)}"
    else:
        target = endpoint if endpoint.rstrip("/").endswith(f"/v1/{signal}") else endpoint.rstrip("/") + f"/v1/{signal}"
    headers = dict(cfg.headers or {})
    auth = userinfo_auth(endpoint)
    if auth is not None:  # sent as Basic authentication; never printed (the endpoint shown is redacted)
        headers.setdefault("authorization", auth)
        if cfg.protocol != "grpc":
            target = urllib.parse.urlunsplit(urllib.parse.urlsplit(target)._replace(
                netloc=urllib.parse.urlsplit(target).netloc.rpartition("@")[2]))
    return Destination(signal, kind, cfg.protocol, redact_url(endpoint), target, secure, tuple(headers.items()),
                       cfg.certificate, cfg.client_key, cfg.client_certificate, cfg.compression,
                       cfg.export_timeout_s)


@dataclass(frozen=True)
class ExportSetup:
    """Everything the export pipeline is built from, resolved once in the training process and
    sent as it is (pickled) to the exporter process, which parses nothing again."""

    config: Config
    run: RunInfo
    resource: dict[str, Any]
    """The training process's own attributes (`_resource.process_attributes`, taken there without
    the SDK); the pipeline completes them (`_resource.build`)."""
    salt: int
    traces: Destination
    metrics: Destination
    init_ns: int
    """When `otel_train.init` ran (the recorder's wall clock): where the run's goodput window opens."""


def make_setup(cfg: Config, run: RunInfo, resource: dict[str, Any], salt: int,
               init_ns: int | None = None) -> ExportSetup:
    traces, metrics = resolve(cfg, run)
    return ExportSetup(cfg, run, dict(resource), salt, traces, metrics,
                       time.time_ns() if init_ns is None else init_ns)
