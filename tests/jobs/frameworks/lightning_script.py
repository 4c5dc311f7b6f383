"""A Lightning script as people write it: a ``LightningModule``, ``ModelCheckpoint(
every_n_train_steps=...)``, ``trainer.fit(model, loader, ckpt_path=None)``. Nothing
trainguard-specific: it does NOT resume (``ckpt_path=None``), so after a restart it
trains from step 0 again whatever checkpoint it is offered.

Run under torchrun (Lightning joins torchrun's processes) or by itself with
``--devices 2`` (Lightning's own launcher: this process is rank 0 and starts the
others). ``DATA_SLEEP`` paces the data loader (test pacing).
"""

import argparse
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset


class RandomData(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(float(os.environ.get("DATA_SLEEP", "0")))
        return torch.randn(32), torch.randn(1)


class TinyRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def setup(extra_callbacks=()):
    """The arguments, trainer and data (lightning_integrated.py's too)."""
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
        callbacks=[checkpoint, *extra_callbacks],
        logger=False,
        enable_model_summary=False,
    )
    loader = DataLoader(RandomData(100000), batch_size=8, num_workers=0)
    return args, trainer, loader


def main():
    _, trainer, loader = setup()
    trainer.fit(TinyRegressor(), loader, ckpt_path=None)


if __name__ == "__main__":
    main()
