"""Training with a checkpoint (torch.save) every 3 steps and once at the end. No otel_train in it."""

import json
import os
import sys
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAVE_EVERY = 3


def main() -> None:
    torch.manual_seed(0)
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    steps, saves = 0, []
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            steps += 1
            if steps % SAVE_EVERY == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": steps},
                           os.path.join(out, f"ckpt-{steps}.pt"))
                saves.append(steps - 1)
    torch.save(model.state_dict(), os.path.join(out, "final.pt"))
    saves.append(steps - 1)
    print("SCENARIO " + json.dumps({"steps": steps, "checkpoint_after": saves}))


if __name__ == "__main__":
    main()
