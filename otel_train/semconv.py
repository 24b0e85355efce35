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
SPAN_ZERO_GRAD: Final = "train.zero_grad"
SPAN_OTHER: Final = "train.other"
SPAN_COLLECTIVE: Final = "train.collective"
SPAN_CHECKPOINT: Final = "train.checkpoint"
SPAN_EVAL: Final = "train.eval"
SPAN_GC: Final = "train.gc"
SPAN_INFER_GENERATE: Final = "infer.generate"
SPAN_DISPATCH_WAIT: Final = "pipeline.dispatch_wait"
SPAN_BENCH_LATENCY: Final = "bench.latency"  # a latency benchmark between steps (names below)

#: Phase spans: the pieces a step is made of (their durations feed `train.phase.duration`).
PHASE_SPANS: Final = (SPAN_DATA, SPAN_FORWARD, SPAN_BACKWARD, SPAN_OPTIMIZER, SPAN_ZERO_GRAD, SPAN_COLLECTIVE)
#: Spans that are siblings of steps, never inside one (docs/trace-shape.md, "Trace shape").
#: `bench.latency` is one too (`export.step_timeline.SIBLING_TAGS`), but no goodput category of
#: its own: its time is `other`.
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
#: On a detected train.step: how much of it no span below it covers (docs/step-semantics.md).
TRAIN_STEP_UNCOVERED_S: Final = "train.step.uncovered_s"
#: On train.optimizer: the calls the optimizer phase covered, in order ("clip_grad_norm_", "step", "zero_grad").
TRAIN_OPTIMIZER_CALLS: Final = "train.optimizer.calls"
TRAIN_SAMPLES: Final = "train.samples"
TRAIN_TOKENS: Final = "train.tokens"
#: FLOPs this rank computed in the step, when the user says (`train.mfu`; docs/metrics.md).
TRAIN_FLOPS: Final = "train.flops"
DEVICE_DURATION_S: Final = "device.duration_s"
DEVICE_LAG_S: Final = "device.lag_s"
#: On a span drawn on the device's timeline (`OTEL_TRAIN_SPAN_TIME=device`, docs/device-time.md):
#: where the host's own interval was, from the span's start (negative: the host ran ahead), and
#: how long it lasted (dispatch).
HOST_OFFSET_S: Final = "host.offset_s"
HOST_DURATION_S: Final = "host.duration_s"
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
#: On an event recorded after its step ended (between steps): how much later, in seconds; the
#: event is shown at the step's end (export/step_timeline.py).
EVENT_LATE_S: Final = "otel_train.event.late_s"
#: Private keys of the wire's device dict (W_DEV), never span attributes: where the device
#: started / finished a region, as ns relative to its host start / end (device time mapped to
#: the host clock by the anchor, `record.device_resolver`). Every key starting with "_" is stripped.
WIRE_DEV_START_NS: Final = "_dev.start_ns"
WIRE_DEV_END_NS: Final = "_dev.end_ns"
WIRE_DEV_LATE: Final = "_dev.late"  # a step's end event recorded well after its end (closed late)
#: Private keys of a worker reading (`wire.schema.sample_wire`), never attributes: the device's
#: name (its peak FLOP/s) and the detected model's trainable parameters (6·N·tokens), for `train.mfu`.
WIRE_SAMPLE_DEVICE_NAME: Final = "_device.name"
WIRE_SAMPLE_PARAMETERS: Final = "_model.parameters"
#: Standard OTel attribute: the exception type that ended a span with an error.
ERROR_TYPE: Final = "error.type"
#: The span event of an exception (OpenTelemetry semantic conventions), at the span's end.
EVENT_EXCEPTION: Final = "exception"
EXCEPTION_TYPE: Final = "exception.type"

# --- step tags ----------------------------------------------------------------------
TAG_CHECKPOINT: Final = "checkpoint"
TAG_EVAL: Final = "eval"
TAG_GC: Final = "gc"
TAG_BENCH: Final = "bench"
#: A step an earlier attempt of the run already ran (after an elastic restart, `export/restarts.py`).
TAG_REDONE: Final = "redone"

