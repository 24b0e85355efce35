"""`import otel_train.auto` as the only otel line; DataLoader workers started by fork and by spawn.

The spawned workers re-import this script (as `__mp_main__`), and with it otel_train.auto: they
must not report themselves as trainers.
"""

import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import otel_train.auto  # noqa: F401  (the scenario: one line)


class Squares(Dataset):
    """Built in the worker (no shared tensors), so workers do real work per item."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((4,), float(i) / 16)
        return x, (x ** 2).sum(0, keepdim=True)


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    steps = 0
    for context in ("fork", "spawn"):
        loader = DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context=context)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            steps += 1
    print("SCENARIO " + json.dumps({"steps": steps, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
