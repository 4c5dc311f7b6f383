"""A Hugging Face ``Trainer`` script as the examples write it: ``HfArgumentParser``,
``TrainingArguments`` from the command line, ``trainer.train(resume_from_checkpoint=
training_args.resume_from_checkpoint)``. Nothing trainguard-specific.

Tiny GPT-2 built from a config (no download) and synthetic data; ``DATA_SLEEP``
paces the data loader (test pacing: real data takes time to load).
"""

import os
import time
from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    n_embd: int = field(default=32, metadata={"help": "hidden size of the tiny model"})
    n_layer: int = field(default=1)
    seq_len: int = field(default=16)
    num_samples: int = field(default=100000)


class SyntheticText(torch.utils.data.Dataset):
    def __init__(self, n, seq_len, vocab):
        self.n, self.seq_len, self.vocab = n, seq_len, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(float(os.environ.get("DATA_SLEEP", "0")))
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq_len,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


def setup():
    """The arguments, model and data (hf_trainer_integrated.py's too)."""
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses()
    config = GPT2Config(
        vocab_size=128,
        n_positions=model_args.seq_len,
        n_embd=model_args.n_embd,
        n_layer=model_args.n_layer,
        n_head=2,
    )
    model = GPT2LMHeadModel(config)
    train_dataset = SyntheticText(model_args.num_samples, model_args.seq_len, config.vocab_size)
    return training_args, model, train_dataset


def main():
    training_args, model, train_dataset = setup()
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)


if __name__ == "__main__":
    main()
