"""Real Hugging Face Trainer and Lightning runs (tiny models from config, synthetic data, CPU).

Each run uses trainguard's callback and ``resume_path``, and what the framework
printed on its own is read back through the stock-output parser: the callback's
reports and the parser must agree on the steps, and a damaged newest checkpoint
sends ``resume_path`` to the one before it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from trainguard.diagnose.progress_lines import ProgressKind, ProgressLineParser
from trainguard.signals.output import LineSplitter
from trainguard.train import resume_path

torch = pytest.importorskip("torch")


def reported(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_of(events: list[dict[str, Any]]) -> list[int]:
    return list(dict.fromkeys(e["step"] for e in events if e["event"] == "progress"))


def parsed(text: str) -> tuple[list[int], int]:
    """Steps (deduplicated, in order) and the number of liveness readings in ``text``."""
    splitter = LineSplitter()
    parser = ProgressLineParser()
    steps: list[int] = []
    live = 0
    for raw in splitter.feed(text.encode()) + splitter.flush():
        r = parser.read(raw.decode())
        if r is None:
            continue
        if r.kind is ProgressKind.STEP:
            steps.append(r.step or 0)
        else:
            live += 1
    return list(dict.fromkeys(steps)), live


def damage(path: Path) -> None:
    """Cut a file in half, as a node dying mid-write would."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.fixture
def progress_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("TRAINGUARD_PROGRESS", f"file:{path}")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("TRAINGUARD_RESUME_FROM", raising=False)
    monkeypatch.delenv("TRAINGUARD_DRY_RUN", raising=False)
    return path


# --- Hugging Face Trainer --------------------------------------------------------------


class _Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _hf_trainer(out: Path, max_steps: int) -> Any:
    transformers = pytest.importorskip("transformers")
    from trainguard.integrations.huggingface import TrainguardCallback

    transformers.logging.set_verbosity_warning()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        logging_steps=2,
        save_steps=3,
        eval_strategy="steps",
        eval_steps=3,
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )
    return transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=_Tokens(64, 1),
        eval_dataset=_Tokens(16, 2),
        callbacks=[TrainguardCallback()],
    )


def test_hf_trainer_reports_steps_and_resumes_past_a_damaged_checkpoint(
    tmp_path: Path, progress_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert resume_path(out) is None  # fresh start: nothing to resume, no error
    _hf_trainer(out, max_steps=6).train(resume_from_checkpoint=resume_path(out))
    first = reported(progress_file)
    assert steps_of(first) == [1, 2, 3, 4, 5, 6]
    losses = [e for e in first if e.get("loss") is not None]
    assert [e["step"] for e in losses] == [2, 4, 6]  # logging_steps=2, loss from on_log
    # The logged gradient norm goes with it: the training-health monitor reads both (0520).
    assert all(isinstance(e["metrics"].get("grad_norm"), float) for e in losses)
    # The Trainer's own tqdm output, split at \r: the training bar gives the steps it
    # drew (tqdm skips redraws within 0.1 s), in order, up to the last; its opening 0/6
    # and the evaluation bars (4 batches each) are liveness only.
    printed = capsys.readouterr().err
    steps, live = parsed(printed)
    assert steps == sorted(set(steps)) and steps[-1] == 6 and set(steps) <= {1, 2, 3, 4, 5, 6}
    assert live > 0 and "4/4" in printed  # the evaluation bar was drawn, and not a step

    assert resume_path(out) == str(out / "checkpoint-6")
    damage(out / "checkpoint-6" / "model.safetensors")
    chosen = resume_path(out)
    assert chosen == str(out / "checkpoint-3")

    progress_file.unlink()
    _hf_trainer(out, max_steps=8).train(resume_from_checkpoint=chosen)
    assert steps_of(reported(progress_file)) == [4, 5, 6, 7, 8]


# --- Lightning ---------------------------------------------------------------------------


def _lightning_run(ckpt_dir: Path, max_steps: int, ckpt_path: str | None) -> Any:
    lp = pytest.importorskip("lightning.pytorch")
    from trainguard.integrations.lightning import TrainguardCallback

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Tiny(lp.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
    checkpointing = lp.callbacks.ModelCheckpoint(
        dirpath=str(ckpt_dir), every_n_train_steps=2, save_top_k=-1, save_last=True
    )
    trainer = lp.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_model_summary=False,
        callbacks=[TrainguardCallback(), checkpointing, lp.callbacks.TQDMProgressBar()],
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8), ckpt_path=ckpt_path)
    return trainer


def test_lightning_fit_reports_steps_and_resumes_past_a_damaged_checkpoint(
    tmp_path: Path, progress_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpts = tmp_path / "checkpoints"
    _lightning_run(ckpts, max_steps=6, ckpt_path=resume_path(ckpts))
    first = reported(progress_file)
    assert steps_of(first) == [1, 2, 3, 4, 5, 6]
    assert all(isinstance(e.get("loss"), float) for e in first)  # CPU loss: reported
    # Lightning's bar counts batches within an epoch ("Epoch 1: 20%| 1/5"): never a step.
    printed = capsys.readouterr()
    steps, live = parsed(printed.err + printed.out)
    assert steps == [] and live > 0

    newest = resume_path(ckpts)
    assert newest is not None and newest.endswith(".ckpt")
    for path in ckpts.iterdir():
        if path.name == "last.ckpt" or "step=6" in path.name:
            damage(path)
    chosen = resume_path(ckpts)
    assert chosen is not None and Path(chosen).name == "epoch=0-step=4.ckpt"

    progress_file.unlink()
    _lightning_run(ckpts, max_steps=8, ckpt_path=chosen)
    assert steps_of(reported(progress_file)) == [5, 6, 7, 8]


def test_lightning_last_ckpt_counts_by_the_global_step_inside(
    tmp_path: Path, progress_file: Path
) -> None:
    ckpts = tmp_path / "checkpoints"
    _lightning_run(ckpts, max_steps=4, ckpt_path=None)
    from trainguard.checkpoints import validate

    last = validate(ckpts / "last.ckpt")
    assert last.valid and last.step == 4 and last.step_source == "global_step"
