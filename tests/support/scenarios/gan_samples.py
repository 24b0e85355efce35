"""dcgan's shape: per batch a discriminator update then a generator update, and every K
iterations a sample from the generator on fixed noise (`netG(fixed_noise)`, gradients on, as
dcgan writes it) after the generator's update; the last iteration samples too. The updates
(iterations) and samples are counted. No otel_train in it."""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(48, 2) * 0.5 + 1.0), batch_size=4)
    gen = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2))
    disc = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-3)
    bce = nn.BCEWithLogitsLoss()
    fixed_noise = torch.randn(8, 3)
    steps = samples = 0
    for i, (real,) in enumerate(loader):
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        disc.zero_grad()
        err_real = bce(disc(real), ones)
        err_real.backward()
        fake = gen(torch.randn(len(real), 3))
        err_fake = bce(disc(fake.detach()), zeros)
        err_fake.backward()
        opt_d.step()
        gen.zero_grad()
        bce(disc(fake), ones).backward()
        opt_g.step()
        steps += 1
        if i % 4 == 0 or i == len(loader) - 1:
            sample = gen(fixed_noise)  # dcgan: `fake = netG(fixed_noise)`, then saved as an image
            sample.detach().sum().item()
            samples += 1
    print("SCENARIO " + json.dumps({"steps": steps, "samples": samples}))


if __name__ == "__main__":
    main()
