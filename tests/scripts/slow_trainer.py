"""A plain HF ``Trainer`` script (no trainscale import) whose rank 1 loses SLOW_S seconds per step in its data
collator (SLOW=loader) or its model's forward (SLOW=forward), or nowhere (clean), each at the line marked
``# place: <SLOW>``. The Trainer makes the process group and wraps the model in DDP itself. Run it with
`trainscale run --nproc-per-node 2`. ACCUM: gradient accumulation steps; LOG_STEPS: the Trainer's logging
interval (its loss gathered across the ranks there)."""

import os
import time

import torch
from transformers import Trainer, TrainingArguments

SLOW = os.environ.get("SLOW", "clean")
SLOW_S = float(os.environ.get("SLOW_S", "0.04"))
STEPS = int(os.environ.get("STEPS", "14"))
ACCUM = int(os.environ.get("ACCUM", "1"))
LOG_STEPS = int(os.environ.get("LOG_STEPS", "10000"))
SLOW_HERE = SLOW if int(os.environ.get("RANK", "0")) == 1 else "clean"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 1)

    def forward(self, x, y):
        h = torch.relu(self.a(x))
        if SLOW_HERE == "forward":
            time.sleep(SLOW_S)  # place: forward
        return {"loss": torch.nn.functional.mse_loss(self.b(h), y)}


def collate(items):
    if SLOW_HERE == "loader":
        time.sleep(SLOW_S)  # place: loader
    return {"x": torch.stack([i["x"] for i in items]), "y": torch.stack([i["y"] for i in items])}


def main():
    g = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(32, generator=g), "y": torch.randn(1, generator=g)} for _ in range(8 * 2 * STEPS * ACCUM)]
    args = TrainingArguments(
        output_dir="out",
        max_steps=STEPS,
        per_device_train_batch_size=8,
        report_to=[],
        save_strategy="no",
        logging_steps=LOG_STEPS,
        gradient_accumulation_steps=ACCUM,
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    Trainer(model=Net(), args=args, train_dataset=data, data_collator=collate).train()


if __name__ == "__main__":
    main()
