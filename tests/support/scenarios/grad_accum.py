"""Gradient accumulation over 4 micro-batches, with gradient clipping. No otel_train in it."""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ACCUMULATE = 4


def main() -> None:
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    steps = 0
    for epoch in range(2):
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x), y) / ACCUMULATE
            loss.backward()
            if (i + 1) % ACCUMULATE == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()
                steps += 1
    print("SCENARIO " + json.dumps({"steps": steps}))


if __name__ == "__main__":
    main()
