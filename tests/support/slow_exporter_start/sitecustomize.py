"""Put on PYTHONPATH by `support.procs.slow_exporter_start`: the exporter process (the child
otel_train starts with `OTEL_TRAIN_EXPORTER_CHILD=1`) sleeps `TESTS_EXPORTER_START_DELAY_S`
seconds before anything else, as on a node too busy to start it in time. Test-side on purpose:
the package reads no test-only variable."""

import os
import time

if os.environ.get("OTEL_TRAIN_EXPORTER_CHILD") == "1":
    time.sleep(float(os.environ.get("TESTS_EXPORTER_START_DELAY_S", "0")))
