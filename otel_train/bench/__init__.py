"""`otel-train bench`: benchmarks a user can run on their own hardware (not product code)."""
