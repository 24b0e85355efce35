"""The layers the package is built in, checked on each module's imports (every `import`
statement in the file, those inside functions included).

- The exporter side (what the exporter process runs) never imports the training side: the hot
  path (`otel_train.record`), detection, the runtime, or the worker and its sinks; but for the
  hot path's C module, whose `unpack` reads packed drains.
- The wire schema (`otel_train.wire`) imports neither side: both import it.
- The hot path imports neither the OpenTelemetry SDK nor the export side nor detection.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import otel_train

PACKAGE = Path(otel_train.__file__).resolve().parent
#: What the exporter process imports to run (`export/exporter_process.py` and what it pulls in).
EXPORTER_SIDE = ("exporter_process", "pipe", "pipeline", "spans", "fast_path", "step_timeline", "span_ids",
                 "restarts", "actor_traces", "pipeline_metrics", "destination", "delivery", "transport",
                 "attributes", "metrics", "otlp", "exporters", "otlp_json", "goodput", "mfu", "peak_flops",
                 "console")
TRAINING_SIDE = ("otel_train.record", "otel_train.detect", "otel_train._runtime", "otel_train.export.worker",
                 "otel_train.export.sinks", "otel_train.export.pacer", "otel_train.export.samples")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _offending(path: Path, prefixes: tuple[str, ...]) -> set[str]:
    return {name for name in _imports(path) if name.startswith(prefixes)}


#: The one exception: the hot path's C module, the one reader of packed slots (`wire/slots.h`).
EXPORTER_MAY = {"otel_train.record", "otel_train.record._hotpath"}


@pytest.mark.parametrize("module", EXPORTER_SIDE)
def test_the_exporter_side_imports_nothing_of_the_training_side(module: str) -> None:
    assert not _offending(PACKAGE / "export" / f"{module}.py", TRAINING_SIDE) - EXPORTER_MAY


def test_the_wire_schema_imports_neither_side() -> None:
    paths = sorted((PACKAGE / "wire").glob("*.py"))
    assert paths
    for path in paths:
        allowed = {name for name in _imports(path) if name.startswith("otel_train")} <= {"otel_train",
                                                                                          "otel_train.semconv"}
        assert allowed, (path.name, _imports(path))


def test_the_hot_path_imports_neither_the_sdk_nor_the_export_side() -> None:
    paths = sorted((PACKAGE / "record").glob("*.py"))
    assert paths
    for path in paths:
        assert not _offending(path, ("opentelemetry", "otel_train.export", "otel_train.detect")), path.name


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from otel_train.record import recorder\n")
    assert _offending(module, TRAINING_SIDE) == {"otel_train.record", "otel_train.record.recorder"}
