"""Every name otel_train puts on the wire: span names, attributes, resource keys, metrics.

This module is the package's single spelling of docs/trace-shape.md; nothing else in the
package writes these strings. Span names are low cardinality: the step number is an
attribute, never part of a name.
"""

from __future__ import annotations

from typing import Final

# --- span names (docs/trace-shape.md, "Span names") ----------------------------------
SPAN_STEP: Final = "train.step"
SPAN_DATA: Final = "train.data"
SPAN_FORWARD: Final = "train.forward"
SPAN_BACKWARD: Final = "train.backward"
SPAN_OPTIMIZER: Final = "train.optimizer"
SPAN_COLLECTIVE: Final = "train.collective"
SPAN_CHECKPOINT: Final = "train.checkpoint"
SPAN_EVAL: Final = "train.eval"
SPAN_GC: Final = "train.gc"
SPAN_INFER_GENERATE: Final = "infer.generate"
SPAN_DISPATCH_WAIT: Final = "pipeline.dispatch_wait"

#: Phase spans: the pieces a step is made of (their durations feed `train.phase.duration`).
PHASE_SPANS: Final = (SPAN_DATA, SPAN_FORWARD, SPAN_BACKWARD, SPAN_OPTIMIZER, SPAN_COLLECTIVE)
#: Spans that are siblings of steps, never inside one (docs/trace-shape.md, "Trace shape").
STEP_SIBLING_SPANS: Final = (SPAN_CHECKPOINT, SPAN_EVAL, SPAN_GC)
#: Spans that record device events by default while device timing is on (`otel_train.span(name,
#: device_time=True/False)` overrides it). Not `train.data` (host and network work: the device is
#: idle) nor `train.gc` (a host pause).
DEVICE_TIMED_SPANS: Final = (SPAN_FORWARD, SPAN_BACKWARD, SPAN_OPTIMIZER, SPAN_COLLECTIVE, SPAN_CHECKPOINT,
                             SPAN_EVAL)

# --- span attributes (docs/trace-shape.md, "Span attributes") ------------------------
TRAIN_STEP: Final = "train.step"
TRAIN_EPOCH: Final = "train.epoch"
TRAIN_MICRO_BATCH: Final = "train.micro_batch"
TRAIN_MICRO_BATCHES: Final = "train.micro_batches"
TRAIN_STEP_TAGS: Final = "train.step.tags"
TRAIN_STEP_TIME_S: Final = "train.step.time_s"
TRAIN_SAMPLES: Final = "train.samples"
TRAIN_TOKENS: Final = "train.tokens"
DEVICE_DURATION_S: Final = "device.duration_s"
DEVICE_LAG_S: Final = "device.lag_s"
DEVICE_TYPE: Final = "device.type"
COMM_OP: Final = "comm.op"
COMM_BYTES: Final = "comm.bytes"
COMM_GROUP_SIZE: Final = "comm.group_size"
INFER_BATCH_SIZE: Final = "infer.batch_size"
INFER_SAMPLES: Final = "infer.samples"
#: On `pipeline.dispatch_wait`: samples the wait delivered, and samples left in the trainer's pool.
PIPELINE_SAMPLES: Final = "pipeline.samples"
PIPELINE_POOL_SIZE: Final = "pipeline.pool.size"
TRUNCATED: Final = "otel_train.truncated"
#: Private keys of the wire's device dict (W_DEV), never span attributes: where the device
#: started / finished a region, as ns relative to its host start / end (device time mapped to
#: the host clock by the anchor, `record.device_resolver`). Every key starting with "_" is stripped.
WIRE_DEV_START_NS: Final = "_dev.start_ns"
WIRE_DEV_END_NS: Final = "_dev.end_ns"
#: Standard OTel attribute: the exception type that ended a span with an error.
ERROR_TYPE: Final = "error.type"

