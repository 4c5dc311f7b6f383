"""The Hugging Face ``Trainer`` script of hf_trainer_script.py with trainguard's one line.

Changed: ``callbacks=[TrainguardCallback()]`` (steps from every rank) and
``trainer.train(resume_from_checkpoint=resume_path(training_args.output_dir))`` instead
of the command-line ``--resume_from_checkpoint``. Everything else is that script's.
"""

from hf_trainer_script import ModelArguments, SyntheticText
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments

from trainguard.integrations.huggingface import TrainguardCallback
from trainguard.train import resume_path


def main():
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
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        callbacks=[TrainguardCallback()],
    )
    trainer.train(resume_from_checkpoint=resume_path(training_args.output_dir))


if __name__ == "__main__":
    main()
