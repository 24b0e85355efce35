"""`python -m otel_train.cli ...`: the `otel-train` command."""

import sys

from otel_train.cli.main import main

sys.exit(main())
