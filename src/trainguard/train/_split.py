"""Split a large state tree into several files so that they are written and hashed in parallel.

One file's sha256 runs on one core (~1.2-2 GB/s), slower than a fast disk. A tree
whose tensors exceed ``2 * part_bytes`` is therefore cut: its large tensors go
into ``<stem>.part<i>.pt`` files (tensors sharing storage stay together, so
``torch.save`` keeps them shared), and ``<stem>.pt`` keeps everything else with a
small reference dict in each tensor's place. :func:`join` puts them back.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

REF_KEY = "__trainguard_part__"
# Tensors smaller than this stay in the main file (not worth a reference).
_MIN_TENSOR = 1 << 20


@dataclass
class Split:
    skeleton: Any
    parts: list[dict[str, torch.Tensor]] = field(default_factory=list)


def rebuild_dict(obj: dict, items: Any) -> dict:
    """A dict of ``obj``'s type with new items, keeping ``state_dict()``'s ``_metadata``."""
    out = type(obj)(items)
    meta = getattr(obj, "_metadata", None)
    if meta is not None:
        out._metadata = copy.deepcopy(meta)  # type: ignore[attr-defined]
    return out


def _tensors(tree: Any, found: dict[int, torch.Tensor]) -> None:
    if isinstance(tree, torch.Tensor):
        found.setdefault(id(tree), tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            _tensors(v, found)
    elif isinstance(tree, list) or (isinstance(tree, tuple) and not hasattr(tree, "_fields")):
        for v in tree:
            _tensors(v, found)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def split(tree: Any, *, max_parts: int, part_bytes: int) -> Split:
    """Cut ``tree`` into a skeleton and up to ``max_parts`` balanced tensor groups."""
    found: dict[int, torch.Tensor] = {}
    _tensors(tree, found)
    big = [
        t
        for t in found.values()
        if t.layout == torch.strided and not t.is_quantized and _nbytes(t) >= _MIN_TENSOR
    ]
    total = sum(_nbytes(t) for t in big)
    n = min(max_parts, total // part_bytes) if part_bytes > 0 else 0
    if n < 2:
        return Split(skeleton=tree)
    # Tensors that share a storage (views, tied weights) must go to the same file.
    groups: dict[tuple[str, int], list[torch.Tensor]] = {}
    for t in big:
        storage = t.untyped_storage()
        groups.setdefault((str(t.device), storage.data_ptr()), []).append(t)
    loads = [0] * n
    parts: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    where: dict[int, tuple[int, str]] = {}
    for members in sorted(groups.values(), key=lambda g: -sum(_nbytes(t) for t in g)):
        i = loads.index(min(loads))  # largest first into the least-loaded part
        for t in members:
            key = str(len(where))
            parts[i][key] = t
            where[id(t)] = (i, key)
            loads[i] += _nbytes(t)
    return Split(skeleton=_replace(tree, where), parts=parts)


def _replace(tree: Any, where: dict[int, tuple[int, str]]) -> Any:
    if isinstance(tree, torch.Tensor):
        if id(tree) in where:
            i, key = where[id(tree)]
            return {REF_KEY: i, "key": key}
        return tree
    if isinstance(tree, dict):
        return rebuild_dict(tree, ((k, _replace(v, where)) for k, v in tree.items()))
    if isinstance(tree, list):
        return [_replace(v, where) for v in tree]
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return tuple(_replace(v, where) for v in tree)
    return tree


def join(skeleton: Any, parts: list[dict[str, torch.Tensor]]) -> Any:
    """Inverse of :func:`split`: put each part's tensors back in place of its references."""
    if not parts:
        return skeleton
    if isinstance(skeleton, dict):
        if set(skeleton) == {REF_KEY, "key"}:
            i, key = skeleton[REF_KEY], skeleton["key"]
            try:
                return parts[int(i)][str(key)]
            except (IndexError, KeyError, ValueError) as exc:
                raise ValueError(f"dangling tensor reference {i}/{key}") from exc
        return rebuild_dict(skeleton, ((k, join(v, parts)) for k, v in skeleton.items()))
    if isinstance(skeleton, list):
        return [join(v, parts) for v in skeleton]
    if isinstance(skeleton, tuple) and not hasattr(skeleton, "_fields"):
        return tuple(join(v, parts) for v in skeleton)
    return skeleton
