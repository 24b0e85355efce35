"""Nothing of ours inside the user's first steps that could be done before or off the loop
(issue 54 #5): a loop that updates its weights by hand is told from gradient accumulation
without scanning every live object in its first step (126 ms in pytorch/examples regression)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from support.procs import run_python  # noqa: E402

MANUAL = """
import gc, json
import otel_train.auto
import torch
from torch import nn
scans = []
real = gc.get_objects
gc.get_objects = lambda *a: scans.append(1) or real(*a)
model = nn.Linear(4, 1)
for _ in range(5):
    model.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(-0.01 * p.grad)
import otel_train
otel_train.shutdown()
from otel_train.detect.state import s
print("SCENARIO " + json.dumps({"scans": len(scans), "manual": s.uses_opt is False}))
"""


def test_a_manual_update_loop_is_told_without_a_scan_of_every_object() -> None:
    proc = run_python(MANUAL, env={"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"})
    out = json.loads(proc.stdout.split("SCENARIO ", 1)[1])
    assert out == {"scans": 0, "manual": True}, proc.stderr
