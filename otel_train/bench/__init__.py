"""`otel-train bench`: benchmarks a user can run on their own hardware (not product code).

Its functions import torch and otel_train (detection, the runtime) where they run, not at the
top: the CLI lists the commands without importing torch, and a benchmark decides when
instrumentation begins in its process."""
