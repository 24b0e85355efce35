"""DDP (gloo, CPU) with a sleep planted in one rank's batch collation. No otel_train in it.

SLOW_RANK=<rank> sleeps SLOW_S (default 0.05 s) in that rank's collate_fn every step;
SLOW_RANK=all sleeps on every rank (a balanced run with longer steps); unset: no sleep.
STEPS (default 12) optimizer steps. Prints SCENARIO {"rank": R, "steps": N} per rank.
"""

import gc
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset, default_collate

SLOW_RANK = os.environ.get("SLOW_RANK", "")
SLOW_S = float(os.environ.get("SLOW_S", "0.05"))
STEPS = int(os.environ.get("STEPS", "12"))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow = SLOW_RANK == "all" or SLOW_RANK == str(rank)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(STEPS * 8, 16), torch.randn(STEPS * 8, 1))

    def collate(batch):
        if slow:
            time.sleep(SLOW_S)
        return default_collate(batch)

    loader = DataLoader(data, batch_size=8, collate_fn=collate)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    steps = 0
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        steps += 1
    print("SCENARIO " + json.dumps({"rank": rank, "steps": steps}))
    # Torch aborts at exit while a DDP model outlives the interpreter's start of finalizing
    # (tests/support/procs.py TORCH_EXIT_ABORT): let it go first (it lies in reference cycles).
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
