"""Progress from stock output: a step counter is told apart from bars and lines that only show life.

Lines are the ones the frameworks print: tqdm and rich render them here with the
format strings transformers' ProgressCallback and Lightning's progress bars use;
the others are written as Megatron's training_log, torchtitan's metrics logger,
transformers' Trainer (str() of its log dict, floats pre-formatted since 5.x)
and the PyTorch tutorials print them.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.diagnose.progress_lines import (
    ProgressKind,
    ProgressLineParser,
    ProgressReading,
    clean_line,
)
from trainguard.signals.output import LineSplitter, split_lines

LIGHTNING_BAR_FORMAT = (
    "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
)


def tqdm_frames(**kwargs: object) -> list[str]:
    """Every frame a real tqdm bar draws (it redraws with \\r), split as the follower does."""
    tqdm = pytest.importorskip("tqdm").tqdm
    steps = int(kwargs.pop("steps"))  # type: ignore[call-overload]
    postfix = kwargs.pop("postfix", None)
    out = io.StringIO()
    bar = tqdm(file=out, mininterval=0, miniters=1, ncols=100, ascii=False, **kwargs)
    for _ in range(steps):
        if postfix is not None:
            bar.set_postfix(postfix, refresh=False)
        bar.update(1)
    bar.close()
    splitter = LineSplitter()
    lines = splitter.feed(out.getvalue().encode()) + splitter.flush()
    return [x.decode() for x in lines if x.strip()]


def readings(parser: ProgressLineParser, lines: list[str]) -> list[ProgressReading]:
    return [r for r in (parser.read(x) for x in lines) if r is not None]


# --- tqdm ------------------------------------------------------------------------------


def test_hf_trainer_bar_counts_global_steps_and_its_opening_frame_is_not_step_zero() -> None:
    # transformers ProgressCallback: tqdm(total=state.max_steps, dynamic_ncols=True).
    frames = tqdm_frames(total=600, steps=5)
    parser = ProgressLineParser()
    got = readings(parser, frames)
    assert got[0].kind is ProgressKind.LIVENESS and got[0].count == 0 and got[0].total == 600
    # close() redraws the last frame once more: the same step again, no new progress.
    assert list(dict.fromkeys(r.step for r in got[1:])) == [1, 2, 3, 4, 5]
    assert all(r.form == "tqdm" and r.is_step for r in got[1:])


def test_resumed_hf_bar_jumps_from_zero_to_the_restored_step() -> None:
    # After a resume the Trainer's bar opens at 0 and its first update jumps to
    # global_step: 0/600 must not read as "restarted at step 0".
    tqdm = pytest.importorskip("tqdm").tqdm
    out = io.StringIO()
    bar = tqdm(total=600, file=out, mininterval=0, miniters=1, ncols=100)
    bar.update(251)
    bar.update(1)
    bar.close()
    lines, rest = split_lines(out.getvalue().encode())
    parser = ProgressLineParser()
    steps = [parser.parse(x.decode()) for x in [*lines, rest]]
    assert list(dict.fromkeys(s for s in steps if s is not None)) == [251, 252]


def test_hf_evaluation_bar_after_the_training_bar_is_liveness() -> None:
    parser = ProgressLineParser()
    train = readings(parser, tqdm_frames(total=600, steps=3))
    evaluation = readings(parser, tqdm_frames(total=8, steps=8))
    assert list(dict.fromkeys(r.step for r in train if r.is_step)) == [1, 2, 3]
    assert evaluation and all(r.kind is ProgressKind.LIVENESS for r in evaluation)
    assert evaluation[-1].count == 8 and evaluation[-1].total == 8
    # The training bar goes on counting after the evaluation.
    assert parser.parse(" 1%|          | 4/600 [00:01<02:30,  4.00it/s]") == 4


@pytest.mark.parametrize(
    ("desc", "unit"),
    [
        ("Map", " examples"),  # datasets
        ("Loading checkpoint shards", "it"),  # transformers from_pretrained
        ("Saving the dataset (1/1 shards)", " examples"),
        ("Writing model shards", "it"),
        ("Downloading data", "B"),
        ("Evaluating", "it"),
        ("Validation DataLoader 0", "it"),  # Lightning
        ("Sanity Checking DataLoader 0", "it"),
        ("Tokenizing", "ba"),
    ],
)
def test_bars_doing_other_work_are_liveness(desc: str, unit: str) -> None:
    parser = ProgressLineParser()
    got = readings(parser, tqdm_frames(total=40, steps=40, desc=desc, unit=unit))
    assert got and all(r.kind is ProgressKind.LIVENESS for r in got)
    assert got[-1].label.startswith(desc.split(" (")[0])
    # ...and they do not claim the step counter: the training bar still counts.
    train = readings(parser, tqdm_frames(total=600, steps=2))
    assert list(dict.fromkeys(r.step for r in train if r.is_step)) == [1, 2]


def test_lightning_tqdm_bar_is_a_per_epoch_batch_index() -> None:
    # TQDMProgressBar: desc "Epoch {current_epoch}", total = batches per epoch.
    parser = ProgressLineParser()
    frames = tqdm_frames(
        total=10,
        steps=4,
        desc="Epoch 3",
        bar_format=LIGHTNING_BAR_FORMAT,
        postfix={"v_num": 0, "train_loss": 0.5},
    )
    got = readings(parser, frames)
    assert all(r.kind is ProgressKind.LIVENESS and r.epoch == 3 for r in got)
    assert got[-1].count == 4 and got[-1].total == 10 and got[-1].loss == 0.5


def test_slow_bar_with_inverse_rate_and_unit_scaled_counts() -> None:
    parser = ProgressLineParser()
    assert parser.parse(" 42%|####2     | 252/600 [05:10<07:14,  1.23s/it]") == 252
    # A scaled count ("1.2k") is approximate: liveness, never a step.
    scaled = parser.read(" 20%|██        | 1.2k/6.0k [00:10<00:40, 120it/s]")
    assert scaled is not None and scaled.kind is ProgressKind.LIVENESS


def test_bar_without_total_is_liveness_unless_it_names_steps() -> None:
    p = ProgressLineParser()
    bare = p.read("252it [00:10, 24.50it/s]")
    assert bare is not None and bare.kind is ProgressKind.LIVENESS and bare.count == 252
    named = ProgressLineParser().read("Training: 252it [00:10, 24.50it/s]")
    assert named is not None and named.is_step and named.step == 252


# --- rich --------------------------------------------------------------------------------


def test_lightning_rich_bar_is_liveness_with_epoch_and_loss() -> None:
    rich_console = pytest.importorskip("rich.console")
    rich_progress = pytest.importorskip("rich.progress")
    out = io.StringIO()
    console = rich_console.Console(file=out, force_terminal=True, width=120, color_system=None)
    # The columns of Lightning's RichProgressBar: description, bar, n/total, time, speed, metrics.
    with rich_progress.Progress(
        rich_progress.TextColumn("{task.description}"),
        rich_progress.BarColumn(),
        rich_progress.TextColumn("{task.completed}/{task.total}"),
        rich_progress.TimeElapsedColumn(),
        rich_progress.TextColumn("3.50it/s v_num: 0 train_loss: 0.500"),
        console=console,
        auto_refresh=False,
    ) as progress:
        task = progress.add_task("Epoch 3/9", total=10)
        for _ in range(4):
            progress.advance(task)
            progress.refresh()
    lines, rest = split_lines(out.getvalue().encode())
    parser = ProgressLineParser()
    got = readings(parser, [x.decode() for x in [*lines, rest]])
    assert got and all(r.kind is ProgressKind.LIVENESS for r in got)
    assert got[-1].form == "rich"
    assert got[-1].epoch == 3 and got[-1].count == 4 and got[-1].total == 10
    assert got[-1].loss == 0.5


# --- records -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        # transformers >= 5: ProgressCallback.on_log writes str() of floats pre-formatted.
        "{'loss': '0.6931', 'grad_norm': '1.234', 'learning_rate': '4.5e-05', 'epoch': '0.5'}",
        # transformers 4.x: plain floats.
        "{'loss': 0.6931, 'grad_norm': 1.234, 'learning_rate': 4.5e-05, 'epoch': 0.5}",
        # numpy 2 scalars in a hand-written callback.
        "{'loss': np.float64(0.6931), 'epoch': np.float64(0.5)}",
    ],
)
def test_hf_trainer_log_dict_is_liveness_with_loss_and_epoch(line: str) -> None:
    r = ProgressLineParser().read(line)
    assert r is not None and r.form == "hf_log" and r.kind is ProgressKind.LIVENESS
    assert r.loss == pytest.approx(0.6931) and r.epoch == 0.5


def test_hf_eval_and_summary_dicts_are_liveness() -> None:
    p = ProgressLineParser()
    summary = p.read(
        "{'train_runtime': '12.34', 'train_samples_per_second': '81.0', "
        "'train_steps_per_second': '10.1', 'train_loss': '0.51', 'epoch': '3'}"
    )
    evaluation = p.read("{'eval_loss': '0.48', 'eval_runtime': '0.5', 'epoch': '1'}")
    assert summary is not None and summary.kind is ProgressKind.LIVENESS
    assert summary.loss == 0.51 and summary.epoch == 3
    assert evaluation is not None and evaluation.kind is ProgressKind.LIVENESS


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ('{"step": 120, "loss": 2.3}', 120),
        ('{"global_step": 7, "epoch": 0.1}', 7),
        ('{"iteration": 1000, "lm_loss": 1.5}', 1000),
        ('{"train/global_step": 42, "train/loss": 0.9}', 42),
        ("{'loss': '0.5', 'step': 250}", 250),  # log_history entries printed by a script
        ('[rank0]: {"step": 3.0, "loss": 1}', 3),
    ],
)
def test_records_with_a_step_key_give_the_step(line: str, step: int) -> None:
    r = ProgressLineParser().read(line)
    assert r is not None and r.is_step and r.step == step


@pytest.mark.parametrize(
    "line",
    [
        '{"step": -1}',
        '{"step": "soon"}',
        '{"name": "config", "hidden_size": 768}',
        "{'model_type': 'gpt2', 'n_layer': 2}",
        '{"step": true}',
    ],
)
def test_records_without_a_usable_step_or_training_keys_are_not_steps(line: str) -> None:
    r = ProgressLineParser().read(line)
    assert r is None or not r.is_step


# --- Megatron, torchtitan, tutorials ------------------------------------------------------


def test_megatron_training_log_line() -> None:
    line = (
        " [2024-05-01 10:00:00] iteration      120/   10000 | consumed samples:        15360 |"
        " elapsed time per iteration (ms): 312.4 | learning rate: 1.500000E-04 |"
        " global batch size:   128 | lm loss: 2.345678E+00 | loss scale: 1.0 |"
        " grad norm: 0.812 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    r = ProgressLineParser().read(line)
    assert r is not None and r.form == "megatron" and r.step == 120 and r.total == 10000
    assert r.loss == pytest.approx(2.345678)


def test_torchtitan_metrics_line_with_colours_and_rank_prefix() -> None:
    line = (
        "[rank0]:[titan] 2025-01-01 12:00:00,000 - root - INFO - \x1b[31mstep:  5  "
        "\x1b[32mloss:  8.1234  \x1b[33mmemory: 12.30GiB(15.20%)  \x1b[34mtps: 1,234  "
        "\x1b[36mtflops: 12.34  \x1b[35mmfu: 3.21%\x1b[39m"
    )
    r = ProgressLineParser().read(line)
    assert r is not None and r.form == "torchtitan" and r.step == 5 and r.loss == 8.1234
    assert "\x1b" not in clean_line(line) and not clean_line(line).startswith("[rank0]")


@pytest.mark.parametrize(
    ("line", "epoch", "count"),
    [
        ("Epoch [1/10], Step [100/600], Loss: 0.2134", 1, 100),  # pytorch-tutorial
        ("Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.512345", 1, 640),  # examples/mnist
        ("Epoch 1 [250/1000] loss 0.3", 1, 250),
        ("[GPU0] Epoch 6 | Batchsize: 32 | Steps: 64", 6, None),  # the DDP tutorial
        ("epoch 2 batch 17/50 loss=1.2", 2, 17),
    ],
)
def test_counters_within_an_epoch_are_liveness(line: str, epoch: int, count: int | None) -> None:
    r = ProgressLineParser().read(line)
    assert r is not None and r.kind is ProgressKind.LIVENESS
    assert r.epoch == epoch and r.count == count


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("Epoch 0, global step 50: 'val_loss' reached 0.51 (best 0.51), saving model", 50),
        ("epoch 3 step 1200 loss 0.25", 1200),  # a bare step beside an epoch is global
        ("global_step=77 lr=1e-4", 77),
        # What a script prints for trainer.train()'s result.
        ("TrainOutput(global_step=600, training_loss=0.51, metrics={'train_runtime': 12.3})", 600),
    ],
)
def test_global_step_next_to_an_epoch_is_the_step(line: str, step: int) -> None:
    r = ProgressLineParser().read(line)
    assert r is not None and r.is_step and r.step == step


def test_custom_pattern_is_the_only_source_of_steps() -> None:
    p = ProgressLineParser(r"done (\d+) batches")
    assert p.parse("done 17 batches") == 17
    bar = p.read(" 42%|████▏     | 252/600 [00:10<00:14, 24.50it/s]")
    record = p.read('{"step": 5}')
    assert bar is not None and bar.kind is ProgressKind.LIVENESS and bar.count == 252
    assert record is not None and record.kind is ProgressKind.LIVENESS
    assert p.parse("step=3") is None


@pytest.mark.parametrize(
    "line",
    [
        "2024-05-01 10:00:00,123 INFO loading weights from /data/shard-00003-of-00008.bin",
        "  Total optimization steps = 600",  # the Trainer's start-up banner
        "  Num Epochs = 3",
        "  Gradient Accumulation steps = 4",
        "lr_scheduler: step_size=30 gamma=0.1",
        "Saving model checkpoint to out/checkpoint-250",
        # Lightning, restoring: the step in a checkpoint's file name is not progress.
        "Restoring states from the checkpoint path at /ck/epoch=0-step=20.ckpt",
        "Restored all states from the checkpoint at /ck/last-step=40.ckpt",
        "loaded /ckpt/iter_0000300/mp_rank_00/model_optim_rng.pt",
        # Slurm names job 20's step 0 in the output of a job it cancels (issue 13).
        "slurmstepd-n1: error: *** STEP 20.0 ON n1 CANCELLED AT 2026-12-02T13:31:48 DUE TO"
        " NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***",
        "x" * 70000 + " 5",
    ],
)
def test_ordinary_log_lines_say_nothing_about_progress(line: str) -> None:
    assert ProgressLineParser().read(line) is None


def test_unsplit_carriage_returns_read_the_last_frame() -> None:
    p = ProgressLineParser()
    p.read("  0%|          | 0/600 [00:00<?, ?it/s]")
    line = " 0%|  | 1/600 [00:00<?, 9it/s]\r 0%|  | 2/600 [00:00<?, 9it/s]\r"
    assert p.parse(line) == 2


# --- splitting ---------------------------------------------------------------------------


def test_line_splitter_handles_cr_lf_crlf_across_reads_and_cuts_long_lines() -> None:
    s = LineSplitter(max_line=8)
    assert s.feed(b"a\r\nb\rc\n\nd\r") == [b"a", b"b", b"c", b"", b"d"]
    assert s.feed(b"\ne") == []  # the \n completes the \r of the previous read
    assert s.feed(b"0123456789") == [b"e0123456"]
    assert s.flush() == [b"789"]
    assert s.flush() == []


@given(st.lists(st.binary(max_size=40), max_size=20))
def test_line_splitter_loses_no_bytes_but_terminators(chunks: list[bytes]) -> None:
    s = LineSplitter(max_line=16)
    lines = [line for c in chunks for line in s.feed(c)] + s.flush()
    data = b"".join(chunks)
    assert b"".join(lines) == data.replace(b"\r", b"").replace(b"\n", b"")
    assert all(len(x) <= 16 and b"\r" not in x and b"\n" not in x for x in lines)


@given(st.text(max_size=300))
def test_parser_never_raises_and_steps_are_never_negative(line: str) -> None:
    r = ProgressLineParser().read(line)
    if r is not None:
        assert (r.step is not None) == r.is_step
        assert r.step is None or r.step >= 0


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["", "Training", "Steps"]))
def test_an_opening_frame_is_never_a_step(total: int, desc: str) -> None:
    prefix = f"{desc}: " if desc else ""
    line = f"{prefix}  0%|          | 0/{total} [00:00<?, ?it/s]"
    r = ProgressLineParser().read(line)
    assert r is not None and r.kind is ProgressKind.LIVENESS and r.count == 0


def test_a_json_progress_line_carries_the_jobs_own_time_and_rank() -> None:
    # Decision 0320: a Unix time in the record is when the job made the step; a
    # "time" that is a duration (mmengine logs the iteration time so) is no clock.
    p = ProgressLineParser()
    r = p.read('{"step": 12, "time": 1764400000.25, "rank": 1, "loss": 2.0}')
    assert r is not None and r.is_step and (r.step, r.at, r.rank) == (12, 1764400000.25, 1)
    ts = p.read('{"iteration": 3, "timestamp": "1764400001"}')
    assert ts is not None and ts.at == 1764400001.0 and ts.rank is None
    for line in ('{"step": 5, "time": 0.21}', '{"step": 5}', '{"step": 5, "time": "NaN"}'):
        got = p.read(line)
        assert got is not None and got.step == 5 and got.at is None
    hf = p.read("{'loss': '0.69', 'step': 7, 'time': 1764400000.0}")
    assert hf is not None and hf.step == 7 and hf.at is None  # Trainer's dicts: no clock


# --- a frame is read when it is drawn (decision 0496) -----------------------------------

# A real tqdm bar on a pipe, one update per line on stdin: the test decides when each
# frame is drawn and checks it is read before the next one exists.
PACED_BAR = """
import sys
from tqdm import tqdm
bar = tqdm(total=5, file=sys.stdout, mininterval=0, miniters=1, ncols=80, desc="train")
for _ in range(5):
    sys.stdin.readline()
    bar.update(1)
