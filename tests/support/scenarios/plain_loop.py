"""A plain PyTorch loop: DataLoader, model, AdamW, an LR scheduler. No otel_train in it."""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    steps = 0
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to("cpu"), y.to("cpu")
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
        sched.step()
    print("SCENARIO " + json.dumps({"steps": steps}))


if __name__ == "__main__":
    main()
