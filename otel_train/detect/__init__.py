"""Automatic step and phase detection for unmodified PyTorch loops (internal; imports torch).

`otel_train.instrumentation.TorchTrainingInstrumentor` installs it; framework integrations
(`integrations/`) refine it with what only the framework knows.
"""
