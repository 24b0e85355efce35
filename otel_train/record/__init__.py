"""The training side's hot path (internal): what runs on the training thread.

A region or step appends a few numbers and references to a bounded buffer and nothing else;
the export side (`otel_train.export`) drains it off the thread. Nothing here is public API:
users go through the `otel_train` facade.
"""