# --- step tags ----------------------------------------------------------------------
TAG_CHECKPOINT: Final = "checkpoint"
TAG_EVAL: Final = "eval"
TAG_GC: Final = "gc"
#: A step an earlier attempt of the run already ran (after an elastic restart, `export/restarts.py`).
TAG_REDONE: Final = "redone"

# --- resource attributes (docs/trace-shape.md, "Resource") ---------------------------
SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
ML_RUN_ID: Final = "ml.run.id"
ML_RANK: Final = "ml.rank"
ML_LOCAL_RANK: Final = "ml.local_rank"
ML_WORLD_SIZE: Final = "ml.world_size"
ML_NODE_RANK: Final = "ml.node_rank"
ML_ROLE: Final = "ml.role"
ML_RESTART: Final = "ml.restart"
ML_PARALLEL_PREFIX: Final = "ml.parallel"  # ml.parallel.{dp,tp,pp,cp}.rank / .size
ROLE_TRAINER: Final = "trainer"
ROLE_INFERENCE: Final = "inference"
DEFAULT_SERVICE_NAME: Final = "otel-train"

# --- metrics (docs/trace-shape.md, "Metrics") ----------------------------------------
METRIC_STEP_DURATION: Final = "train.step.duration"
METRIC_PHASE_DURATION: Final = "train.phase.duration"
METRIC_DEVICE_DURATION: Final = "train.device.duration"
METRIC_THROUGHPUT_TOKENS: Final = "train.throughput.tokens"
METRIC_THROUGHPUT_SAMPLES: Final = "train.throughput.samples"
METRIC_MFU: Final = "train.mfu"
METRIC_MEMORY_RESERVED: Final = "device.memory.reserved"
METRIC_MEMORY_ALLOCATED: Final = "device.memory.allocated"
METRIC_GC_PAUSE: Final = "train.gc.pause"
METRIC_INFER_BATCH_DURATION: Final = "infer.batch.duration"
METRIC_INFER_CAPACITY: Final = "infer.capacity"
METRIC_TRAIN_CAPACITY: Final = "train.capacity"
METRIC_DISPATCH_WAIT: Final = "pipeline.dispatch_wait"
METRIC_POOL_SIZE: Final = "pipeline.pool.size"
#: Realised throughput of a trainer fed by actors: samples consumed per second of its step time.
METRIC_PIPELINE_THROUGHPUT: Final = "pipeline.throughput"
METRIC_SPANS_DROPPED: Final = "otel_train.spans.dropped"
#: Attribute on phase metrics naming the phase (the span name).
METRIC_ATTR_PHASE: Final = "phase"
#: Attribute on `otel_train.spans.dropped` saying where the drop happened.
METRIC_ATTR_REASON: Final = "reason"

#: Instrumentation scope of every span and instrument the package emits.
SCOPE_NAME: Final = "otel_train"

# --- the package's own environment variables (docs/configuration.md) ---------------
ENV_RUN_ID: Final = "OTEL_TRAIN_RUN_ID"
ENV_OUTPUT_DIR: Final = "OTEL_TRAIN_OUTPUT_DIR"
ENV_DEVICE_TIMING: Final = "OTEL_TRAIN_DEVICE_TIMING"
ENV_STEP_SAMPLE: Final = "OTEL_TRAIN_STEP_SAMPLE"
ENV_RANKS: Final = "OTEL_TRAIN_RANKS"
ENV_STEP_SPANS: Final = "OTEL_TRAIN_STEP_SPANS"
ENV_BUFFER_SIZE: Final = "OTEL_TRAIN_BUFFER_SIZE"
ENV_EXPORT_MODE: Final = "OTEL_TRAIN_EXPORT_MODE"
ENV_EXPORTER_PRIORITY: Final = "OTEL_TRAIN_EXPORTER_PRIORITY"
ENV_FLUSH_INTERVAL: Final = "OTEL_TRAIN_FLUSH_INTERVAL_MS"
ENV_SHUTDOWN_TIMEOUT: Final = "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S"
ENV_ROLE: Final = "OTEL_TRAIN_ROLE"
