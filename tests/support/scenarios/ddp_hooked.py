"""DDP (gloo, CPU) whose gradient all-reduce runs through torch.distributed in Python, in a comm
hook, so every collective of a step is visible to a counter and to otel_train's collective
detection. The hook waits for its all-reduce (the stock `allreduce_hook` returns at launch), so
a collective's end is when it completed on every rank. No otel_train in it. STEPS (default 8)
optimizer steps.
"""

import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

STEPS = int(os.environ.get("STEPS", "8"))


def allreduce_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    grads = bucket.buffer()
    dist.all_reduce(grads)
    grads.div_(dist.get_world_size())
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(grads)
    return done


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(STEPS * 8, 16), torch.randn(STEPS * 8, 1))
    loader = DataLoader(data, batch_size=8)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    model.register_comm_hook(None, allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    # Torch aborts at exit while a DDP model outlives the interpreter's start of finalizing
    # (tests/support/procs.py TORCH_EXIT_ABORT): let it go first (it lies in reference cycles).
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
