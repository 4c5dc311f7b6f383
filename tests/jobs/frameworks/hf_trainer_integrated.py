"""The Hugging Face ``Trainer`` script of hf_trainer_script.py with trainguard's one line.

Changed: ``callbacks=[TrainguardCallback()]`` (steps from every rank) and
``trainer.train(resume_from_checkpoint=resume_path(training_args.output_dir))`` instead
of the command-line ``--resume_from_checkpoint``. Everything else is that script's.
"""

from hf_trainer_script import setup
from transformers import Trainer

from trainguard.integrations.huggingface import TrainguardCallback
from trainguard.train import resume_path


def main():
    training_args, model, train_dataset = setup()
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        callbacks=[TrainguardCallback()],
    )
    trainer.train(resume_from_checkpoint=resume_path(training_args.output_dir))


if __name__ == "__main__":
    main()
