"""A client state as a few flat buffers and a JSON tree, the form a disk store writes.

A client's state holds a few hundred tensors (parameters, buffers, two AdamW moments each).
Saved as they are, ``torch.save`` pickles each one and ``torch.load(weights_only=True)``
rebuilds each one in its pure-Python unpickler: at a thousand clients a round that is most of
the time not spent training. Packed, the file holds one buffer per dtype and the rest of the
state as one JSON string, and loading is a read plus a view per tensor.

The JSON tree keeps what JSON alone would lose: tuples, dicts with keys that are not
strings, and tensors (a dtype, an offset into that dtype's buffer and a shape). Anything
else a state holds (it never does: states are tensors and plain values) is refused.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

#: The marker of a packed file (and its version): ``safe_load`` unpacks a file that has it.
FORMAT = "fedmtl-packed-1"

_TENSOR, _TUPLE, _ITEMS = "@tensor", "@tuple", "@items"


def pack(tree: Any) -> dict[str, Any]:
    """``tree`` (nested dicts, lists, tuples, tensors and plain values) as ``{"format",
    "tree": JSON text, "buffers": {dtype name: 1-D tensor}}``; tensors are copied."""
    parts: dict[str, list[torch.Tensor]] = {}
    sizes: dict[str, int] = {}

    def encode(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            dtype = str(x.dtype).removeprefix("torch.")
            offset = sizes.get(dtype, 0)
            parts.setdefault(dtype, []).append(x.detach().reshape(-1).cpu())
            sizes[dtype] = offset + x.numel()
            return {_TENSOR: [dtype, offset, list(x.shape)]}
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("@") for k in x):
                return {k: encode(v) for k, v in x.items()}
            return {_ITEMS: [[encode(k), encode(v)] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {_TUPLE: [encode(v) for v in x]}
        if isinstance(x, list):
            return [encode(v) for v in x]
        if x is None or isinstance(x, str | bool | int | float):
            return x
        raise TypeError(f"a client state holds tensors and plain values only, not {type(x).__name__}")

    text = json.dumps(encode(tree), allow_nan=True)
    buffers = {dtype: torch.cat(tensors) for dtype, tensors in parts.items()}
    return {"format": FORMAT, "tree": text, "buffers": buffers}


def is_packed(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("format") == FORMAT


def unpack(obj: dict[str, Any]) -> Any:
    """The tree :func:`pack` packed; its tensors are views of the file's buffers."""
    buffers = obj["buffers"]

    def decode(x: Any) -> Any:
        if isinstance(x, dict):
            if _TENSOR in x:
                dtype, offset, shape = x[_TENSOR]
                return buffers[dtype][offset : offset + math.prod(shape)].view(shape)
            if _TUPLE in x:
                return tuple(decode(v) for v in x[_TUPLE])
            if _ITEMS in x:
                return {decode(k): decode(v) for k, v in x[_ITEMS]}
            return {k: decode(v) for k, v in x.items()}
        if isinstance(x, list):
            return [decode(v) for v in x]
        return x

    return decode(json.loads(obj["tree"]))
