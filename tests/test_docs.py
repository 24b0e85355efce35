"""The docs against the code: every name, setting and command they must list, every link they make."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from otel_train import semconv
from otel_train._config import Config, env_names
from otel_train.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "collector" / "README.md", ROOT / "benchmarks" / "README.md",
            *sorted(DOCS.rglob("*.md"))]


def _config_rows() -> dict[str, list[str]]:
    """docs/configuration.md's table rows, by the variable in their first cell."""
    rows = {}
    for line in (DOCS / "configuration.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 4:
            rows[cells[0].strip("`")] = cells
    return rows


def test_readme_is_short() -> None:
    assert len(README.splitlines()) <= 250


def test_configuration_lists_every_environment_variable() -> None:
    rows = _config_rows()
    missing = sorted({var for names in env_names().values() for var in names} - set(rows))
    assert not missing, missing


def test_configuration_gives_each_setting_its_default() -> None:
    rows = _config_rows()
    for field in dataclasses.fields(Config):
        if field.name not in env_names():
            continue  # bookkeeping, not a setting (`rejected`: which settings were invalid)
        default = field.default
        if default is None:
            expected = {"—", "generated"}
        elif isinstance(default, bool):
            expected = {f"`{str(default).lower()}`"}
        elif field.name == "export_timeout_s":  # milliseconds in the environment
            expected = {f"`{int(default * 1000)}`"}
        elif isinstance(default, float) and default.is_integer():
            expected = {f"`{int(default)}`"}
        else:
            expected = {f"`{default}`"}
        var = env_names()[field.name][-1]  # the generic variable: its row carries the default
        assert rows[var][1] in expected, (field.name, var, rows[var][1], expected)
        assert f"`{field.name}`" in rows[var][-1], (field.name, rows[var][-1])


def test_readme_settings_are_real_settings() -> None:
    known = {var for names in env_names().values() for var in names}
    in_readme = set(re.findall(r"`(OTEL_[A-Z_]+)", README))
    assert in_readme and in_readme <= known, sorted(in_readme - known)


def test_trace_shape_lists_every_span_metric_and_resource_name() -> None:
    # a subsystem's metrics may live in its own page (docs/metrics.md: goodput, MFU, memory)
    text = (DOCS / "trace-shape.md").read_text() + (DOCS / "metrics.md").read_text()
    names = [value for key, value in vars(semconv).items()
             if key.startswith(("SPAN_", "METRIC_", "ML_", "TRAIN_", "DEVICE_", "COMM_", "INFER_", "SERVICE_"))
             and isinstance(value, str) and key not in ("ML_PARALLEL_PREFIX", "METRIC_ATTR_PHASE",
                                                        "METRIC_ATTR_REASON", "METRIC_ATTR_CATEGORY")]
    names += [semconv.TRUNCATED, semconv.ERROR_TYPE, semconv.METRIC_ATTR_PHASE, semconv.METRIC_ATTR_REASON,
              semconv.METRIC_ATTR_CATEGORY]
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, missing


def test_readme_has_the_two_commands_and_ci_runs_the_test_one() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = 'pip install torch==2.13.0 -e ".[test,lightning,hf]" && python -m pytest -q'
    assert test_command in README and test_command in ci
    assert "pip install torch==2.13.0 -e . && python examples/quickstart.py" in README


def test_readme_names_every_cli_command_and_no_other() -> None:
    named = set(re.findall(r"`otel-train ([a-z]+)", README))
    assert named == set(COMMANDS), (sorted(named), sorted(COMMANDS))


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same file
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve()
        if not path.exists():
            broken.append(target)
        elif anchor and anchor not in _anchors(path):
            broken.append(target)
    assert not broken, broken


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for a Markdown file's headings."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_code_cites_only_docs_that_exist() -> None:
    cited = {}
    for path in [*ROOT.joinpath("otel_train").rglob("*.[pch]*"), ROOT / "pyproject.toml"]:
        # (not "catapult's docs/x.md": another repository's file)
        for name in re.findall(r"(?<!'s )\b(docs/[\w./-]+\.md)", path.read_text(errors="replace")):
            cited.setdefault(name, path.relative_to(ROOT))
        assert "CONVENTIONS.md" not in path.read_text(errors="replace"), path  # not in the repository
    missing = {name: str(where) for name, where in cited.items() if not (ROOT / name).exists()}
    assert cited and not missing, missing


def test_benchmark_results_are_dated_and_indexed_newest_first() -> None:
    bench = DOCS / "benchmarks"
    results = sorted((p.name for p in bench.glob("*.md") if p.name not in ("README.md", "history.md")))
    assert results and all(re.match(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md$", name) for name in results), results
    index = (bench / "README.md").read_text()
    listed = re.findall(r"^\| \d{4}-\d{2}-\d{2} \| \[([\w.-]+)\]", index, re.MULTILINE)
    assert sorted(listed) == results
    dates = [name[:10] for name in listed]
    assert dates == sorted(dates, reverse=True)
