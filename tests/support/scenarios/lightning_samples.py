"""Lightning with manual optimization, a GAN's shape: two optimizers stepped in `training_step`,
and a sample from the generator in `on_train_epoch_end` (gradients on, train mode, as a sample
hook often is). The updates (batches) and samples are counted. No otel_train in it."""

import json
import tempfile

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Gan(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.gen = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2))
        self.disc = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        self.fixed = torch.randn(4, 3)
        self.samples = 0
        self.updates = 0  # iterations: a discriminator and a generator update each

    def training_step(self, batch: tuple[torch.Tensor], batch_idx: int) -> None:
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        bce = nn.functional.binary_cross_entropy_with_logits
        fake = self.gen(torch.randn(len(real), 3))
        d_loss = bce(self.disc(real), torch.ones(len(real), 1)) + bce(self.disc(fake.detach()), torch.zeros(len(real), 1))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = bce(self.disc(fake), torch.ones(len(real), 1))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.updates += 1

    def on_train_epoch_end(self) -> None:
        self.gen(self.fixed).detach()  # a sample, gradients on
        self.samples += 1

    def configure_optimizers(self):
        return torch.optim.Adam(self.gen.parameters(), 2e-3), torch.optim.Adam(self.disc.parameters(), 2e-3)


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 2))
    model = Gan()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tempfile.mkdtemp())
    trainer.fit(model, DataLoader(data, batch_size=8))
    print("SCENARIO " + json.dumps({"steps": model.updates, "samples": model.samples}))


if __name__ == "__main__":
    main()
