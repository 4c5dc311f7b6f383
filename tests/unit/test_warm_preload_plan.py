"""The zygote's preload plan (decision 0498): what a job's script imports, read from its
source, without the standard library or the script's own modules."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from trainguard.schedulers.preload import describe, plan_for, script_imports, torchrun_target


def test_the_target_is_the_first_argument_that_is_no_option_or_option_value() -> None:
    assert torchrun_target(["--nproc-per-node", "4", "--standalone", "train.py", "--lr", "1"]) == (
        "train.py", False,
    )  # fmt: skip
    assert torchrun_target(["--nnodes=2", "--rdzv-endpoint", "h:29500", "-m", "pkg.train"]) == (
        "pkg.train", True,
    )  # fmt: skip
    assert torchrun_target(["--no-python", "--nproc-per-node", "2", "bash", "x.sh"]) is None
    assert torchrun_target(["--nproc-per-node", "2"]) is None


@given(
    st.lists(st.sampled_from(["--standalone", "--run-path", "--virtual-local-rank"]), max_size=4),
    st.lists(st.sampled_from(["--nnodes", "--max-restarts", "--log-dir"]), max_size=4),
)
def test_flags_and_valued_options_in_any_order_never_hide_the_script(
    flags: list[str], valued: list[str]
) -> None:
    args: list[str] = [*flags]
    for option in valued:
        args += [option, "3"]
    assert torchrun_target([*args, "train.py", "--epochs", "2"]) == ("train.py", False)


def test_third_party_imports_with_the_names_taken_in_first_seen_order(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text("import numpy as np\nfrom .x import y\n")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("from accelerate import Accelerator\n")
    script = tmp_path / "train.py"
    script.write_text(
        "from __future__ import annotations\n"
        "import os, sys, json\n"
        "import torch.distributed as dist\n"
        "from transformers import Trainer, TrainingArguments\n"
        "from transformers import Trainer\n"
        "import helpers\n"
        "from models import Net\n"
        "def main():\n"
        "    import lightning.pytorch as pl\n"
        "    from datasets import *\n"
    )
    assert script_imports(str(script)) == [
        "torch.distributed", "transformers:Trainer,TrainingArguments", "lightning.pytorch",
        "datasets", "numpy", "accelerate:Accelerator",
    ]  # fmt: skip


def test_an_unreadable_or_broken_script_gives_no_plan(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def (:\n")
    assert script_imports(str(tmp_path / "bad.py")) == []
    assert script_imports(str(tmp_path / "missing.py")) == []
    assert plan_for(["--standalone", "missing.py"], str(tmp_path)) == []


def test_a_module_launch_is_read_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("import transformers\n")
    assert plan_for(["--nproc-per-node", "1", "-m", "pkg.train"], str(tmp_path)) == ["transformers"]
    (tmp_path / "t.py").write_text("import yaml\n")
    assert plan_for(["--standalone", "t.py"], str(tmp_path)) == ["yaml"]


def test_the_start_note_names_the_first_few() -> None:
    assert describe([]) == ""
    assert describe(["a:X", "b"]) == ", preloading a, b"
    assert describe([f"m{i}" for i in range(8)], most=2) == ", preloading m0, m1 (+6 more)"
