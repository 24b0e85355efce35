"""A transformers.Trainer on a tiny GPT-2 built from a config in code (no download), with
evaluation and checkpoints every 3 steps. No otel_train in it."""

import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    torch.manual_seed(0)
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=8,
                             gradient_accumulation_steps=2, max_steps=6, eval_strategy="steps", eval_steps=3,
                             save_strategy="steps", save_steps=3, logging_strategy="no", report_to=[],
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(48), eval_dataset=Tokens(16))
    trainer.train()
    print("SCENARIO " + json.dumps({"steps": trainer.state.global_step}))


if __name__ == "__main__":
    main()
