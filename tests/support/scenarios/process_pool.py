"""A `ProcessPoolExecutor` of 3 workers (start method from argv), one task of which trains a
model (its updates counted) while the other workers only compute. No otel_train in it."""

import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor


def train(updates: int) -> dict:
    import torch
    from torch import nn
    torch.set_num_threads(1)
    model = nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters())
    for _ in range(updates):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    return {"pid": os.getpid(), "steps": updates}


def idle(n: int) -> int:
    return sum(range(n))


def main() -> None:
    method = sys.argv[1] if len(sys.argv) > 1 else "spawn"
    import torch  # noqa: F401 - the parent imports torch, as a training script does
    with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context(method)) as pool:
        idles = [pool.submit(idle, 1000) for _ in range(6)]
        trained = pool.submit(train, 7).result()
        [f.result() for f in idles]
    print("SCENARIO " + json.dumps(trained), flush=True)
    print("SCENARIO " + json.dumps({"pid": os.getpid(), "steps": 0}), flush=True)


if __name__ == "__main__":
    main()
