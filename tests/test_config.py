"""Configuration: explicit argument > environment > default; every bad value gets one clear message."""

from __future__ import annotations

import logging

import pytest

from otel_train._config import Config, env_names

BAD_VALUES = [
    ("OTEL_SDK_DISABLED", "maybe", "disabled", "expected true or false"),
    ("OTEL_TRAIN_BUFFER_SIZE", "lots", "buffer_size", "expected an integer from 64 to 4194304"),
    ("OTEL_TRAIN_BUFFER_SIZE", "8", "buffer_size", "expected an integer from 64 to 4194304"),
    ("OTEL_TRAIN_BUFFER_SIZE", "99999999999", "buffer_size", "expected an integer from 64 to 4194304"),
    ("OTEL_TRAIN_STEP_SAMPLE", "0", "step_sample", "expected an integer >= 1"),
    ("OTEL_TRAIN_EXPORT_MODE", "fiber", "export_mode", "expected one of process, thread"),
    ("OTEL_TRAIN_DEVICE_TIMING", "sometimes", "device_timing", "expected one of auto, off"),
    ("OTEL_TRAIN_FLUSH_INTERVAL_MS", "-5", "flush_interval_ms", "expected an integer from 1 to 1000000000"),
    ("OTEL_TRAIN_SHUTDOWN_TIMEOUT_S", "soon", "shutdown_timeout_s", "expected a number > 0"),
    ("OTEL_TRAIN_SHUTDOWN_TIMEOUT_S", "nan", "shutdown_timeout_s", "expected a number > 0"),
    ("OTEL_TRAIN_ROLE", "critic", "role", "expected one of trainer, inference"),
    ("OTEL_TRACES_EXPORTER", "zipkin", "traces_exporter", "expected one of auto, otlp, file, console, none"),
    ("OTEL_METRICS_EXPORTER", "prometheus", "metrics_exporter", "expected one of auto, otlp, file, console, none"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317", "endpoint", "expected a URL"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://x:1", "endpoint", "scheme is http or https"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1", "endpoint", "expected a URL"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://", "endpoint", "expected a URL"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:notaport", "endpoint", "a port 1-65535"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:99999", "endpoint", "a port 1-65535"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd", "compression", "expected one of none, gzip"),
    ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/such/ca.pem", "certificate", "a readable file"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "protocol", "http/json is not available"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon", "protocol", "expected grpc or http/protobuf"),
    ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "0", "attribute_value_limit", "expected an integer from 1 to"),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "x", "export_batch_size", "expected an integer from 1 to"),
    ("OTEL_BSP_SCHEDULE_DELAY", "-5", "export_delay_ms", "expected an integer from 0 to"),
    ("OTEL_TRAIN_EXPORTER_PRIORITY", "high", "exporter_priority", "expected one of low, idle, normal"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "never", "export_timeout_s", "expected a number > 0"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "often", "metric_interval_ms", "expected an integer from 1 to"),
    ("OTEL_SERVICE_NAME", "   ", "service_name", None),  # blank = unset: silently the default
]


