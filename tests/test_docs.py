"""The README documents every name the package emits and every setting it reads."""

from __future__ import annotations

from pathlib import Path

from otel_train import semconv
from otel_train._config import env_names

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
#: The README and the reference pages under docs/ (the names of a subsystem may live in its page).
DOCS = README + "".join(p.read_text() for p in sorted((Path(__file__).resolve().parent.parent / "docs").glob("*.md")))


def test_readme_lists_every_environment_variable() -> None:
    missing = sorted({var for names in env_names().values() for var in names} - set(README.split("`")))
    assert not missing, missing


def test_readme_lists_every_span_metric_and_resource_name() -> None:
    names = [value for key, value in vars(semconv).items()
             if key.startswith(("SPAN_", "METRIC_", "ML_", "TRAIN_", "DEVICE_", "COMM_", "INFER_"))
             and isinstance(value, str) and key not in ("ML_PARALLEL_PREFIX", "METRIC_ATTR_PHASE",
                                                        "METRIC_ATTR_REASON")]
    missing = sorted(n for n in names if f"`{n}`" not in DOCS)
    assert not missing, missing


def test_readme_has_the_two_commands_and_ci_runs_the_test_one() -> None:
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    test_command = 'pip install torch==2.13.0 -e ".[test,lightning,hf]" && python -m pytest -q'
    assert test_command in README and test_command in ci
    assert "pip install torch==2.13.0 -e . && python examples/quickstart.py" in README
