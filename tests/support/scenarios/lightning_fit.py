"""A Lightning Trainer fitting a tiny model, with validation and checkpoints. No otel_train in it."""

import json
import sys
import tempfile

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-2)


def main() -> None:
    torch.manual_seed(0)
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=out, num_sanity_val_steps=0)
    trainer.fit(Tiny(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=16))
    print("SCENARIO " + json.dumps({"steps": trainer.global_step, "epochs": trainer.current_epoch}))


if __name__ == "__main__":
    main()
