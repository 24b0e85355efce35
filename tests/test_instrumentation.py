"""The instrumentor's post-import hooks whatever the import order (otel_train.instrumentation,
otel_train._imports; issue 26 #7).

`import otel_train.auto`, then `import otel_train.lightning` (or `.hf`) before the framework:
the integration module itself imports the framework (and torch), so the hooks waiting for them
fire while it, and detection, are still being imported. They must wait for those imports to
finish, not fail on half-imported modules: detection is installed and every Trainer gets the
callback, with nothing logged.
"""

from __future__ import annotations

import json

import pytest

from support.procs import run_python

OFF = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}

LIGHTNING = """
import json, logging
logging.basicConfig(level=logging.WARNING)
import otel_train.auto
import otel_train.lightning
import lightning.pytorch as pl
from otel_train.detect import installed
trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
print("RESULT " + json.dumps({"callbacks": [type(c).__name__ for c in trainer.callbacks],
                              "installed": installed()}))
"""

HF = """
import json, logging, tempfile
logging.basicConfig(level=logging.WARNING)
import otel_train.auto
import otel_train.hf
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from otel_train.detect import installed
model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=1))
args = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True, disable_tqdm=True)
trainer = Trainer(model=model, args=args)
print("RESULT " + json.dumps({"callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks],
                              "installed": installed()}))
"""


@pytest.mark.parametrize(("code", "framework", "callback"), [
    (LIGHTNING, "lightning", "OtelCallback"), (HF, "transformers", "OtelTrainerCallback")])
def test_importing_the_integration_before_its_framework_still_attaches_its_callback(
        code: str, framework: str, callback: str) -> None:
    pytest.importorskip(framework)
    proc = run_python(code, env=OFF, timeout=240)
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result == {"callbacks": result["callbacks"], "installed": True}
    assert result["callbacks"].count(callback) == 1, result
    assert "otel_train" not in proc.stderr.replace("otel_train: 0 spans", ""), proc.stderr


def test_a_tracer_or_meter_provider_is_named_as_unused_once_and_instrumenting_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    """`instrument(tracer_provider=...)` as contrib instrumentors take it: otel_train builds its
    spans in its exporter process, so it says in one warning that the provider is not used and
    what to pass instead, and instruments as usual."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    import otel_train
    from otel_train.instrumentation import TorchTrainingInstrumentor

    otel_train.init(traces_exporter="none", metrics_exporter="none", export_mode="thread")
    instrumentor = TorchTrainingInstrumentor()
    instrumentor.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    try:
        warnings = [r.getMessage() for r in caplog.records if "does not use" in r.getMessage()]
        assert len(warnings) == 1 and "tracer_provider or meter_provider" in warnings[0]
        assert "otel_train.init(span_processors=" in warnings[0]
        assert instrumentor.is_instrumented_by_opentelemetry
    finally:
        instrumentor.uninstrument()
