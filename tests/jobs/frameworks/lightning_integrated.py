"""The Lightning script of lightning_script.py with trainguard's one line.

Changed: ``TrainguardCallback()`` in the callbacks (steps from every rank) and
``ckpt_path=resume_path(args.ckpt_dir)`` instead of ``ckpt_path=None``. Everything
else is that script's.
"""

from lightning_script import TinyRegressor, setup

from trainguard.integrations.lightning import TrainguardCallback
from trainguard.train import resume_path


def main():
    args, trainer, loader = setup([TrainguardCallback()])
    trainer.fit(TinyRegressor(), loader, ckpt_path=resume_path(args.ckpt_dir))


if __name__ == "__main__":
    main()
