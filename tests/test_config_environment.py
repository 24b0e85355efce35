"""`Config.as_environment`: the one table from settings to variables also writes them, so a
process a run starts (a Ray actor: `otel_train.ray.runtime_env`) resolves the driver's values."""

from __future__ import annotations

import os

import pytest

from otel_train._config import Config

FIELDS = ("run_id", "service_name", "endpoint", "protocol", "headers", "disabled", "traces_exporter")


def test_another_process_resolves_the_same_values_from_the_variables_written() -> None:
    cfg = Config.resolve({"run_id": "r1", "service_name": "svc", "endpoint": "http://collector:4317",
                          "protocol": "http/protobuf", "headers": {"Authorization": "Bearer a,b=c"},
                          "traces_exporter": "otlp"}, environ={})
    env = cfg.as_environment(FIELDS)
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://collector:4317" and env["OTEL_SDK_DISABLED"] == "false"
    again = Config.resolve(environ=env)
    assert {name: getattr(again, name) for name in FIELDS} == {name: getattr(cfg, name) for name in FIELDS}
    assert again.headers == {"authorization": "Bearer a,b=c"}


@pytest.mark.parametrize("seconds", [2.5, 30.0, 0.0015])
def test_a_timeout_is_written_in_the_milliseconds_its_variable_is_read_in(seconds: float) -> None:
    """OTEL_EXPORTER_OTLP_*TIMEOUT is in milliseconds and the field in seconds: the one rule
    (`_Spec.env_ms`) both reads and writes it (written as seconds it came back 1000 times shorter)."""
    cfg = Config.resolve({"export_timeout_s": seconds}, environ={})
    env = cfg.as_environment(["export_timeout_s"])
    assert float(env["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"]) == pytest.approx(seconds * 1000)
    assert Config.resolve(environ=env).export_timeout_s == pytest.approx(seconds)


def test_a_ray_runtime_env_carries_the_drivers_headers_and_absolute_output_dir(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import otel_train
    from otel_train import ray

    monkeypatch.chdir(tmp_path)
    otel_train.init(run_id="driver", headers={"Authorization": "Bearer t"}, traces_exporter="none",
                    metrics_exporter="none", output_dir="runs", export_mode="thread")
    env_vars = ray.runtime_env()["env_vars"]
    actor = Config.resolve(environ=env_vars)
    assert actor.headers == {"authorization": "Bearer t"} and actor.run_id == "driver"
    assert actor.output_dir == os.path.join(str(tmp_path), "runs") and actor.role == "inference"
