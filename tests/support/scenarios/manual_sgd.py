"""A loop with no optimizer object: weights updated by hand (p.data.add_). No otel_train in it."""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(24, 4), torch.randn(24, 1)), batch_size=8)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    steps = 0
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.05)
                    p.grad.zero_()
            steps += 1
    print("SCENARIO " + json.dumps({"steps": steps}))


if __name__ == "__main__":
    main()
