"""An elastic job that fails once and resumes from its checkpoint (torchrun --max-restarts 1).

Explicit steps (their numbers follow the checkpoint, as a resumed job's do), a gloo
all-reduce in each. Rank 0 writes a checkpoint (the next step to run) every CKPT_EVERY steps
to CKPT; on the first attempt rank 1 raises inside step FAIL_AT, so the second attempt
resumes from the last checkpoint and runs some steps again. Each rank of each attempt writes
the steps it ran to `<CKPT>.ran-a<attempt>-r<rank>.json` (stdout interleaves the ranks').
"""

import json
import os
import time

import torch
import torch.distributed as dist

import otel_train

STEPS = int(os.environ.get("STEPS", "10"))
FAIL_AT = int(os.environ.get("FAIL_AT", "6"))
CKPT_EVERY = int(os.environ.get("CKPT_EVERY", "4"))
CKPT = os.environ["CKPT"]


def main() -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The agent's store outlives an attempt; a key prefix per attempt keeps the second attempt's
    # gloo from reading the first one's (dead) addresses, which made it fail to connect at times.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store), rank=rank, world_size=world)
    start = int(open(CKPT).read()) if os.path.exists(CKPT) else 0
    x = torch.ones(4)
    ran = []
    for n in range(start, STEPS):
        with otel_train.step(n):
            ran.append(n)
            with open(f"{CKPT}.ran-a{attempt}-r{rank}.json", "w") as f:
                json.dump(ran, f)
            with otel_train.span("train.forward"):
                time.sleep(0.01)
            if attempt == 0 and rank == 1 and n == FAIL_AT:
                raise RuntimeError("planted failure")
            with otel_train.span("train.collective"):
                dist.all_reduce(x)
        if rank == 0 and (n + 1) % CKPT_EVERY == 0:
            with open(CKPT + ".tmp", "w") as f:
                f.write(str(n + 1))
            os.replace(CKPT + ".tmp", CKPT)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
