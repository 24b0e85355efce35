"""Training with an evaluation pass every 3 steps and once at the end. No otel_train in it."""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EVAL_EVERY = 3


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += nn.functional.mse_loss(model(x), y).item()
    model.train()
    return total


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    train = DataLoader(data, batch_size=8, shuffle=True)
    val = DataLoader(data, batch_size=16)  # the same dataset: loaders are told apart, not datasets
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    steps, evals = 0, []
    for epoch in range(2):
        for x, y in train:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if steps % EVAL_EVERY == 0:
                evaluate(model, val)
                evals.append(steps - 1)
    evaluate(model, val)
    evals.append(steps - 1)
    print("SCENARIO " + json.dumps({"steps": steps, "eval_after": evals}))


if __name__ == "__main__":
    main()
