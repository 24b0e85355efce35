"""`mp.spawn` DDP with gloo, as imagenet's `--multiprocessing-distributed` launches it: the parent
never trains; each child is given its rank by `init_process_group(rank=...)` (no RANK in the
environment) and counts its updates. No otel_train in it."""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank: int, world: int, port: int, updates: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for _ in range(updates):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        steps += 1
    print("SCENARIO " + json.dumps({"pid": os.getpid(), "rank": rank, "steps": steps}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, port, 5), nprocs=world, join=True)
    print("SCENARIO " + json.dumps({"pid": os.getpid(), "steps": 0}), flush=True)


if __name__ == "__main__":
    main()
