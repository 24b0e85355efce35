"""A GAN: a discriminator and a generator step, each with its own optimizer, per batch.
No otel_train in it."""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 2) * 0.5 + 1.0), batch_size=8, shuffle=True)
    gen = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2))
    disc = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-3, betas=(0.5, 0.999))
    sched_g = torch.optim.lr_scheduler.LambdaLR(opt_g, lambda e: 0.9 ** e)
    bce = nn.BCEWithLogitsLoss()
    steps = 0
    for epoch in range(2):
        for (real,) in loader:
            ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
            fake = gen(torch.randn(len(real), 3))
            d_loss = bce(disc(real), ones) + bce(disc(fake.detach()), zeros)
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = bce(disc(fake), ones)
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
            steps += 1
        sched_g.step()
    print("SCENARIO " + json.dumps({"steps": steps}))


if __name__ == "__main__":
    main()
