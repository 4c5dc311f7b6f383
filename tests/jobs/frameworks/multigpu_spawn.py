"""The PyTorch DDP tutorial's ``multigpu.py`` (``mp.spawn``), as people copy it.

From the "Multi GPU training with DDP" tutorial: the script is no rank itself;
``mp.spawn`` starts one process per device and passes each its rank as the first
argument, so no rank has ``RANK``/``LOCAL_RANK`` in its environment. Nothing
trainguard-specific. The changes from the tutorial are the ones a CPU user makes
(gloo and ``--world_size`` when there is no GPU, ``MASTER_PORT`` from the
environment when the fixed one is taken), ``BATCH_SLEEP`` (test pacing) and
``TG_TEST_KILL_*`` (the test's fault: rank ``TG_TEST_KILL_RANK`` SIGKILLs itself at
epoch ``TG_TEST_KILL_EPOCH`` once, writing the time it did to ``TG_TEST_KILL_MARK``).
"""

import os
import signal
import sys
import time

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "12355")
    if torch.cuda.is_available():
        torch.cuda.set_device(rank)
        init_process_group(backend="nccl", rank=rank, world_size=world_size)
    else:
        init_process_group(backend="gloo", rank=rank, world_size=world_size)


class Trainer:
    def __init__(self, model, train_data, optimizer, gpu_id, save_every):
        self.gpu_id = gpu_id
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        time.sleep(float(os.environ.get("BATCH_SLEEP", "0")))

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(
            f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}"
        )
        sys.stdout.flush()
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def _save_checkpoint(self, epoch):
        ckp = self.model.module.state_dict()
        path = os.environ.get("CHECKPOINT_PATH", "checkpoint.pt")
        torch.save(ckp, path)
        print(f"Epoch {epoch} | Training checkpoint saved at {path}")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            _test_fault(self.gpu_id, epoch)
            self._run_epoch(epoch)
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def _test_fault(rank, epoch):
    mark = os.environ.get("TG_TEST_KILL_MARK")
    if not mark or os.path.exists(mark):
        return
    if rank == int(os.environ["TG_TEST_KILL_RANK"]) and epoch == int(
        os.environ["TG_TEST_KILL_EPOCH"]
    ):
        with open(mark, "w") as fh:
            fh.write(f"{os.getpid()} {time.time()}")
        os.kill(os.getpid(), signal.SIGKILL)


def load_train_objs():
    train_set = MyTrainDataset(2048)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=False,
        shuffle=False,
        sampler=DistributedSampler(dataset),
    )


def main(rank, world_size, save_every, total_epochs, batch_size):
    ddp_setup(rank, world_size)
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, rank, save_every)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument(
        "--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)"
    )
    parser.add_argument("--world_size", default=torch.cuda.device_count(), type=int)
    args = parser.parse_args()

    world_size = args.world_size
    mp.spawn(
        main,
        args=(world_size, args.save_every, args.total_epochs, args.batch_size),
        nprocs=world_size,
    )
