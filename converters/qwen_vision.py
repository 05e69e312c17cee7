"""Qwen3-VL's vision tower as the decision-vision and decision3 converters export it (Qwen3.5's tower is
Qwen3-VL's with no deepstack: same tensors, same outputs), and the generated images their checks read.

Exporting the whole vision forward fails three ways (the grid is baked in or data-dependent:
docs/reference/multimodal-feasibility.md §1), so the tower is traced as a grid-free core with the
TorchScript tracer at opset 18: ``patches``, ``pos_idx``, ``pos_w``, ``rowcol`` in, ``image_embeds``
(and ``deepstack_embeds`` where the tower has deepstack mergers) out; everything grid-shaped is computed
by the server in numpy (edge_runtime.vision_lm.grid).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

OPSET = 18


def _vision_core(visual: Any) -> Any:
    """The grid-free vision tower: taps and row/col ids come from numpy (vision_lm)."""
    import torch
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

    class VisionCore(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.v = visual

        def forward(self, patches: Any, pos_idx: Any, pos_w: Any, rowcol: Any) -> Any:
            v = self.v
            h = v.patch_embed(patches)
            taps = v.pos_embed(pos_idx) * pos_w[:, :, None]
            h = h + (taps[0] + taps[1] + taps[2] + taps[3])  # Transformers' summation order
            freqs = (rowcol.float()[:, :, None] * v.rotary_pos_emb.inv_freq[None, None, :]).flatten(1)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
            n = h.shape[0]
            deep = []
            for i, blk in enumerate(v.blocks):
                a = blk.attn
                x = blk.norm1(h)
                q, k, val = a.qkv(x).reshape(n, 3, a.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
                q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
                q, k, val = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, val))
                w = torch.matmul(q, k.transpose(2, 3)) * a.scaling
                w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32)
                o = torch.matmul(w, val).transpose(1, 2).reshape(n, -1)
                h = h + a.proj(o)
                h = h + blk.mlp(blk.norm2(h))
                if i in v.deepstack_visual_indexes:
                    deep.append(v.deepstack_merger_list[v.deepstack_visual_indexes.index(i)](h))
            out = v.merger(h)
            return (out, torch.stack(deep)) if deep else out

    return VisionCore().eval()


def export_vision_core(visual: Any, vcfg: Any, path: Path) -> dict[str, Any]:
    """Trace the grid-free vision core of ``visual`` (a Qwen3-VL vision tower; Qwen3.5's is the same with no
    deepstack) to ``path`` (TorchScript, opset 18); returns its shapes as the card records them."""
    import torch

    from edge_runtime.vision_lm.grid import position_taps, rowcol

    deepstack = len(vcfg.deepstack_visual_indexes)
    n = 16  # a 4x4 patch grid; nothing in the graph depends on it
    dim = vcfg.in_channels * vcfg.temporal_patch_size * vcfg.patch_size ** 2
    side = int(vcfg.num_position_embeddings ** 0.5)
    idx, w = position_taps(4, 4, side, vcfg.spatial_merge_size)
    vision_args = (torch.randn(n, dim), torch.from_numpy(idx), torch.from_numpy(w),
                   torch.from_numpy(rowcol(4, 4, vcfg.spatial_merge_size)))
    vision_out = ["image_embeds"] + (["deepstack_embeds"] if deepstack else [])
    axes: dict[str, dict[int, str]] = {"patches": {0: "patches"}, "pos_idx": {1: "patches"},
                                       "pos_w": {1: "patches"}, "rowcol": {0: "patches"},
                                       "image_embeds": {0: "tokens"}}
    if deepstack:
        axes["deepstack_embeds"] = {1: "tokens"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_vision_core(visual), vision_args, str(path), dynamo=False, opset_version=OPSET,
                          input_names=["patches", "pos_idx", "pos_w", "rowcol"], output_names=vision_out,
                          dynamic_axes=axes)
    return {"inputs": ["patches", "pos_idx", "pos_w", "rowcol"], "outputs": vision_out, "patch_dim": dim,
            "position_side": side}


def vision_golden(session: Any, patches: Any, side: int, merge: int) -> dict[str, np.ndarray]:
    """The vision core's golden case on ``patches`` (an image through the server's processor), as the
    package's VISION_GOLDEN file holds it: the feeds under ``in/<name>``, the outputs under ``out/<name>``."""
    from edge_runtime.vision_lm.grid import PATCHES, POS_IDX, POS_W, ROWCOL, position_taps, rowcol

    idx, w = position_taps(patches.grid_h, patches.grid_w, side, merge)
    feeds = {PATCHES: patches.patches, POS_IDX: idx, POS_W: w, ROWCOL: rowcol(patches.grid_h, patches.grid_w, merge)}
    out = session.run(feeds, session.output_names)
    return {**{f"in/{k}": v for k, v in feeds.items()}, **{f"out/{k}": v for k, v in out.items()}}


def verify_image(height: int, width: int, seed: int) -> Any:
    """A ``width x height`` RGB image of smooth gradients plus seeded noise: resizing has work to do."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    # smooth gradients plus noise: resizing has real work to do, and every pixel differs
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(1, width - 1), y * 255 / max(1, height - 1), (x + y) % 256], axis=-1)
    return Image.fromarray(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8), "RGB")


__all__ = ["OPSET", "export_vision_core", "verify_image", "vision_golden"]
