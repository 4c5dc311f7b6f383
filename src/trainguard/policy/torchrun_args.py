"""A torchrun command as one node of an allocation attempt runs it (decision 0510).

The user writes the torchrun command once, as for a plain multi-node job (``torchrun
--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint $HEAD:29500
train.py``). Inside the allocation each attempt may run on other nodes than the last
(a spare replaced a lost node, the job continues smaller), so per node and attempt
trainguard rewrites only what the placement changes:

* ``--nnodes``: the attempt's node count (a ``MIN:MAX`` range becomes the exact count:
  every node of the attempt is known, so the rendezvous need not wait out its
  last-call timeout);
* c10d rendezvous: ``--rdzv-endpoint`` moves to the attempt's first node (its port
  kept), ``--rdzv-id`` gets the attempt number (a stale rendezvous of the failed
  attempt is never joined) and ``--rdzv-conf`` says ``is_host`` explicitly (the first
  node hosts the store, however its host name resolves);
* the static backend: ``--master-addr`` (the first node) and ``--node-rank``.

Everything else (the script, its arguments, every other option) is kept as written.
Pure: the allocation scheduler applies it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_C10D_PORT = 29400  # torchrun's own default for an endpoint without a port
# torchrun's options that take no value; every other option takes one.
_FLAGS = frozenset(
    {
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--run-path",
        "--virtual-local-rank",
        "-h",
        "--help",
    }
)
_OURS = frozenset(
    {"--nnodes", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--master-addr", "--node-rank"}
)


class NotTorchrun(ValueError):
    """The command is not a torchrun launch this mode can place on nodes."""


@dataclass(frozen=True)
class Launch:
    """A torchrun command split: its program, its options (canonical name, value or
    ``None`` for a flag, in order) and the script with its arguments."""

    program: tuple[str, ...]
    options: tuple[tuple[str, str | None], ...]
    script: tuple[str, ...]

    def get(self, name: str) -> str | None:
        for key, value in self.options:
            if key == name:
                return value
        return None

    def has(self, name: str) -> bool:
        return any(key == name for key, _ in self.options)


def _canonical(option: str) -> str:
    return option.replace("_", "-") if option.startswith("--") else option


def split(command: Sequence[str]) -> Launch:
    """``torchrun ...`` or ``python -m torch.distributed.run ...`` split into its parts."""
    cmd = tuple(command)
    if cmd and os.path.basename(cmd[0]) == "torchrun":
        start = 1
    elif (
        len(cmd) >= 3
        and "python" in os.path.basename(cmd[0])
        and cmd[1:3] == ("-m", "torch.distributed.run")
    ):
        start = 3
    else:
        raise NotTorchrun(
            "inside an allocation the command must be torchrun (or python -m "
            f"torch.distributed.run): {' '.join(cmd[:3])}"
        )
    options: list[tuple[str, str | None]] = []
    i = start
    while i < len(cmd) and cmd[i].startswith("-") and cmd[i] != "--":
        raw = cmd[i]
        name, eq, value = raw.partition("=")
        name = _canonical(name)
        if eq:
            options.append((name, value))
            i += 1
        elif name in _FLAGS:
            options.append((name, None))
            i += 1
        else:
            if i + 1 >= len(cmd):
                raise NotTorchrun(f"torchrun option {raw} has no value")
            options.append((name, cmd[i + 1]))
            i += 2
    if i < len(cmd) and cmd[i] == "--":
        i += 1
    if i >= len(cmd):
        raise NotTorchrun("the torchrun command names no training script")
    return Launch(cmd[:start], tuple(options), cmd[i:])


def check(command: Sequence[str]) -> Launch:
    """The command split, or :class:`NotTorchrun` when it cannot span nodes."""
    launch = split(command)
    if launch.has("--standalone"):
        raise NotTorchrun(
            "--standalone runs on one node: give --rdzv-backend c10d "
            "--rdzv-endpoint HOST:PORT instead"
        )
    return launch


def _endpoint_port(endpoint: str | None) -> int:
    if not endpoint:
        return DEFAULT_C10D_PORT
    host, sep, port = endpoint.rpartition(":")
    if sep and host and not host.endswith("]") and ":" in host:
        return DEFAULT_C10D_PORT  # a bare IPv6 address: no port given
    try:
        return int(port) if sep else DEFAULT_C10D_PORT
    except ValueError:
        return DEFAULT_C10D_PORT


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def node_command(
    command: Sequence[str], *, nodes: int, index: int, first_address: str, attempt: int, job: str
) -> tuple[str, ...]:
    """The command node ``index`` (0: the first, which hosts the rendezvous) of an
    attempt on ``nodes`` nodes runs; ``first_address``: the first node's address."""
    if nodes < 1 or not 0 <= index < nodes:
        raise ValueError(f"node {index} of {nodes}")
    launch = check(command)
    kept = [(k, v) for k, v in launch.options if k not in _OURS]
    ours: list[str] = [f"--nnodes={nodes}"]
    backend = (launch.get("--rdzv-backend") or "static").lower()
    if backend == "static":
        ours += [f"--master-addr={first_address}", f"--node-rank={index}"]
    else:
        port = _endpoint_port(launch.get("--rdzv-endpoint"))
        ident = launch.get("--rdzv-id") or job
        conf = [
            part
            for part in (launch.get("--rdzv-conf") or "").split(",")
            if part and part.split("=", 1)[0].strip() != "is_host"
        ]
        conf.append(f"is_host={1 if index == 0 else 0}")
        ours += [
            f"--rdzv-endpoint={_host(first_address)}:{port}",
            f"--rdzv-id={ident}-a{attempt}",
            f"--rdzv-conf={','.join(conf)}",
        ]
    options: list[str] = []
    for key, value in kept:
        options.append(key if value is None else f"{key}={value}")
    return (*launch.program, *ours, *options, *launch.script)


def wanted_nodes(command: Sequence[str]) -> int | None:
    """The node count the user's ``--nnodes`` asks for (the upper end of ``MIN:MAX``),
    ``None`` when it names none."""
    value = check(command).get("--nnodes")
    if value is None:
        return None
    try:
        return int(value.rpartition(":")[2])
    except ValueError:
        raise NotTorchrun(f"--nnodes {value!r} is not N or MIN:MAX") from None


def min_nodes_of(command: Sequence[str]) -> int | None:
    """The lower end of a ``--nnodes MIN:MAX`` range (``None``: not a range)."""
    value = check(command).get("--nnodes")
    if value is None or ":" not in value:
        return None
    try:
        return int(value.partition(":")[0])
    except ValueError:
        raise NotTorchrun(f"--nnodes {value!r} is not N or MIN:MAX") from None


__all__ = [
    "DEFAULT_C10D_PORT",
    "Launch",
    "NotTorchrun",
    "check",
    "min_nodes_of",
    "node_command",
    "split",
    "wanted_nodes",
]