@pytest.mark.parametrize("var,value,field,why", BAD_VALUES)
def test_bad_environment_value_warns_once_and_falls_back(var: str, value: str, field: str, why: str | None,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        cfg = Config.resolve(environ={var: value})
    assert getattr(cfg, field) == getattr(Config(), field)
    messages = [r.getMessage() for r in caplog.records]
    if why is None:
        assert messages == []
        return
    assert len(messages) == 1, messages
    assert var in messages[0] and repr(value) in messages[0] and why in messages[0]
    assert "using the default" in messages[0] or "TLS uses the system's CA roots" in messages[0]


def test_every_field_is_read_from_some_variable() -> None:
    assert all(env_names()[name] for name in env_names())


def test_explicit_beats_environment_beats_default() -> None:
    env = {"OTEL_TRAIN_BUFFER_SIZE": "1000", "OTEL_SERVICE_NAME": "from-env", "OTEL_TRAIN_STEP_SAMPLE": "5"}
    cfg = Config.resolve({"buffer_size": 2000}, environ=env)
    assert cfg.buffer_size == 2000
    assert cfg.service_name == "from-env" and cfg.step_sample == 5
    assert cfg.flush_interval_ms == Config().flush_interval_ms


def test_bad_explicit_value_falls_back_to_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        cfg = Config.resolve({"buffer_size": "huge"}, environ={"OTEL_TRAIN_BUFFER_SIZE": "4096"})
    assert cfg.buffer_size == 4096
    (message,) = [r.getMessage() for r in caplog.records]
    assert "init(buffer_size=...)" in message and "'huge'" in message


def test_unknown_init_setting_is_named_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        cfg = Config.resolve({"bufer_size": 10}, environ={})
    assert cfg == Config()
    (message,) = [r.getMessage() for r in caplog.records]
    assert "'bufer_size'" in message and "buffer_size" in message


def test_signal_specific_variables_win_and_timeout_is_milliseconds() -> None:
    cfg = Config.resolve(environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4317",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "HTTP/Protobuf",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_SDK_DISABLED": "TRUE",
        "OTEL_TRACES_EXPORTER": "otlp,console",
    })
    assert cfg.endpoint == "http://traces:4317" and cfg.metrics_endpoint == "http://generic:4317"
    assert cfg.protocol == "http/protobuf" and cfg.export_timeout_s == 2.5
    assert cfg.disabled is True and cfg.traces_exporter == "otlp"


def test_direct_construction_validates_too(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        cfg = Config(step_sample=-1, device_timing=False)  # type: ignore[arg-type]
    assert cfg.step_sample == 1 and cfg.device_timing == "off"
    assert any("OTEL_TRAIN_STEP_SAMPLE" in r.getMessage() for r in caplog.records)


def test_bad_value_does_not_stop_the_run(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from support.harness import Harness

    import otel_train

    monkeypatch.setenv("OTEL_TRAIN_BUFFER_SIZE", "many")
    h = Harness()
    with otel_train.step():
        pass
    assert [s.name for s in h.finish()] == ["train.step"]


def test_an_invalid_endpoint_goes_to_local_files_never_to_the_default_endpoint() -> None:
    from otel_train._distributed import RunInfo
    from otel_train.export.destination import resolve

    for choice in ("auto", "otlp"):
        cfg = Config.resolve(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:99999",
                                      "OTEL_TRACES_EXPORTER": choice})
        traces, metrics = resolve(cfg, RunInfo(run_id="r"))
        assert (traces.kind, metrics.kind) == ("file", "file"), choice
    traces, _ = resolve(Config.resolve(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "https://[::1]:4317"}),
                        RunInfo(run_id="r"))
    assert (traces.kind, traces.target, traces.secure) == ("otlp", "[::1]:4317", True)


def test_a_malformed_header_is_dropped_and_never_printed(caplog: pytest.LogCaptureFixture) -> None:
    secret = "s3cr3t-token-value"
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        cfg = Config.resolve(environ={"OTEL_EXPORTER_OTLP_HEADERS": f"Authorization: Bearer {secret},x-team=ml%20ops"})
    assert cfg.headers == {"x-team": "ml ops"}
    (message,) = [r.getMessage() for r in caplog.records]
    assert "item 1 of 2" in message and secret not in message
    assert secret not in repr(cfg)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        Config.resolve({"headers": 42}, environ={})  # not even a wrong type is shown
    assert "42" not in caplog.records[-1].getMessage()


@pytest.mark.parametrize(("given", "used"), [("../../x", "_._.._x"), ("/abs/run", "_abs_run"), (".hidden", "_hidden"),
                                             ("run-1.a_b", "run-1.a_b")])
def test_a_run_id_is_one_directory_inside_the_output_directory(given: str, used: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        cfg = Config.resolve(environ={"OTEL_TRAIN_RUN_ID": given})
    assert cfg.run_id == used
    assert len(caplog.records) == (0 if given == used else 1)
