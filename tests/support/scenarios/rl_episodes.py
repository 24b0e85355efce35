"""reinforce's shape: a policy acts through an episode of a toy environment (one forward with
gradients per time step, no DataLoader), then one update per episode. The updates (episodes) and
forwards are counted. No otel_train in it."""

import json

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=-1))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    updates = forwards = 0
    for episode in range(8):
        state = torch.randn(4)
        log_probs, rewards = [], []
        for _ in range(5 + episode % 3):
            probs = policy(state)
            forwards += 1
            action = torch.distributions.Categorical(probs).sample()
            log_probs.append(torch.log(probs[action]))
            state = state + 0.1 * (action.item() - 0.5)  # the environment's step
            rewards.append(float(state.sum()))
        returns = torch.tensor(rewards)
        returns = (returns - returns.mean()) / (returns.std() + 1e-6)
        loss = -(torch.stack(log_probs) * returns).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        updates += 1
    print("SCENARIO " + json.dumps({"steps": updates, "forwards": forwards}))


if __name__ == "__main__":
    main()
