"""The export side (internal): from the hot path's buffer to spans and metrics on the wire.

The worker thread drains the buffer in the training process and hands records to a sink: the
per-rank exporter process (default) or the export pipeline on the worker thread. The pipeline
assembles spans, aggregates metrics and encodes OTLP for the exporters (OTLP or local files).
"""
