"""Static checks of the OpenTelemetry Collector files in collector/ (no collector binary runs here).

No registry ships a collector binary and no Docker engine runs on the CI machine, so instead of
starting the stack this module reads the YAML and checks what the collector and compose would
refuse or silently get wrong:

* every component type and every configuration key exists in the pinned versions
  (tests/support/collector_keys.yaml, built from the components' sources at those tags);
* every pipeline references defined receivers/processors/exporters/connectors, every defined
  component is used, each connector is an exporter in one pipeline and a receiver in another
  (of the right signals), routing tables name real pipelines, persistent queues name an enabled
  storage extension, memory_limiter comes first and batch after tail_sampling;
* compose: images pinned, every published port bound to 127.0.0.1, and the ports agree across
  files (receiver ports published, exporters aimed at the ports Jaeger and Tempo listen on,
  Prometheus scraping the ports the collector serves, Grafana datasources on the right ports).

Each check returns a list of problems (strings); an empty list means the file passed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
SIGNALS = ("traces", "metrics", "logs", "profiles")
PIPELINE_KEYS = ("receivers", "processors", "exporters")
LOOPBACK = "127.0.0.1"
#: Ports the Jaeger all-in-one image listens on with its built-in config (cmd/jaeger/internal/
#: all-in-one.yaml at v2.20.0, JAEGER_LISTEN_HOST=0.0.0.0 in its Dockerfile): OTLP and the UI.
JAEGER_PORTS = {4317: "OTLP gRPC", 4318: "OTLP HTTP", 16686: "query UI/API"}
#: Prometheus listens on 9090 unless --web.listen-address says otherwise.
PROMETHEUS_PORT = 9090


class ConfigError(Exception):
    """A file that cannot be read as the collector would read it (e.g. a duplicated key)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicated keys (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"duplicated key {key!r} at line {key_node.start_mark.line + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str | Path) -> Any:
    return load_yaml_text(Path(path).read_text())


def merge(base: Any, overlay: Any) -> Any:
    """Merge two configs as the collector merges several --config files: maps key by key, the
    rest (lists included) replaced by the later file."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for key, value in overlay.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    return overlay


def component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


# --- configuration keys -----------------------------------------------------------------
def check_keys(value: Any, tree: Any, where: str, version: str) -> list[str]:
    """Problems with `value` against the allowed-key `tree` (format: tests/support/collector_keys.yaml)."""
    if tree is None or value is None:
        return []
    if isinstance(tree, list):
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [p for i, item in enumerate(value) for p in check_keys(item, tree[0], f"{where}[{i}]", version)]
    if not isinstance(value, dict):
        return [f"{where}: expected a mapping, got {type(value).__name__}"]
    problems: list[str] = []
    allowed = sorted(k for k in tree if not k.startswith("_") and k != "*")
    for key, sub in value.items():
        if isinstance(key, str) and not key.startswith("_") and key in tree:
            problems += check_keys(sub, tree[key], f"{where}.{key}", version)
        elif "*" in tree:
            problems += check_keys(sub, tree["*"], f"{where}.{key}", version)
        else:
            problems.append(f"{where}: unknown key {key!r} (allowed in {version}: {', '.join(allowed)})")
    return problems


def _components(cfg: Mapping[str, Any], kind: str) -> dict[str, Any]:
    section = cfg.get(kind) or {}
    return section if isinstance(section, dict) else {}


def check_components(cfg: Mapping[str, Any], table: Mapping[str, Any]) -> list[str]:
    """Every component type exists in the pinned collector, under its current name, with known keys."""
    version = f"collector {table['version']}"
    problems = [f"top level: unknown section {key!r} (allowed: {', '.join(KINDS + ('service',))})"
                for key in cfg if key not in KINDS + ("service",)]
    deprecated = table.get("deprecated_types", {})
    for kind in KINDS:
        for cid, conf in _components(cfg, kind).items():
            ctype = component_type(cid)
            if ctype in deprecated.get(kind, {}):
                problems.append(f"{kind}.{cid}: type {ctype!r} is a deprecated alias in {version}; "
                                f"use {deprecated[kind][ctype]!r}")
            elif ctype not in table[kind]:
                problems.append(f"{kind}.{cid}: no {kind[:-1]} type {ctype!r} in {version} (known here: "
                                f"{', '.join(sorted(table[kind]))})")
            else:
                problems += check_keys(conf, table[kind][ctype], f"{kind}.{cid}", version)
    problems += check_keys(cfg.get("service"), table["service"], "service", version)
    return problems


# --- pipelines ----------------------------------------------------------------------------
def _pipelines(cfg: Mapping[str, Any]) -> dict[str, dict[str, list[str]]]:
    pipelines = (cfg.get("service") or {}).get("pipelines") or {}
    return {pid: {k: list((p or {}).get(k) or []) for k in PIPELINE_KEYS} for pid, p in pipelines.items()}


def check_pipelines(cfg: Mapping[str, Any], table: Mapping[str, Any]) -> list[str]:
    """References between pipelines and components, connectors, extensions and processor order."""
    problems: list[str] = []
    service = cfg.get("service") or {}
    raw = service.get("pipelines") or {}
    if not raw:
        problems.append("service.pipelines: no pipeline defined")
    pipelines = _pipelines(cfg)
    defined = {kind: set(_components(cfg, kind)) for kind in KINDS}
    for pid, body in raw.items():
        if component_type(pid) not in SIGNALS:
            problems.append(f"service.pipelines.{pid}: unknown signal {component_type(pid)!r} "
                            f"(allowed: {', '.join(SIGNALS)})")
        for key in body or {}:
            if key not in PIPELINE_KEYS:
                problems.append(f"service.pipelines.{pid}: unknown key {key!r} (allowed: {', '.join(PIPELINE_KEYS)})")
    for pid, p in pipelines.items():
        where = f"service.pipelines.{pid}"
        for key in ("receivers", "exporters"):
            if not p[key]:
                problems.append(f"{where}: no {key}")
        for key in PIPELINE_KEYS:
            dupes = sorted({c for c in p[key] if p[key].count(c) > 1})
            if dupes:
                problems.append(f"{where}.{key}: listed twice: {', '.join(dupes)}")
        for r in p["receivers"]:
            if r not in defined["receivers"] | defined["connectors"]:
                problems.append(f"{where}: receiver {r!r} is not defined under receivers or connectors")
        for x in p["processors"]:
            if x not in defined["processors"]:
                problems.append(f"{where}: processor {x!r} is not defined under processors")
        for e in p["exporters"]:
            if e not in defined["exporters"] | defined["connectors"]:
                problems.append(f"{where}: exporter {e!r} is not defined under exporters or connectors")
        problems += _processor_order(where, p["processors"])
    used = {key: {c for p in pipelines.values() for c in p[key]} for key in PIPELINE_KEYS}
    for kind in ("receivers", "processors", "exporters"):
        for cid in sorted(defined[kind] - used[kind]):
            problems.append(f"{kind}.{cid}: defined but used by no pipeline")
    enabled = list(service.get("extensions") or [])
    for ext in enabled:
        if ext not in defined["extensions"]:
            problems.append(f"service.extensions: {ext!r} is not defined under extensions")
    for ext in sorted(defined["extensions"] - set(enabled)):
        problems.append(f"extensions.{ext}: defined but not listed in service.extensions")
    problems += _check_connectors(cfg, pipelines, table)
    problems += _check_queue_storage(cfg, enabled, table)
    return problems


def _processor_order(where: str, processors: list[str]) -> list[str]:
    problems = []
    types = [component_type(x) for x in processors]
    if "memory_limiter" in types and types[0] != "memory_limiter":
        problems.append(f"{where}: memory_limiter must be the first processor (it is #{types.index('memory_limiter') + 1})")
    if "tail_sampling" in types and "batch" in types and types.index("batch") < types.index("tail_sampling"):
        problems.append(f"{where}: batch must come after tail_sampling (sampling regroups spans by trace)")
    return problems


def _check_connectors(cfg: Mapping[str, Any], pipelines: dict[str, dict[str, list[str]]],
                      table: Mapping[str, Any]) -> list[str]:
    problems = []
    for cid, conf in _components(cfg, "connectors").items():
        as_exporter = [pid for pid, p in pipelines.items() if cid in p["exporters"]]
        as_receiver = [pid for pid, p in pipelines.items() if cid in p["receivers"]]
        if not as_exporter:
            problems.append(f"connectors.{cid}: not used as an exporter in any pipeline")
        if not as_receiver:
            problems.append(f"connectors.{cid}: not used as a receiver in any pipeline")
        spec = table["connectors"].get(component_type(cid)) or {}
        rule = spec.get("_signals", "same")
        in_signals = {component_type(pid) for pid in as_exporter}
        out_signals = {component_type(pid) for pid in as_receiver}
        if rule == "same":
            for sig in sorted(in_signals ^ out_signals):
                problems.append(f"connectors.{cid}: connects {sig} only on one side (it passes a signal through unchanged)")
        elif "->" in rule:
            src, dst = rule.split("->")
            for sig in sorted(in_signals - {src}):
                problems.append(f"connectors.{cid}: exporter in a {sig} pipeline; it takes only {src}")
            for sig in sorted(out_signals - {dst}):
                problems.append(f"connectors.{cid}: receiver in a {sig} pipeline; it produces only {dst}")
        if component_type(cid) == "routing" and isinstance(conf, dict):
            problems += _check_routes(cid, conf, pipelines, as_receiver)
    return problems


def _check_routes(cid: str, conf: Mapping[str, Any], pipelines: dict[str, dict[str, list[str]]],
                  as_receiver: list[str]) -> list[str]:
    problems = []
    routed: list[str] = list(conf.get("default_pipelines") or [])
    for i, route in enumerate(conf.get("table") or []):
        if not (route.get("condition") or route.get("statement")):
            problems.append(f"connectors.{cid}.table[{i}]: needs a condition or a statement")
        routed += list(route.get("pipelines") or [])
    for pid in routed:
        if pid not in pipelines:
            problems.append(f"connectors.{cid}: routes to pipeline {pid!r}, which is not defined")
        elif pid not in as_receiver:
            problems.append(f"connectors.{cid}: routes to pipeline {pid!r}, which does not list {cid!r} as a receiver")
    for pid in as_receiver:
        if pid not in routed:
            problems.append(f"connectors.{cid}: pipeline {pid!r} receives from it but no route leads there")
    return problems


def _check_queue_storage(cfg: Mapping[str, Any], enabled: list[str], table: Mapping[str, Any]) -> list[str]:
    problems = []
    extensions = _components(cfg, "extensions")
    for cid, conf in _components(cfg, "exporters").items():
        storage = ((conf or {}).get("sending_queue") or {}).get("storage") if isinstance(conf, dict) else None
        if storage is None:
            continue
        spec = table["extensions"].get(component_type(storage)) or {}
        if storage not in extensions:
            problems.append(f"exporters.{cid}.sending_queue.storage: extension {storage!r} is not defined")
        elif not spec.get("_storage"):
            problems.append(f"exporters.{cid}.sending_queue.storage: {storage!r} is not a storage extension")
        elif storage not in enabled:
            problems.append(f"exporters.{cid}.sending_queue.storage: {storage!r} is not in service.extensions")
    return problems


def check_collector(cfg: Mapping[str, Any], table: Mapping[str, Any]) -> list[str]:
    """All collector checks for one (possibly merged) configuration."""
    if not isinstance(cfg, dict):
        return ["the file is not a mapping"]
    return check_components(cfg, table) + check_pipelines(cfg, table)


# --- endpoints and compose ----------------------------------------------------------------
def split_endpoint(endpoint: str) -> tuple[str, int]:
    """("host", port) of "host:port", "http://host:port/path" or "[::1]:port"."""
    rest = re.sub(r"^[a-z]+://", "", str(endpoint)).split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def published_ports(service: Mapping[str, Any]) -> Iterator[tuple[str | None, int | None, int, str]]:
    """(host ip or None, host port, container port, as written) for each entry of `ports`."""
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            host_port = entry.get("published")
            yield entry.get("host_ip"), int(host_port) if host_port else None, int(entry["target"]), str(entry)
            continue
        text = str(entry)
        parts = text.split("/", 1)[0]
        ip, host, container = None, None, parts
        if parts.startswith("["):                       # [::1]:port:port
            ip, _, rest = parts[1:].partition("]:")
            host, _, container = rest.partition(":")
        elif parts.count(":") == 2:
            ip, host, container = parts.split(":")
        elif parts.count(":") == 1:
            host, container = parts.split(":")
        yield ip, int(host) if host else None, int(container), text


def check_published_ports(compose: Mapping[str, Any]) -> list[str]:
    problems = []
    for name, service in (compose.get("services") or {}).items():
        for ip, _, _, text in published_ports(service):
            if ip != LOOPBACK:
                problems.append(f"services.{name}.ports: {text!r} is published on {ip or 'all interfaces'}; "
                                f"bind it to {LOOPBACK}")
    return problems


def check_images(compose: Mapping[str, Any], pins: Mapping[str, str]) -> list[str]:
    """Every image carries an explicit version tag (not latest); pinned images use the checked version."""
    problems = []
    for name, service in (compose.get("services") or {}).items():
        image = str(service.get("image") or "")
        repo, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
        if not tag or tag == "latest":
            problems.append(f"services.{name}.image: {image!r} has no pinned version tag")
        for pinned_repo, pinned in pins.items():
            if repo == pinned_repo and tag != pinned:
                problems.append(f"services.{name}.image: {image!r}, but the configs are checked against "
                                f"{pinned_repo}:{pinned}")
    return problems


def _service_using(compose: Mapping[str, Any], image_repo: str) -> tuple[str, Mapping[str, Any]]:
    for name, service in (compose.get("services") or {}).items():
        if str(service.get("image", "")).startswith(image_repo + ":"):
            return name, service
    raise ConfigError(f"no service runs {image_repo}")


def _container_ports(service: Mapping[str, Any]) -> set[int]:
    return {container for _, _, container, _ in published_ports(service)}


def _receiver_ports(collector: Mapping[str, Any]) -> dict[str, int]:
    ports = {}
    for cid, conf in _components(collector, "receivers").items():
        for proto, proto_conf in ((conf or {}).get("protocols") or {}).items():
            if proto_conf and proto_conf.get("endpoint"):
                ports[f"receivers.{cid}.protocols.{proto}"] = split_endpoint(proto_conf["endpoint"])[1]
    return ports


def _self_metrics_port(collector: Mapping[str, Any]) -> int | None:
    readers = ((((collector.get("service") or {}).get("telemetry") or {}).get("metrics") or {}).get("readers") or [])
    for reader in readers:
        prom = (((reader or {}).get("pull") or {}).get("exporter") or {}).get("prometheus")
        if prom and prom.get("port"):
            return int(prom["port"])
    return None


def backend_ports(tempo: Mapping[str, Any]) -> dict[str, dict[int, str]]:
    """What each backend service listens on inside the compose network, from its own config."""
    otlp = ((tempo.get("distributor") or {}).get("receivers") or {}).get("otlp", {}).get("protocols", {})
    tempo_ports = {split_endpoint(v["endpoint"])[1]: f"OTLP {k}" for k, v in otlp.items() if v and v.get("endpoint")}
    tempo_ports[int((tempo.get("server") or {}).get("http_listen_port", 3200))] = "HTTP API"
    return {"tempo": tempo_ports, "jaeger": dict(JAEGER_PORTS), "prometheus": {PROMETHEUS_PORT: "HTTP API"}}


def check_compose_ports(compose: Mapping[str, Any], collector: Mapping[str, Any], tempo: Mapping[str, Any],
                        prometheus: Mapping[str, Any], datasources: Mapping[str, Any],
                        collector_image: str) -> list[str]:
    """The ports agree across compose, the collector, Tempo, Prometheus and Grafana."""
    problems: list[str] = []
    services = compose.get("services") or {}
    name, collector_service = _service_using(compose, collector_image)
    published = _container_ports(collector_service)
    for where, port in _receiver_ports(collector).items():
        if port not in published:
            problems.append(f"{where} listens on {port}, which services.{name} does not publish")
    listening = backend_ports(tempo)
    for cid, conf in _components(collector, "exporters").items():
        if component_type(cid) not in ("otlp_grpc", "otlp_http") or not (conf or {}).get("endpoint"):
            continue
        host, port = split_endpoint(conf["endpoint"])
        if host not in services:
            problems.append(f"exporters.{cid}.endpoint: {host!r} is not a compose service")
        elif port not in listening.get(host, {}):
            problems.append(f"exporters.{cid}.endpoint: {host} listens on {sorted(listening.get(host, {}))}, not {port}")
    served = {}
    for cid, conf in _components(collector, "exporters").items():
        if component_type(cid) == "prometheus" and (conf or {}).get("endpoint"):
            served[split_endpoint(conf["endpoint"])[1]] = f"exporters.{cid}"
    self_port = _self_metrics_port(collector)
    if self_port is not None:
        served[self_port] = "service.telemetry.metrics"
    scraped = set()
    for job in prometheus.get("scrape_configs") or []:
        for static in job.get("static_configs") or []:
            for target in static.get("targets") or []:
                host, port = split_endpoint(target)
                if host == name:
                    scraped.add(port)
                    if port not in served:
                        problems.append(f"prometheus job {job.get('job_name')!r} scrapes {target}, but the collector "
                                        f"serves metrics on {sorted(served)}")
                elif host not in services:
                    problems.append(f"prometheus job {job.get('job_name')!r} scrapes {target}: not a compose service")
    for port, what in served.items():
        if port not in scraped:
            problems.append(f"{what} serves metrics on {port}, which no Prometheus job scrapes")
    for ds in datasources.get("datasources") or []:
        host, port = split_endpoint(ds["url"])
        if host not in services:
            problems.append(f"grafana datasource {ds.get('name')!r}: {host!r} is not a compose service")
        elif port not in listening.get(host, {}):
            problems.append(f"grafana datasource {ds.get('name')!r}: {host} listens on "
                            f"{sorted(listening.get(host, {}))}, not {port}")
    return problems


def check_mounts(compose: Mapping[str, Any], base_dir: Path) -> list[str]:
    """Bind-mounted files exist; every --config the collector is given is mounted."""
    problems = []
    for name, service in (compose.get("services") or {}).items():
        mounted = set()
        for volume in service.get("volumes") or []:
            source, _, target = str(volume).partition(":")
            target = target.split(":", 1)[0]
            mounted.add(target)
            if source.startswith((".", "/")) and not (base_dir / source).exists():
                problems.append(f"services.{name}.volumes: {source!r} does not exist next to the compose file")
        for arg in service.get("command") or []:
            if str(arg).startswith("--config=") and str(arg).split("=", 1)[1] not in mounted:
                problems.append(f"services.{name}.command: {arg!r} is not a mounted file")
    return problems


def check_tempo(tempo: Mapping[str, Any], table: Mapping[str, Any]) -> list[str]:
    return check_keys(tempo, table["keys"], "tempo", f"Tempo {table['version']}")


# --- names the configs rely on ------------------------------------------------------------
_ATTR_REF = re.compile(r'attributes\["([^"]+)"\]')
_SPAN_NAME_REF = re.compile(r'(?:span\.)?name == "([^"]+)"')


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def referenced_names(cfg: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(attribute keys, span names) that routing, sampling and spanmetrics rules rely on."""
    attrs: set[str] = set()
    names: set[str] = set()
    for text in _strings(cfg):
        attrs.update(_ATTR_REF.findall(text))
        names.update(_SPAN_NAME_REF.findall(text))
    for conf in _components(cfg, "processors").values():
        for policy in (conf or {}).get("policies") or []:
            for kind in ("boolean_attribute", "string_attribute", "numeric_attribute"):
                if (policy.get(kind) or {}).get("key"):
                    attrs.add(policy[kind]["key"])
    for cid, conf in _components(cfg, "connectors").items():
        if component_type(cid) == "spanmetrics":
            attrs.update(d["name"] for d in (conf or {}).get("dimensions") or [])
    return attrs, names
