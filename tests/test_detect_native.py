"""Detection's C extensions are required for automatic detection (`otel_train.detect.native`): where
one cannot be imported, automatic mode says so in one line naming it, installs nothing, and the
training and its explicit spans run as before (issue 52: no Python twin in detection)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from support.procs import clean_env, run_python  # noqa: E402

#: The training script: automatic mode, explicit steps and a span of the user's, and a check
#: that nothing was patched.
TRAIN = """
import json, sys
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import otel_train
exporter = InMemorySpanExporter()
otel_train.init(span_processors=[SimpleSpanProcessor(exporter)], export_mode="thread", traces_exporter="none",
                metrics_exporter="none")
import otel_train.auto
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for n in range(3):
    with otel_train.step(n), otel_train.span("mine"):
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
try:  # the framework callbacks import, and do nothing when detection is off
    from otel_train.lightning import OtelCallback
    callback = type(OtelCallback()).__name__
except ImportError as err:
    callback = "ImportError: " + str(err)
patched = type(torch.autograd.backward).__name__ != 'function'  # an entry object of ours
otel_train.shutdown()
names = sorted(span.name for span in exporter.get_finished_spans())
print("RESULT " + json.dumps({"names": names, "patched": patched, "callback": callback,
                              "loss": float(model(torch.ones(1, 4)).sum())}))
"""


def _blocking(tmp_path: Path, module: str) -> dict[str, str]:
    """Environment whose processes cannot import `module`, as where it was not built: a
    `sitecustomize` first on the path puts None in its `sys.modules` entry."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).resolve().parents[1]),
                                           os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("extension", ["_loops", "_batch", "_entry"])
def test_without_an_extension_automatic_mode_says_so_once_and_training_runs(tmp_path: Path, extension: str) -> None:
    module = f"otel_train.detect.{extension}"
    proc = run_python(TRAIN, env=_blocking(tmp_path, module), timeout=180)
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    said = [line for line in proc.stderr.splitlines() if "automatic step detection is off" in line]
    assert len(said) == 1 and module in said[0] and "otel_train.span" in said[0], proc.stderr
    assert out["names"] == ["mine"] * 3 + ["train.step"] * 3  # explicit spans only: no phase detected
    assert not out["patched"]
    assert out["callback"] == "OtelCallback"  # importing a callback does not stop the script
    assert out["loss"] == out["loss"]  # the training ran to the end (a number, not NaN)


def test_with_the_extensions_the_same_script_detects_phases(tmp_path: Path) -> None:
    """The check above can fail: the same script, nothing blocked, sees the phases."""
    proc = run_python(TRAIN, env=_blocking(tmp_path, "nothing.at.all"), timeout=180)
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert "automatic step detection is off" not in proc.stderr
    assert {"train.forward", "train.backward", "train.optimizer"} <= set(out["names"]) and out["patched"]
    assert out["callback"] == "OtelCallback"


def test_otel_train_run_says_it_once_and_runs_the_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nm = torch.nn.Linear(2, 1)\nm(torch.ones(1, 2)).sum().backward()\n"
                      "print('TRAINED', m.weight.grad.shape)\n")
    env = _blocking(tmp_path, "otel_train.detect._loops")
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    proc = subprocess.run([sys.executable, "-m", "otel_train.run", str(script)], env=clean_env(env), cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "TRAINED torch.Size([1, 2])" in proc.stdout
    said = [line for line in proc.stderr.splitlines() if "automatic step detection is off" in line]
    assert len(said) == 1 and "otel_train.detect._loops" in said[0], proc.stderr


LIGHTNING = """
import lightning.pytorch as pl, torch
from torch.utils.data import DataLoader, TensorDataset
from otel_train.lightning import OtelCallback
class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        return self.layer(batch[0]).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)
trainer = pl.Trainer(max_epochs=2, callbacks=[OtelCallback()], logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
trainer.fit(M(), data)
print("STEPS", trainer.global_step)
"""


def test_a_lightning_fit_with_the_callback_trains_on_without_detection(tmp_path: Path) -> None:
    """A framework callback in the user's Trainer, detection's C missing: the fit runs to its
    end and detection being off is said once (the callback does nothing)."""
    pytest.importorskip("lightning")
    env = _blocking(tmp_path, "otel_train.detect._loops")
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    proc = run_python(LIGHTNING, env=env, timeout=300)
    assert "STEPS 8" in proc.stdout, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "automatic step detection is off" in line]
    assert len(said) == 1 and "otel_train.detect._loops" in said[0], proc.stderr
