"""`import otel_train.auto`: one line at the top of a training script traces every step.

It configures otel_train from the `OTEL_*` / `OTEL_TRAIN_*` environment variables and installs
`TorchTrainingInstrumentor` (see `otel_train.instrumentation` for what is recorded, and
`otel_train.detect` for how steps are found), including the Lightning and Hugging Face
callbacks for every `Trainer` created afterwards. Importing it twice, or under
`opentelemetry-instrument` / `otel-train run`, instruments once. With `OTEL_SDK_DISABLED=true`
it installs nothing.
"""

from __future__ import annotations

from otel_train.instrumentation import TorchTrainingInstrumentor

_instrumentor = TorchTrainingInstrumentor()
if not _instrumentor.is_instrumented_by_opentelemetry:
    _instrumentor.instrument()
