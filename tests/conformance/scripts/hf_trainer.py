"""Course-style HF Trainer fine-tuning (seeds 000/001, GPT-neo-IMDB-finetuning.py): the Trainer sets up
data parallelism from torchrun's variables; the script picks its device by local rank, divides the
global batch over the ranks and prints on one process only. A tiny GPT-Neo built from a config (no
download) on a synthetic token set."""

import argparse
import os

import torch
from transformers import GPTNeoConfig, GPTNeoForCausalLM, Trainer, TrainingArguments

from common_data import checksum, report


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=64, length=32, vocab=128):
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-path", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=4)
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if torch.cuda.is_available():  # <!!! ACTION REQUIRED: select the correct PyTorch device !!!>
        torch.cuda.set_device(local_rank)
    per_device = args.global_batch // world_size  # <!!! the per-device batch size handled per process !!!>

    torch.manual_seed(0)
    config = GPTNeoConfig(vocab_size=128, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=64,
                          attention_types=[[["global", "local"], 1]], window_size=16)
    model = GPTNeoForCausalLM(config)
    training_args = TrainingArguments(
        output_dir=args.output_path, per_device_train_batch_size=per_device, max_steps=args.max_steps,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, use_cpu=not torch.cuda.is_available(), seed=0, ddp_backend=None,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=Tokens())
    result = trainer.train()
    if trainer.is_world_process_zero():  # <!!! limit printing of outputs to a single process !!!>
        print(f"train_loss={result.training_loss:.4f} steps={result.global_step} world={trainer.args.world_size}")
    report(args.out, rank=trainer.args.process_index, world_size=trainer.args.world_size,
           local_rank=trainer.args.local_process_index, steps=result.global_step, per_device=per_device,
           checksum=checksum(trainer.model))


if __name__ == "__main__":
    main()
