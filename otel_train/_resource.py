"""The resource attributes of this process: what the SDK's detectors would say, then ours.

Computed at `init()` on the training thread, so without importing the SDK (which costs
~0.1-0.2 s there): the same keys the SDK's `OTELResourceDetector`, `ProcessResourceDetector`
and host detector produce (`telemetry.sdk.*`, `process.*`, `host.*`, OTEL_RESOURCE_ATTRIBUTES),
then `service.name` and the `ml.*` attributes of `RunInfo`. The command line's arguments are
never included (`process.command_args`, `process.command_line`): an argument may carry a token
(docs/security.md); `process.command` is only the script or program (argv[0]).
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import sys
import urllib.parse
from collections.abc import Mapping
from typing import Any

from otel_train import semconv
from otel_train._config import Config
from otel_train._distributed import RunInfo

_log = logging.getLogger("otel_train")


def _owner() -> str | None:
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError, OSError):
        return None


def _host_id() -> str | None:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, encoding="ascii") as f:
                found = f.read().strip()
            if found:
                return found
        except OSError:
            continue
    return None


def process_attributes() -> dict[str, Any]:
    """`telemetry.sdk.*`, `process.*` (no arguments) and `host.*`, as the SDK's detectors name them."""
    # telemetry.sdk.version is the exporter's to add (`pipeline.versions`): looking it up costs ~50 ms.
    attrs: dict[str, Any] = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
                             "process.runtime.description": sys.version,
                             "process.runtime.name": sys.implementation.name,
                             "process.runtime.version": platform.python_version(),
                             "process.pid": os.getpid(), "process.executable.name": os.path.basename(sys.executable),
                             "process.executable.path": sys.executable,
                             "process.command": sys.argv[0] if sys.argv and sys.argv[0] else sys.executable,
                             "process.parent_pid": os.getppid(), "process.owner": _owner(),
                             "host.name": socket.gethostname(), "host.arch": platform.machine(), "host.id": _host_id()}
    return {k: v for k, v in attrs.items() if v not in (None, "")}


def from_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES: `key=value,...`, values percent-decoded (the specification's format)."""
    environ = os.environ if environ is None else environ
    raw = environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    out: dict[str, str] = {}
    for index, item in enumerate(raw.split(",") if raw.strip() else (), 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _log.warning("otel_train: OTEL_RESOURCE_ATTRIBUTES item %d is not key=value; it is ignored.", index)
            continue
        out[key.strip()] = urllib.parse.unquote(value.strip())
    return out


def build(cfg: Config, run: RunInfo, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This process's resource attributes."""
    environ = os.environ if environ is None else environ
    attrs = process_attributes()
    attrs.update(from_environment(environ))
    # OTEL_SERVICE_NAME (or init(service_name=...)) beats a service.name in OTEL_RESOURCE_ATTRIBUTES,
    # which beats our default.
    if cfg.service_name != semconv.DEFAULT_SERVICE_NAME or environ.get("OTEL_SERVICE_NAME") or \
            semconv.SERVICE_NAME not in attrs:
        attrs[semconv.SERVICE_NAME] = cfg.service_name
    attrs.update(run.resource_attributes())
    return attrs
