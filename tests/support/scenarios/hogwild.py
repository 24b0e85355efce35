"""mnist_hogwild's shape: the model shared in memory, trained in N `torch.multiprocessing`
children (start method from argv: spawn, fork or forkserver), then evaluated in the parent.
Each child counts its own updates. No otel_train in it."""

import json
import os
import sys

import torch
import torch.multiprocessing as mp
from torch import nn


def train(rank: int, model: nn.Module, updates: int) -> None:
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for _ in range(updates):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        steps += 1
    print("SCENARIO " + json.dumps({"pid": os.getpid(), "steps": steps}), flush=True)


def main() -> None:
    method = sys.argv[1] if len(sys.argv) > 1 else "spawn"
    mp.set_start_method(method, force=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    model.share_memory()
    procs = [mp.Process(target=train, args=(rank, model, 6 + rank)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    with torch.no_grad():  # the parent's test pass: no update
        model(torch.randn(4, 8))
    print("SCENARIO " + json.dumps({"pid": os.getpid(), "steps": 0, "exit": [p.exitcode for p in procs]}), flush=True)


if __name__ == "__main__":
    main()
