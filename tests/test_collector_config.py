"""collector/: the collector, compose, Tempo, Prometheus and Grafana files are consistent and use
only components and keys that exist in the pinned versions (no collector binary runs here).

The checks live in support/collector_check.py; the allowed keys, with their sources, in
support/collector_keys.yaml. The negative tests feed the checker broken variants of our own files and
assert it reports each fault, so a checker that passes everything fails here.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support import collector_check as cc
from otel_train import semconv
from support.otlp_receiver import OTLPReceiver
from support.procs import REPO, clean_env, run_python

COLLECTOR = REPO / "collector"
TABLE = cc.load_yaml(Path(__file__).parent / "support" / "collector_keys.yaml")
COLLECTOR_TABLE = TABLE["collector"]
BASE = "otel-collector.yaml"
OVERLAY = "tail-sampling.yaml"
SNIPPET = "existing-collector-snippet.yaml"
COLLECTOR_FILES = (BASE, OVERLAY, SNIPPET)
OTHER_FILES = ("compose.yaml", "compose.tail-sampling.yaml", "tempo.yaml", "prometheus.yaml", "grafana/datasources.yaml")
PINS = {"otel/opentelemetry-collector-contrib": COLLECTOR_TABLE["version"], "grafana/tempo": TABLE["tempo"]["version"]}


def load(name: str) -> Any:
    return cc.load_yaml(COLLECTOR / name)


def merged() -> dict[str, Any]:
    """otel-collector.yaml with tail-sampling.yaml on top, as `--config a --config b` loads them."""
    return cc.merge(load(BASE), load(OVERLAY))


def stack(compose: dict[str, Any] | None = None, collector: dict[str, Any] | None = None,
          tempo: dict[str, Any] | None = None, prometheus: dict[str, Any] | None = None) -> list[str]:
    return cc.check_compose_ports(compose or load("compose.yaml"), collector or load(BASE), tempo or load("tempo.yaml"),
                                  prometheus or load("prometheus.yaml"), load("grafana/datasources.yaml"),
                                  "otel/opentelemetry-collector-contrib")


# --- our files pass --------------------------------------------------------------------------
def test_every_yaml_in_collector_is_listed_and_parses() -> None:
    found = {str(p.relative_to(COLLECTOR)) for p in COLLECTOR.rglob("*.yaml")}
    assert found == set(COLLECTOR_FILES + OTHER_FILES)
    for name in found:
        assert isinstance(load(name), dict), name


@pytest.mark.parametrize("name", [BASE, SNIPPET])
def test_collector_config_is_valid_for_the_pinned_version(name: str) -> None:
    assert cc.check_collector(load(name), COLLECTOR_TABLE) == []


def test_tail_sampling_overlay_merged_on_the_base_is_valid() -> None:
    cfg = merged()
    assert cc.check_collector(cfg, COLLECTOR_TABLE) == []
    pipelines = cfg["service"]["pipelines"]
    # spanmetrics sees every span before sampling; the backends get the sampled ones only.
    assert "spanmetrics" in pipelines["traces"]["exporters"]
    assert "tail_sampling" in pipelines["traces/sampled"]["processors"]
    assert set(pipelines["traces/sampled"]["exporters"]) == {"otlp_grpc/jaeger", "otlp_grpc/tempo"}


def test_base_exporters_use_a_persistent_queue_and_retry() -> None:
    cfg = load(BASE)
    for cid in ("otlp_grpc/jaeger", "otlp_grpc/tempo"):
        exporter = cfg["exporters"][cid]
        assert exporter["sending_queue"]["storage"] == "file_storage/queue"
        assert exporter["retry_on_failure"]["enabled"] is True


def test_compose_stack_is_consistent_pinned_and_local_only() -> None:
    compose = load("compose.yaml")
    assert cc.check_published_ports(compose) == []
    assert cc.check_images(compose, PINS) == []
    assert cc.check_mounts(compose, COLLECTOR) == []
    assert stack() == []
    assert cc.check_tempo(load("tempo.yaml"), TABLE["tempo"]) == []


def test_compose_tail_sampling_override_loads_both_mounted_files() -> None:
    compose = cc.merge(load("compose.yaml"), load("compose.tail-sampling.yaml"))
    assert cc.check_mounts(compose, COLLECTOR) == []
    command = compose["services"]["otel-collector"]["command"]
    assert [arg.rsplit("/", 1)[-1] for arg in command] == ["otel-collector.yaml", "tail-sampling.yaml"]


def test_tempo_accepts_a_big_step_trace() -> None:
    tempo = load("tempo.yaml")
    assert tempo["overrides"]["defaults"]["global"]["max_bytes_per_trace"] >= 50_000_000  # default 5 MB


def test_rules_use_the_package_names() -> None:
    """Every attribute and span name a routing/sampling/spanmetrics rule relies on is one otel_train emits."""
    attribute_names = {v for k, v in vars(semconv).items() if k.isupper() and isinstance(v, str) and "." in v}
    span_names = {v for k, v in vars(semconv).items() if k.startswith("SPAN_") and isinstance(v, str)}
    for cfg in (merged(), load(SNIPPET)):
        attrs, names = cc.referenced_names(cfg)
        assert attrs and attrs <= attribute_names, attrs - attribute_names
        assert names <= span_names, names - span_names
    attrs, names = cc.referenced_names(merged())
    assert {semconv.ML_RUN_ID, semconv.TRAIN_STEP_TAGS, semconv.TRUNCATED} <= attrs
    assert names == {semconv.SPAN_STEP}


# --- the checker reports faults (each a one-line change to our own files) ---------------------
def _problems_after(edit: Any, name: str = BASE) -> list[str]:
    cfg = copy.deepcopy(load(name))
    edit(cfg)
    return cc.check_collector(cfg, COLLECTOR_TABLE)


def _one(problems: list[str], *words: str) -> None:
    assert any(all(w in p for w in words) for p in problems), problems


def test_checker_reports_an_undefined_processor() -> None:
    problems = _problems_after(lambda c: c["service"]["pipelines"]["traces"]["processors"].append("batch/missing"))
    _one(problems, "traces", "'batch/missing'", "not defined")


def test_checker_reports_an_unknown_key() -> None:
    problems = _problems_after(lambda c: c["processors"]["batch"].update(send_batch_max_bytes=1))
    _one(problems, "processors.batch", "unknown key 'send_batch_max_bytes'")
    problems = _problems_after(lambda c: c["exporters"]["otlp_grpc/tempo"]["sending_queue"].update(queue_sise=10))
    _one(problems, "exporters.otlp_grpc/tempo.sending_queue", "'queue_sise'")


def test_checker_reports_an_unknown_or_deprecated_component_type() -> None:
    def rename(cfg: dict[str, Any]) -> None:
        cfg["exporters"]["otlp/jaeger"] = cfg["exporters"].pop("otlp_grpc/jaeger")
        cfg["service"]["pipelines"]["traces"]["exporters"][0] = "otlp/jaeger"
    _one(_problems_after(rename), "'otlp' is a deprecated alias", "otlp_grpc")
    _one(_problems_after(lambda c: c["processors"].update(groupbytrace={})), "no processor type 'groupbytrace'")


def test_checker_reports_connector_misuse() -> None:
    problems = _problems_after(lambda c: c["service"]["pipelines"]["metrics"]["receivers"].remove("spanmetrics"))
    _one(problems, "connectors.spanmetrics", "not used as a receiver")
    problems = _problems_after(lambda c: c["service"]["pipelines"]["metrics"]["exporters"].append("spanmetrics"))
    _one(problems, "connectors.spanmetrics", "exporter in a metrics pipeline")
    problems = _problems_after(lambda c: c["connectors"]["routing/training_traces"]["table"][0].update(
        pipelines=["traces/nowhere"]), SNIPPET)
    _one(problems, "routes to pipeline 'traces/nowhere'", "not defined")


def test_checker_reports_queue_storage_and_processor_order_faults() -> None:
    problems = _problems_after(lambda c: c["service"]["extensions"].remove("file_storage/queue"))
    _one(problems, "sending_queue.storage", "not in service.extensions")
    problems = _problems_after(lambda c: c["service"]["pipelines"]["traces"]["processors"].reverse())
    _one(problems, "memory_limiter must be the first processor")


def test_checker_reports_a_duplicated_key() -> None:
    with pytest.raises(cc.ConfigError, match="duplicated key 'batch'"):
        cc.load_yaml_text("processors:\n  batch: {}\n  batch: {timeout: 1s}\n")


def test_checker_reports_ports_on_all_interfaces_and_unpinned_images() -> None:
    compose = load("compose.yaml")
    compose["services"]["otel-collector"]["ports"][0] = "0.0.0.0:4317:4317"
    compose["services"]["jaeger"]["ports"].append("14250:14250")
    compose["services"]["grafana"]["image"] = "grafana/grafana:latest"
    problems = cc.check_published_ports(compose) + cc.check_images(compose, PINS)
    _one(problems, "otel-collector", "'0.0.0.0:4317:4317'", "0.0.0.0")
    _one(problems, "jaeger", "'14250:14250'", "all interfaces")
    _one(problems, "grafana", "no pinned version")
    compose["services"]["otel-collector"]["image"] = "otel/opentelemetry-collector-contrib:0.150.0"
    _one(cc.check_images(compose, PINS), "checked against otel/opentelemetry-collector-contrib:0.156.0")


def test_checker_reports_ports_that_disagree_across_files() -> None:
    prometheus = load("prometheus.yaml")
    prometheus["scrape_configs"][0]["static_configs"][0]["targets"] = ["otel-collector:9464"]
    _one(stack(prometheus=prometheus), "scrapes otel-collector:9464")
    _one(stack(prometheus=prometheus), "exporters.prometheus serves metrics on 8889", "no Prometheus job")
    collector = load(BASE)
    collector["exporters"]["otlp_grpc/tempo"]["endpoint"] = "tempo:14250"
    _one(stack(collector=collector), "exporters.otlp_grpc/tempo.endpoint", "not 14250")
    collector = load(BASE)
    collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"] = "0.0.0.0:4319"
    _one(stack(collector=collector), "listens on 4319", "does not publish")
    tempo = load("tempo.yaml")
    tempo["overrides"]["defaults"]["global"]["max_bytes_per_tracee"] = 1
    _one(cc.check_tempo(tempo, TABLE["tempo"]), "unknown key 'max_bytes_per_tracee'")


# --- what the package really sends matches what the rules expect -------------------------------
def _quickstart_spans(receiver: OTLPReceiver) -> list[dict[str, Any]]:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.grpc_port}",
           "OTEL_TRAIN_RUN_ID": "collector-check", "OTEL_SERVICE_NAME": "otel-train"}
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "quickstart.py"), "--steps", "20"],
                          env=clean_env(env), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return receiver.wait_for_spans(lambda s: s["name"] == semconv.SPAN_STEP, count=20, timeout=30)


def test_quickstart_carries_every_name_the_rules_use(fresh_receiver: OTLPReceiver) -> None:
    _quickstart_spans(fresh_receiver)
    spans = fresh_receiver.spans()
    resource_keys = {k for s in spans for k in s["resource"]}
    span_keys = {k for s in spans for k in s["attributes"]}
    attrs, names = cc.referenced_names(merged())
    snippet_attrs, _ = cc.referenced_names(load(SNIPPET))
    # Routing and spanmetrics read ml.run.id / ml.role from the resource of every request.
    assert {semconv.ML_RUN_ID, semconv.ML_ROLE, semconv.SERVICE_NAME} <= resource_keys
    assert snippet_attrs <= resource_keys
    assert all(s["resource"][semconv.ML_RUN_ID] == "collector-check" for s in spans)
    # otel_train.truncated is set only on spans force-ended at death (tests/test_recorder.py).
    assert attrs - {semconv.TRUNCATED} <= resource_keys | span_keys
    assert names <= {s["name"] for s in spans}
    steps = [s for s in spans if s["name"] == semconv.SPAN_STEP]
    assert all(isinstance(s["attributes"][semconv.TRAIN_STEP], int) for s in steps)
    # A string array, which is why the sampling rule uses ContainsValue, not string_attribute.
    tagged = [s["attributes"][semconv.TRAIN_STEP_TAGS] for s in steps if semconv.TRAIN_STEP_TAGS in s["attributes"]]
    assert tagged and all(isinstance(t, list) and all(isinstance(x, str) for x in t) for t in tagged)


def test_a_step_tagged_slow_carries_it_in_the_tags_array(fresh_receiver: OTLPReceiver) -> None:
    run_python("""
        import otel_train
        otel_train.init()
        with otel_train.step(0):
            otel_train.tag("slow")
        otel_train.shutdown()
    """, env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{fresh_receiver.grpc_port}",
              "OTEL_TRAIN_RUN_ID": "collector-slow-tag"})
    (step,) = fresh_receiver.wait_for_spans(lambda s: s["name"] == semconv.SPAN_STEP, count=1, timeout=30)
    assert "slow" in step["attributes"][semconv.TRAIN_STEP_TAGS]
