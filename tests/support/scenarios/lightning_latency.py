"""A Lightning fit with `TrainingLatencyCallback` (and `OtelCallback`), one process or DDP under torchrun.

    python lightning_latency.py OUT [--ddp]
    python -m torch.distributed.run --nproc-per-node 2 lightning_latency.py OUT --ddp

The model has dropout and BatchNorm (RNG and buffers the benchmark must leave alone) and, under
DDP, an all-reduce inside its forward (a collective every rank must join, as with tensor
parallelism or SyncBatchNorm: a benchmark on rank 0 alone would deadlock on it). Each rank
writes OUT/weights-rank<R>.json: digests of its final parameters and state dict, and whether it measured.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from otel_train.lightning import OtelCallback, TrainingLatencyCallback


class AllReduceMean(nn.Module):
    """Averages a statistic of its input across ranks in the forward (a collective in the model)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.is_available() and dist.is_initialized():
            scale = x.detach().abs().mean().reshape(1)
            dist.all_reduce(scale)
            return x / (1 + scale / dist.get_world_size())
        return x


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), AllReduceMean(),
                                 nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(tensors.items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    out = Path(sys.argv[1])
    ddp = "--ddp" in sys.argv
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    latency_cb = TrainingLatencyCallback(start_step=3, warmup=1, iters=3, save_path=out / "latency.json")
    trainer = pl.Trainer(max_steps=6, accelerator="cpu", devices=2 if ddp else 1,
                         strategy="ddp" if ddp else "auto", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(out),
                         callbacks=[OtelCallback(), latency_cb])
    model = Tiny()
    trainer.fit(model, DataLoader(data, batch_size=8))
    # Parameters agree across DDP ranks; BatchNorm statistics do not (each rank updates its own
    # from its last batch, after DDP broadcast rank 0's at the start of the forward).
    record = {"rank": trainer.global_rank, "steps": trainer.global_step,
              "params": digest(dict(model.named_parameters())), "state": digest(model.state_dict()),
              "measured": latency_cb.result is not None}
    (out / f"weights-rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
