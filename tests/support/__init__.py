"""What the tests share: a real OTLP receiver, subprocess runners, the span tree of a run, a fake
asynchronous device, the in-process harness, and the training scripts run end to end
(`scenarios/`). `tests/conftest.py` puts `tests/` on the path: import as `support.<module>`."""
