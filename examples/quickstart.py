"""Quickstart: train a tiny model on CPU and leave OpenTelemetry traces on the embedded default.

    python examples/quickstart.py            # traces under ./otel-train/<run id>/
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 python examples/quickstart.py   # to a collector

Uses the explicit API: one `otel_train.step()` per optimizer step, phase spans inside it,
an evaluation every 10 steps and a checkpoint at step 20 (siblings of the steps they follow).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import otel_train


def make_data(samples: int = 512, features: int = 32) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=generator)
    true_w = torch.randn(features, 1, generator=generator)
    return TensorDataset(x, x @ true_w + 0.1 * torch.randn(samples, 1, generator=generator))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (default 40)")
    parser.add_argument("--accum", type=int, default=2, help="micro-batches per step (default 2)")
    args = parser.parse_args()

    run = otel_train.init(service_name=os.environ.get("OTEL_SERVICE_NAME", "quickstart"))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(make_data(), batch_size=16, shuffle=True)
    batches = iter(loader)
    checkpoint_dir = tempfile.mkdtemp(prefix="quickstart-ckpt-")

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    for step in range(args.steps):
        with otel_train.step(step, epoch=step * args.accum * 16 // 512):
            for micro in range(args.accum):
                with otel_train.span("train.data", **{"train.micro_batch": micro}):
                    x, y = next_batch()
                with otel_train.span("train.forward", **{"train.micro_batch": micro}):
                    loss = nn.functional.mse_loss(model(x), y) / args.accum
                with otel_train.span("train.backward", **{"train.micro_batch": micro}):
                    loss.backward()
            with otel_train.span("train.optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        if step % 10 == 9:
            with otel_train.span("train.eval"), torch.no_grad():
                val = nn.functional.mse_loss(model(x), y)
            otel_train.event("eval.done", loss=float(val))  # float(): already on the host here
        if step == 19:
            with otel_train.span("train.checkpoint"):
                torch.save(model.state_dict(), os.path.join(checkpoint_dir, "model.pt"))

    otel_train.shutdown()
    if run is not None and not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        out_dir = os.path.join(os.environ.get("OTEL_TRAIN_OUTPUT_DIR", "otel-train"), run.run_id)
        print(f"trained {args.steps} steps; traces and metrics are in {out_dir}/")


if __name__ == "__main__":
    main()
