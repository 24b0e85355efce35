"""Tiny models for the latency benchmark's tests: factories `otel-train bench latency` imports."""

from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab); dropout, so the RNG matters."""

    def __init__(self, vocab: int = 50, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.embed(ids)))


def tiny_lm() -> nn.Module:
    torch.manual_seed(0)
    return TinyLM()


def tiny_mlp() -> nn.Module:
    """Float input (batch, 3, 4, 4) with BatchNorm (buffers a train-mode forward updates)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def lm_with_example() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A model that takes keyword inputs, with one example batch of them."""

    class Keyword(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = TinyLM()

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = self.lm(input_ids) * attention_mask.unsqueeze(-1)
            return {"loss": logits.logsumexp(-1).mean(), "logits": logits}

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 6))
    return Keyword(), {"input_ids": ids, "attention_mask": torch.ones(2, 6, dtype=torch.int64)}


def not_a_module() -> int:
    return 3


def broken() -> nn.Module:
    raise RuntimeError("weights not found")


#: A module instance (used as it is), with nothing to train.
frozen = nn.Linear(4, 4).requires_grad_(False)
