"""A checkpoint state split into its tensors and a small picklable skeleton.

The skeleton (dicts, lists, numbers, strings: the user's metadata) is pickled with each tensor
replaced by a `TensorRef`; the tensors' bytes go to the slot one after the other, each at an
offset aligned to 64 bytes. The table of (dtype, shape) is the state's layout: a save whose
layout differs from the last one in the same process is refused (see `check_same_layout`).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch

from dlu_elastic.checkpoint.errors import CheckpointError, LayoutChanged

__all__ = ["CheckpointError", "LayoutChanged"]

ALIGN = 64


@dataclass(frozen=True)
class TensorRef:
    index: int


@dataclass(frozen=True)
class TensorEntry:
    path: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _flatten(value: Any, path: str, tensors: list[tuple[str, torch.Tensor]]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append((path, value))
        return TensorRef(len(tensors) - 1)
    if isinstance(value, dict):
        return {k: _flatten(v, f"{path}.{k}" if path else str(k), tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_flatten(v, f"{path}[{i}]", tensors) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(_flatten(v, f"{path}[{i}]", tensors) for i, v in enumerate(value))
    return value


def split(state: Any) -> tuple[Any, list[tuple[str, torch.Tensor]]]:
    """The skeleton of `state` and its tensors, in a fixed order (with their paths)."""
    tensors: list[tuple[str, torch.Tensor]] = []
    skeleton = _flatten(state, "", tensors)
    return skeleton, tensors


def table(tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[TensorEntry], int]:
    """Where each tensor's bytes go in the payload, and the payload's size."""
    entries: list[TensorEntry] = []
    offset = 0
    for path, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(TensorEntry(path, str(tensor.dtype), tuple(tensor.shape), offset, nbytes))
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return entries, offset


def check_same_layout(before: list[TensorEntry], now: list[TensorEntry]) -> None:
    """Refuse a save whose tensors differ from the previous save's (in count, shape or dtype)."""
    if len(before) != len(now):
        raise LayoutChanged(
            f"the state has {len(now)} tensors, the previous save had {len(before)}: a process "
            "saves the same structure every step (start a new process to change it)"
        )
    for old, new in zip(before, now, strict=True):
        if (old.path, old.dtype, old.shape) != (new.path, new.dtype, new.shape):
            raise LayoutChanged(
                f"tensor {new.path or '<state>'!r} is {new.dtype} {list(new.shape)}, it was "
                f"{old.path or '<state>'!r} {old.dtype} {list(old.shape)} in the previous save: a "
                "process saves the same shapes every step (start a new process to change them)"
            )


def dumps_meta(skeleton: Any, entries: list[TensorEntry], extra: dict[str, Any]) -> bytes:
    return pickle.dumps({"skeleton": skeleton, "entries": entries, **extra}, protocol=5)


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in a checkpoint slot")
    return dtype


def rebuild(skeleton: Any, entries: list[TensorEntry], payload: memoryview) -> Any:
    """The state, with each tensor copied out of `payload` (the copy is the caller's own)."""
    tensors: list[torch.Tensor] = []
    for entry in entries:
        dtype = dtype_of(entry.dtype)
        if entry.nbytes == 0:
            tensors.append(torch.empty(entry.shape, dtype=dtype))
            continue
        raw = torch.frombuffer(payload, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
        tensors.append(raw.clone().view(dtype).reshape(entry.shape))
    return fill(skeleton, tensors)


def unpack(meta_bytes: bytes, payload: memoryview) -> tuple[bool, Any]:
    """(whether the rank saved None, its state with every tensor copied out of `payload`)."""
    meta = pickle.loads(meta_bytes)
    return bool(meta.get("empty")), rebuild(meta["skeleton"], meta["entries"], payload)


def fill(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, TensorRef):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: fill(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, tensors) for v in value]
    if isinstance(value, tuple):
        return tuple(fill(v, tensors) for v in value)
    return value
