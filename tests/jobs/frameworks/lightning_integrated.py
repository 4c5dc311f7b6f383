"""The Lightning script of lightning_script.py with trainguard's one line.

Changed: ``TrainguardCallback()`` in the callbacks (steps from every rank) and
``ckpt_path=resume_path(args.ckpt_dir)`` instead of ``ckpt_path=None``. Everything
else is that script's.
"""

import argparse

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_script import RandomData, TinyRegressor
from torch.utils.data import DataLoader

from trainguard.integrations.lightning import TrainguardCallback
from trainguard.train import resume_path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", default="checkpoints")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    checkpoint = ModelCheckpoint(
        dirpath=args.ckpt_dir, every_n_train_steps=args.every, save_top_k=-1
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp",
        max_steps=args.max_steps,
        callbacks=[checkpoint, TrainguardCallback()],
        logger=False,
        enable_model_summary=False,
    )
    loader = DataLoader(RandomData(100000), batch_size=8, num_workers=0)
    trainer.fit(TinyRegressor(), loader, ckpt_path=resume_path(args.ckpt_dir))


if __name__ == "__main__":
    main()
