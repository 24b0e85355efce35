"""Benchmarks users run on their own hardware (`otel-train bench ...`)."""
