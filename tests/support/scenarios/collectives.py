"""Naive data parallelism over torch.distributed (gloo): gradients all-reduced by hand.

Runs alone (a world of one) or under torchrun. No otel_train in it.
"""

import json
import os
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    if "RANK" not in os.environ:  # not under torchrun: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    dist.barrier()
    steps = 0
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        dist.all_reduce(loss.detach())
        steps += 1
    grads = {str(i): p.numel() * p.element_size() for i, p in enumerate(model.parameters())}
    print("SCENARIO " + json.dumps({"steps": steps, "rank": dist.get_rank(), "world": world,
                                    "grad_bytes": grads}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
