"""The resource attributes of a training process: what the SDK's detectors say, then ours.

Two halves. `process_attributes()` runs at `init()` on the training thread, so without importing
the SDK (which costs ~0.1-0.2 s there): the keys the SDK's `ProcessResourceDetector` and host
detector produce (`telemetry.sdk.*`, `process.*`, `host.*`) for the training process. `build()`
runs where the pipeline is built (the exporter process, which inherits the trainer's
environment, or the worker thread), where the SDK is imported anyway: the SDK's own
`OTELResourceDetector` reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, then come
`service.name` and the `ml.*` attributes of `RunInfo`. The command line's arguments are never
included (`process.command_args`, `process.command_line`): an argument may carry a token
(docs/security.md); `process.command` is only the script or program (argv[0]).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from typing import Any

from otel_train import semconv
from otel_train._config import Config
from otel_train._distributed import RunInfo



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


def build(cfg: Config, run: RunInfo, process: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The resource: the training process's `process` attributes (this process's by default),
    then OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME as the SDK's `OTELResourceDetector`
    reads them, then `service.name`, then the run's `ml.*` attributes."""
    from opentelemetry.sdk.resources import OTELResourceDetector

    attrs = dict(process_attributes() if process is None else process)
    detected = dict(OTELResourceDetector().detect().attributes)
    attrs.update(detected)
    # init(service_name=...) or OTEL_SERVICE_NAME beats a service.name in OTEL_RESOURCE_ATTRIBUTES,
    # which beats our default.
    if cfg.service_name != semconv.DEFAULT_SERVICE_NAME or os.environ.get("OTEL_SERVICE_NAME") or \
            semconv.SERVICE_NAME not in detected:
        attrs[semconv.SERVICE_NAME] = cfg.service_name
    attrs.update(run.resource_attributes())
    return attrs
