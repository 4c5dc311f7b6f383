"""The replica digest (trainguard.train.replicas): every single flipped bit of a
parameter changes it, whatever the dtype and the bit (hypothesis), and the check is off
without a process group or between checked steps."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.train.replicas import REPLICA_CHECK_ENV, ReplicaCheck, parameter_digest

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64, "int8": torch.int8}  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from(sorted(_DTYPES)),
    sizes=st.lists(st.integers(1, 37), min_size=1, max_size=4),
    which=st.integers(0, 10**6),
    byte=st.integers(0, 10**6),
    bit=st.integers(0, 7),
)
def test_every_single_bit_flip_changes_the_digest(
    dtype: str, sizes: list[int], which: int, byte: int, bit: int
) -> None:
    gen = torch.Generator().manual_seed(which)
    params = [(torch.randn(n, generator=gen) * 50).to(_DTYPES[dtype]) for n in sizes]
    before = parameter_digest(params).tolist()
    t = params[which % len(params)]
    raw = t.view(torch.uint8).view(-1)
    raw[byte % raw.numel()] ^= 1 << bit
    assert parameter_digest(params).tolist() != before


def test_the_check_is_off_without_a_group_or_between_steps(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Linear(3, 2)
    monkeypatch.delenv(REPLICA_CHECK_ENV, raising=False)
    assert ReplicaCheck(model).every == 0
    monkeypatch.setenv(REPLICA_CHECK_ENV, "5")
    check = ReplicaCheck(model)
    assert check.every == 5
    assert check.check(4) is None and check.check(5) is None  # no process group
