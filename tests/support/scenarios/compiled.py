"""A torch.compile'd model in a plain loop; prints Dynamo's compile counters. No otel_train in it.

`step`: a compiled function runs forward, loss, backward and gradient clipping, and another
compiled function zeroes the gradients (both break the graph where torch does: `.backward()`,
`Optimizer.zero_grad`).
"""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x.to(torch.float32)))


def main() -> None:
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randn(48, 1)), batch_size=8, drop_last=True)
    model = Net()
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    @torch.compile
    def forward_backward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        return loss

    @torch.compile
    def zero_grad() -> None:
        opt.zero_grad()

    steps = 0
    for x, y in loader:
        if sys.argv[1:] == ["step"]:
            forward_backward(x, y)
            opt.step()
            zero_grad()
        else:
            loss = nn.functional.mse_loss(compiled(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        steps += 1
    stats = {group: dict(counters[group]) for group in ("frames", "graph_break", "recompiles", "unimplemented")}
    stats["graph_breaks"] = sum(counters["graph_break"].values())
    stats["unique_graphs"] = counters["stats"]["unique_graphs"]
    stats["calls_captured"] = counters["stats"]["calls_captured"]
    print("SCENARIO " + json.dumps({"steps": steps, "compile": stats}))


if __name__ == "__main__":
    main()
