"""Lines in an attempt's log that are trainguard's, not the job's progress (0397)."""

from __future__ import annotations

from trainguard.diagnose.progress_lines import ProgressLineParser
from trainguard.signals.output import is_annotation, is_train_message


def test_the_header_and_markers_are_annotations() -> None:
    assert is_annotation("# trainguard attempt 1: torchrun --nproc-per-node 2 train.py")
    assert is_annotation("# CUDA_VISIBLE_DEVICES=0,2 TRAINGUARD_RESUME_FROM=/c/step_00000008")
    assert is_annotation("# trainguard: warm start: standby pid 42 ...")
    assert not is_annotation("step=8 loss=0.1")


def test_trainguard_train_messages_name_steps_that_are_not_progress() -> None:
    # The stock parser reads a step, or a checkpoint event at a step (0497), in each of
    # these lines: the rule is what keeps them out.
    lines = [
        "trainguard: resumed from /c/step_00000006 (step 6, source=TRAINGUARD_RESUME_FROM)",
        "trainguard: checkpoint step 9 saved to /c/step_00000009 in 0.10 s",
    ]
    parser = ProgressLineParser()
    readings = [parser.read(line) for line in lines]
    assert [r.step if r.is_step else r.count for r in readings if r is not None] == [6, 9]
    assert all(is_train_message(line) for line in lines)
    assert not is_train_message("step=8 loss=0.1")
    assert not is_train_message("[rank0]: step 8")
