"""Mixed precision with a GradScaler whose update is skipped twice (inf gradients), with
unscale-then-clip before the scaler's step. No otel_train in it."""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

OVERFLOW_AT = (0, 3)


def main() -> None:
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    skipped = []
    steps = 0
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        if i in OVERFLOW_AT:
            loss = loss * float("inf")  # the scaler finds inf gradients and skips opt.step()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if scaler.get_scale() < scale:
            skipped.append(i)
        steps += 1
    print("SCENARIO " + json.dumps({"steps": steps, "skipped": skipped}))


if __name__ == "__main__":
    main()