sys.stdin.readline()
bar.close()
print("done", flush=True)
"""


def _read_until(fd: int, splitter: LineSplitter, want: str, timeout: float = 20.0) -> list[str]:
    import os
    import select
    import time

    got: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(want in x for x in got):
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], f"{want!r} not read: {got}"
        data = os.read(fd, 65536)
        assert data, f"end of stream before {want!r}: {got}"
        got += [x.decode() for x in splitter.feed(data)]
    return got


def test_a_tqdm_frame_on_a_pipe_is_a_line_when_drawn_not_at_the_next_redraw() -> None:
    import subprocess
    import sys

    pytest.importorskip("tqdm")
    child = subprocess.Popen(
        [sys.executable, "-c", PACED_BAR],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    splitter, parser = LineSplitter(), ProgressLineParser()
    fd = child.stdout.fileno()
    try:
        opening = _read_until(fd, splitter, "0/5")
        assert readings(parser, opening)[-1].count == 0
        for step in range(1, 6):
            child.stdin.write(b"\n")
            child.stdin.flush()
            # The frame of `step` is drawn, and the child waits: nothing else comes until
            # the test asks for the next update, so it is read now or never.
            lines = _read_until(fd, splitter, f"{step}/5")
            frame = next(x for x in lines if f"{step}/5" in x)
            assert frame.startswith("train:") and frame.rstrip().endswith("]")
            [reading] = readings(parser, [frame])
            assert reading.is_step and reading.step == step
        child.stdin.close()
        rest = _read_until(fd, splitter, "done")
        assert child.wait(20) == 0
    finally:
        child.kill()
    # tqdm's closing "\n" ends the last frame: no empty line, no frame twice.
    assert rest[-1] == "done" and "" not in rest and not any("5/5" in x for x in rest[:-1][1:])


def test_a_drawn_frame_split_from_its_closing_newline_is_one_line() -> None:
    s = LineSplitter()
    assert s.feed(b"\r 40%|####  | 2/5 [00:01<00:01,  2.00it/s]") == [
        b"",
        b" 40%|####  | 2/5 [00:01<00:01,  2.00it/s]",
    ]
    assert s.feed(b"\r 60%|###### | 3/5 [00:01<00:01,  2.00it/s]   ") == [
        b" 60%|###### | 3/5 [00:01<00:01,  2.00it/s]   "
    ]  # tqdm pads a shorter frame with spaces over the longer one before it
    assert s.feed(b"\nnext line\n") == [b"next line"]
    # Not a frame: text after a \n, or after a \r that does not end in "]", waits.
    assert s.feed(b"[rank0] loss [0.5]") == []
    assert s.feed(b"\r 3/5 [00:01") == [b"[rank0] loss [0.5]"]
    assert s.feed(b"<00:01]") == [b" 3/5 [00:01<00:01]"]
    assert s.flush() == []


def test_split_lines_gives_a_drawn_frame_at_the_end_of_a_chunk() -> None:
    # The engine tails the attempt's log in chunks: the bar's newest frame is progress
    # now, not when the next chunk brings the next redraw.
    lines, rest = split_lines(
        b"epoch 1\n\r 20%|##  | 1/5 [00:00<00:02]\r 40%|#### | 2/5 [00:00<00:01]"
    )
    assert lines == [
        b"epoch 1",
        b"",
        b" 20%|##  | 1/5 [00:00<00:02]",
        b" 40%|#### | 2/5 [00:00<00:01]",
    ]
    assert rest == b""
    lines, rest = split_lines(b"\r 40%|#### | 2/5 [00:0")
    assert lines == [b""] and rest == b" 40%|#### | 2/5 [00:0"


# --- checkpoint events are not steps (decision 0497) ------------------------------------


@pytest.mark.parametrize(
    ("line", "event", "count"),
    [
        # torchtitan (CheckpointManager.load / _save_last_step)
        ("[titan] 2026-12-05 08:00:00,000 - root - INFO - Loading the checkpoint at step 40.",
         "load", 40),
        ("Saving a full checkpoint at last step, step 1000.", "save", 1000),
        # Megatron-LM (checkpointing.py)
        (" loading checkpoint from /ck at iteration 40", "load", 40),
        ("  successfully loaded checkpoint from /ck [ t 1/1, p 1/1 ] at iteration 40",
         "load", 40),
        ("saving checkpoint at iteration      40 to /ck in torch_dist format", "save", 40),
        ("  successfully saved checkpoint from iteration      40 to /ck [ t 1/1, p 1/1 ]",
         "save", 40),
        # transformers Trainer: its resume banner
        ("  Continuing training from global step 40", "load", 40),
        # generic scripts
        ("Resuming training from checkpoint with epoch 0 and global step 250", "load", 250),
        ("[rank0]: loaded checkpoint step=40 from /ck/step_00000040", "load", 40),
        ("checkpoint saved at step 40 (/ck/step-40)", "save", 40),
    ],
)  # fmt: skip
def test_a_checkpoint_loaded_or_saved_at_a_step_is_no_trained_step(
    line: str, event: str, count: int
) -> None:
    r = ProgressLineParser().read(line)
    assert r is not None and r.kind is ProgressKind.CHECKPOINT and not r.is_step
    assert r.step is None and r.count == count and r.event == event
    # Saving happens while training; loading is start-up, as a banner is.
    assert r.is_liveness is (event == "save")


@pytest.mark.parametrize(
    "line",
    [
        # Files and directories named after a step, with no step number left: nothing.
        "Saving model checkpoint to out/checkpoint-40",  # transformers Trainer
        "Loading states from out/checkpoints/checkpoint_3",  # accelerate load_state
        "Saving current state to out/checkpoints/checkpoint_3",  # accelerate save_state
        "[Torch] Checkpoint global_step40 is about to be saved!",  # DeepSpeed
        "Finished saving the checkpoint (or staging if async is enabled)in 0.12 seconds.",
    ],
)
def test_checkpoint_lines_without_a_step_say_nothing(line: str) -> None:
    assert ProgressLineParser().read(line) is None


def test_the_first_step_after_a_restore_is_the_first_trained_one() -> None:
    # What a torchtitan job prints after a restart: the load names step 40, the first
    # step it trains is 41 (logged at 50 with --log-every 10).
    p = ProgressLineParser()
    lines = [
        "Loading the checkpoint at step 40.",
        "Finished loading the checkpoint in 0.05 seconds.",
        "step: 50  loss:  7.1234  memory:  1.23GiB(3.1%)",
        "Saving the checkpoint (or staging if async is enabled).",
        "saving checkpoint at iteration 50 to /ck",
    ]
    got = readings(p, lines)
    assert [r.step for r in got if r.is_step] == [50]
    assert [r.kind for r in got] == [
        ProgressKind.CHECKPOINT, ProgressKind.STEP, ProgressKind.CHECKPOINT
    ]  # fmt: skip
    assert [r.is_liveness for r in got] == [False, False, True]


def test_step_lines_that_mention_checkpoints_in_structured_forms_stay_steps() -> None:
    p = ProgressLineParser()
    record = p.read('{"step": 40, "loss": 0.5, "note": "checkpoint saved"}')
    assert record is not None and record.is_step and record.step == 40
    bar = p.read(" 7%|7         | 40/600 [00:10<02:20, 4.00it/s, checkpoint=saved]")
    assert bar is not None and bar.is_step and bar.step == 40
    # A loss was computed: a step trained, even where the line names the checkpoint saved.
    demo = p.read("step   3  loss 0.1234  checkpoint -> /out/saved/step_00000003")
    assert demo is not None and demo.is_step and demo.step == 3
    # Lightning's ModelCheckpoint: the step has been trained, the file is written after.
    mc = p.read("Epoch 0, global step 50: 'val_loss' reached 0.51 (best 0.51), saving model")
    assert mc is not None and mc.is_step and mc.step == 50
