"""The resource: the training process's own attributes, then OTEL_RESOURCE_ATTRIBUTES and
OTEL_SERVICE_NAME as the SDK's `OTELResourceDetector` reads them, then `service.name` and the
run's `ml.*` attributes (`otel_train/_resource.py`)."""

from __future__ import annotations

import os

import pytest
from support.harness import Harness

from otel_train import _resource, semconv
from otel_train._config import Config
from otel_train._distributed import detect_run_info


def _build(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return _resource.build(Config.resolve(), detect_run_info("res", "train"))


def test_resource_attributes_are_percent_decoded_and_a_bad_item_is_skipped(monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    attrs = _build(monkeypatch, OTEL_RESOURCE_ATTRIBUTES="team=ml%20infra, cluster = east ,no-equals-sign")
    assert attrs["team"] == "ml infra" and attrs["cluster"] == "east"
    assert "no-equals-sign" in caplog.text  # the SDK's own warning names the item
    assert attrs["process.pid"] == os.getpid() and attrs[semconv.SERVICE_NAME] == semconv.DEFAULT_SERVICE_NAME


def test_service_name_from_the_variable_beats_resource_attributes_which_beat_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _build(monkeypatch, OTEL_RESOURCE_ATTRIBUTES="service.name=from-attrs")[semconv.SERVICE_NAME] == "from-attrs"
    assert _build(monkeypatch, OTEL_SERVICE_NAME="from-var")[semconv.SERVICE_NAME] == "from-var"


def test_the_runs_own_attributes_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    attrs = _build(monkeypatch, OTEL_RESOURCE_ATTRIBUTES="ml.run.id=forged,ml.rank=9")
    assert attrs["ml.run.id"] == "res" and attrs["ml.rank"] == 0


def test_the_pipeline_puts_the_training_processs_attributes_and_the_environments_on_every_span(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import otel_train

    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=ml%20infra")
    harness = Harness()
    with otel_train.step():
        pass
    (step,) = harness.finish()
    assert step.resource.attributes["team"] == "ml infra"
    assert step.resource.attributes["process.pid"] == os.getpid() and step.resource.attributes["ml.run.id"] == "test-run"
