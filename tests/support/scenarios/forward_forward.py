"""mnist_forward_forward's shape: each layer trains alone with its own optimizer, calling
`self.forward()` directly (only its ReLU goes through `Module.__call__`), the first layer to the
end before the second; each layer's training ends with two forwards that feed the next one; a
final `predict()` runs every layer with gradients on, in train mode. The updates are counted,
and the layers' forwards after the last one (no update follows them). No otel_train in it."""

import json
import sys

import torch
from torch import nn

FORWARDS = [0]  # every layer's forwards so far


class Layer(nn.Linear):
    def __init__(self, d_in: int, d_out: int, epochs: int) -> None:
        super().__init__(d_in, d_out)
        self.relu = nn.ReLU()
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)
        self.threshold = 2.0
        self.epochs = epochs
        self.updates = 0
        self.forwards_at_update = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        FORWARDS[0] += 1
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train_layer(self, x_pos: torch.Tensor, x_neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(self.epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.updates += 1
            self.forwards_at_update = FORWARDS[0]
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


class Net(nn.Module):
    def __init__(self, dims: list[int], epochs: int) -> None:
        super().__init__()
        self.layers = [Layer(dims[d], dims[d + 1], epochs) for d in range(len(dims) - 1)]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        goodness_per_label = []
        for label in range(4):
            h = x + label
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness += [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train_net(self, x_pos: torch.Tensor, x_neg: torch.Tensor) -> None:
        h_pos, h_neg = x_pos, x_neg
        for layer in self.layers:
            h_pos, h_neg = layer.train_layer(h_pos, h_neg)


def main() -> None:
    rows, width = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (64, 32)
    torch.manual_seed(0)
    net = Net([16, width, width], epochs=12)
    x_pos, x_neg = torch.randn(rows, 16), torch.randn(rows, 16)
    net.train_net(x_pos, x_neg)
    net.predict(torch.randn(8, 16))
    after = FORWARDS[0] - max(layer.forwards_at_update for layer in net.layers)
    print("SCENARIO " + json.dumps({"steps": sum(layer.updates for layer in net.layers), "after_last": after}))


if __name__ == "__main__":
    main()
