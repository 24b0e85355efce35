"""The `otel-train` command line (`otel_train.cli.main`)."""

from otel_train.cli.main import main

__all__ = ["main"]