# --- resource attributes (docs/trace-shape.md, "Resource") ---------------------------
SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
ML_RUN_ID: Final = "ml.run.id"
#: This launch of the run (`_distributed.launch_id`): tells apart two launches given one run id.
ML_RUN_LAUNCH: Final = "ml.run.launch"
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
METRIC_MEMORY_PEAK: Final = "device.memory.peak"
METRIC_GC_PAUSE: Final = "train.gc.pause"
METRIC_INFER_BATCH_DURATION: Final = "infer.batch.duration"
METRIC_INFER_CAPACITY: Final = "infer.capacity"
METRIC_TRAIN_CAPACITY: Final = "train.capacity"
METRIC_DISPATCH_WAIT: Final = "pipeline.dispatch_wait"
METRIC_POOL_SIZE: Final = "pipeline.pool.size"
#: Realised throughput of a trainer fed by actors: samples consumed per second of its step time.
METRIC_PIPELINE_THROUGHPUT: Final = "pipeline.throughput"
METRIC_SPANS_DROPPED: Final = "otel_train.spans.dropped"
#: Goodput at run time (docs/metrics.md): the productive share of the wall time since init, the
#: wall time by category (attribute `category`: productive, startup, compile, data, checkpoint,
#: eval, gc, restart, other; they add up to it), and the steps tagged `slow`.
METRIC_GOODPUT: Final = "train.goodput"
METRIC_GOODPUT_TIME: Final = "train.goodput.time"
METRIC_SLOW_STEPS: Final = "train.steps.slow"
#: Attribute on phase metrics naming the phase (the span name).
METRIC_ATTR_PHASE: Final = "phase"
#: Attribute on `otel_train.spans.dropped` saying where the drop happened.
METRIC_ATTR_REASON: Final = "reason"
#: Attribute on `train.goodput.time` naming the category.
METRIC_ATTR_CATEGORY: Final = "category"
#: The tag the exporter puts on a slow step's `train.step.tags`.
TAG_SLOW: Final = "slow"

#: Instrumentation scope of every span and instrument the package emits.
SCOPE_NAME: Final = "otel_train"

# --- the package's own environment variables (docs/configuration.md) ---------------
ENV_RUN_ID: Final = "OTEL_TRAIN_RUN_ID"
ENV_OUTPUT_DIR: Final = "OTEL_TRAIN_OUTPUT_DIR"
ENV_DEVICE_TIMING: Final = "OTEL_TRAIN_DEVICE_TIMING"
ENV_SPAN_TIME: Final = "OTEL_TRAIN_SPAN_TIME"
ENV_STEP_SAMPLE: Final = "OTEL_TRAIN_STEP_SAMPLE"
ENV_RANKS: Final = "OTEL_TRAIN_RANKS"
ENV_STEP_SPANS: Final = "OTEL_TRAIN_STEP_SPANS"
ENV_BUFFER_SIZE: Final = "OTEL_TRAIN_BUFFER_SIZE"
ENV_EXPORT_MODE: Final = "OTEL_TRAIN_EXPORT_MODE"
ENV_EXPORTER_PRIORITY: Final = "OTEL_TRAIN_EXPORTER_PRIORITY"
ENV_FLUSH_INTERVAL: Final = "OTEL_TRAIN_FLUSH_INTERVAL_MS"
ENV_SHUTDOWN_TIMEOUT: Final = "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S"
ENV_ROLE: Final = "OTEL_TRAIN_ROLE"
ENV_FLOPS_PER_STEP: Final = "OTEL_TRAIN_FLOPS_PER_STEP"
ENV_PEAK_FLOPS: Final = "OTEL_TRAIN_PEAK_FLOPS"
ENV_CONSOLE_EVERY: Final = "OTEL_TRAIN_CONSOLE_EVERY"

# --- the latency benchmark (`otel-train bench latency`, docs/bench-latency.md) -------------
SPAN_BENCH_WARMUP: Final = "bench.warmup"
SPAN_BENCH_FORWARD: Final = "bench.forward"
SPAN_BENCH_FORWARD_BACKWARD: Final = "bench.forward_backward"
#: The benchmark's timed batches (one span each; `bench.latency` metric points).
BENCH_TIMED_SPANS: Final = (SPAN_BENCH_FORWARD, SPAN_BENCH_FORWARD_BACKWARD)
EVENT_BENCH_RESULT: Final = "bench.result"
BENCH_PHASE: Final = "bench.phase"
BENCH_ITERATION: Final = "bench.iteration"
BENCH_SAMPLES: Final = "bench.samples"
BENCH_TOKENS: Final = "bench.tokens"
BENCH_WARMUP: Final = "bench.warmup"
BENCH_ITERS: Final = "bench.iters"
BENCH_TIMER: Final = "bench.timer"
BENCH_MODEL: Final = "bench.model"
BENCH_AFTER_STEP: Final = "bench.after_step"
METRIC_BENCH_LATENCY: Final = "bench.latency"
METRIC_BENCH_TOKENS: Final = "bench.throughput.tokens"
METRIC_BENCH_SAMPLES: Final = "bench.throughput.samples"
