"""Automatic instrumentation: an ordinary training loop, plus one import line.

    python examples/auto_plain.py                  # traces under ./otel-train/<run id>/
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 python examples/auto_plain.py

Every optimizer step becomes a `train.step` span holding its batch fetch, forward, backward
and optimizer spans; the evaluation every 5 steps and the final checkpoint become siblings that
tag the step they follow. Without the import line, the same loop runs unchanged under
`otel-train run examples/auto_plain.py` or `python -m otel_train.run examples/auto_plain.py`.
"""

import otel_train.auto  # noqa: F401  - the only otel line

import argparse  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2, help="passes over the data (default 2)")
    parser.add_argument("--out", default=tempfile.gettempdir(), help="where the checkpoint goes")
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=generator)
    y = x @ torch.randn(16, 1, generator=generator)
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=64)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    steps = 0
    for epoch in range(args.epochs):
        for xb, yb in train:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps % 5 == 0:
                model.eval()
                with torch.no_grad():
                    val_loss = sum(nn.functional.mse_loss(model(vx), vy).item() for vx, vy in val)
                model.train()
                print(f"step {steps}: train loss {loss.item():.4f}, val loss {val_loss:.4f}")
    torch.save(model.state_dict(), os.path.join(args.out, "auto_plain.pt"))
    print(f"done: {steps} steps")


if __name__ == "__main__":
    main()
