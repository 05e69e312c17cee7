"""Everything grid-shaped of a Qwen-VL vision tower, in numpy, exactly as Transformers computes it in torch.

The vision core graph (``vision.onnx``, written by the decision-vision and decision3 converters) takes nothing
that depends on an image's grid inside the graph, so one graph serves every image size
(docs/reference/multimodal-feasibility.md §1): ``patches [N, C*T*p*p]``, the bilinear position-table taps
``pos_idx [4, N]`` and ``pos_w [4, N]``, the rotary row/column ids ``rowcol [N, 2]``; out ``image_embeds
[N / merge^2, H]`` (and ``deepstack_embeds [k, N / merge^2, H]`` where the tower has them). One call reads one
block (an image, or one pair of video frames): attention inside a block is full and never crosses blocks, so a
call per block is exactly Transformers' ``cu_seqlens``. :func:`rope_positions` gives the text core's M-RoPE
positions of a sequence with vision blocks in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# the vision core's names (the converters write exactly these)
PATCHES, POS_IDX, POS_W, ROWCOL = "patches", "pos_idx", "pos_w", "rowcol"
IMAGE_EMBEDS, DEEPSTACK = "image_embeds", "deepstack_embeds"
CORE_INPUTS = (PATCHES, POS_IDX, POS_W, ROWCOL)


def torch_linspace(end: int, steps: int) -> np.ndarray:
    """``torch.linspace(0, end, steps)`` in float32, bit for bit.

    torch's CPU kernel takes a float32 step and evaluates the first half forwards and the second
    half backwards from ``end`` in double before rounding (measured: np.linspace in float64, or the
    same arithmetic in float32, differs in the last bit for some sizes).
    """
    if steps == 1:
        return np.zeros(1, dtype=np.float32)
    step = float(np.float32(np.float32(end) / np.float32(steps - 1)))
    i = np.arange(steps, dtype=np.float64)
    values = np.where(i < steps // 2, step * i, float(end) - step * (steps - 1 - i))
    return values.astype(np.float32)


def position_taps(grid_h: int, grid_w: int, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """The four bilinear taps into the ``side x side`` position table, in the merged patch order.

    ``(pos_idx int64 [4, h*w], pos_w float32 [4, h*w])``: Transformers'
    ``fast_pos_embed_interpolate`` for one block (t = 1).
    """
    h_idx, w_idx = torch_linspace(side - 1, grid_h), torch_linspace(side - 1, grid_w)
    h_floor, w_floor = h_idx.astype(np.int64), w_idx.astype(np.int64)
    h_ceil, w_ceil = np.minimum(h_floor + 1, side - 1), np.minimum(w_floor + 1, side - 1)
    dh, dw = (h_idx - h_floor).astype(np.float32), (w_idx - w_floor).astype(np.float32)
    one = np.float32(1)
    idx = np.stack([
        (h_floor[:, None] * side + w_floor[None]).ravel(), (h_floor[:, None] * side + w_ceil[None]).ravel(),
        (h_ceil[:, None] * side + w_floor[None]).ravel(), (h_ceil[:, None] * side + w_ceil[None]).ravel()])
    w = np.stack([
        ((one - dh)[:, None] * (one - dw)[None]).ravel(), ((one - dh)[:, None] * dw[None]).ravel(),
        (dh[:, None] * (one - dw)[None]).ravel(), (dh[:, None] * dw[None]).ravel()]).astype(np.float32)
    order = merged_order(grid_h, grid_w, merge)
    return np.ascontiguousarray(idx[:, order]), np.ascontiguousarray(w[:, order])


def merged_order(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """Row-major patch indices permuted into merge-block order (each merge x merge block contiguous)."""
    grid = np.arange(grid_h * grid_w).reshape(grid_h // merge, merge, grid_w // merge, merge)
    return grid.transpose(0, 2, 1, 3).ravel()


def rowcol(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """The rotary (row, column) of every patch, in merged order: int64 [h*w, 2]."""
    order = merged_order(grid_h, grid_w, merge)
    return np.stack([order // grid_w, order % grid_w], axis=1).astype(np.int64)


@dataclass(frozen=True)
class Block:
    """A vision block in a token sequence: its pad tokens start at ``start``; ``patches`` [h*w, D]."""

    start: int
    patches: np.ndarray
    grid_h: int
    grid_w: int

    def tokens(self, merge: int) -> int:
        return (self.grid_h // merge) * (self.grid_w // merge)


def rope_positions(length: int, blocks: Sequence[Block], merge: int) -> np.ndarray:
    """Qwen3-VL's ``get_rope_index`` for one sequence: int64 [3, length].

    Text advances all three axes together; a block's tokens take (0, row, col) past the text before
    it, and the text after it resumes at the block's largest position + 1 (video pairs included:
    Qwen3-VL gives every pair t = 1 and separates them with timestamps).
    """
    out = np.empty((3, length), dtype=np.int64)
    cur = st = 0
    for b in sorted(blocks, key=lambda b: b.start):
        text = b.start - st
        out[:, st:b.start] = cur + np.arange(text)
        cur += text
        gh, gw = b.grid_h // merge, b.grid_w // merge
        n = gh * gw
        out[0, b.start:b.start + n] = cur
        out[1, b.start:b.start + n] = cur + np.repeat(np.arange(gh), gw)
        out[2, b.start:b.start + n] = cur + np.tile(np.arange(gw), gh)
        cur += max(gh, gw)
        st = b.start + n
    out[:, st:] = cur + np.arange(length - st)
    return out


def check_core(session: Any) -> None:
    """ValueError unless the session (a GraphSession) is a vision core: its inputs and ``image_embeds``."""
    if not set(session.inputs).issuperset(CORE_INPUTS) or IMAGE_EMBEDS not in session.outputs:
        raise ValueError(f"{session.path.name} is not a vision core: inputs {session.input_names}")


def core_feeds(patches: np.ndarray, grid_h: int, grid_w: int, side: int, merge: int) -> dict[str, np.ndarray]:
    """The vision core's feeds for one block of ``grid_h x grid_w`` patches (t = 1)."""
    idx, w = position_taps(grid_h, grid_w, side, merge)
    return {PATCHES: np.ascontiguousarray(patches, dtype=np.float32), POS_IDX: idx, POS_W: w,
            ROWCOL: rowcol(grid_h, grid_w, merge)}


__all__ = ["CORE_INPUTS", "DEEPSTACK", "IMAGE_EMBEDS", "PATCHES", "POS_IDX", "POS_W", "ROWCOL", "Block", "check_core",
           "core_feeds",
           "merged_order", "position_taps", "rope_positions", "rowcol", "torch_linspace"]
