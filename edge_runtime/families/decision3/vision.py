"""Images in a decision3 prompt: the vision core (vision.onnx) and the rows that carry its outputs.

The Qwen3.5 vision tower is Qwen3-VL's with no deepstack (upstream-formats.md §3.4, §3.9), so the graph is the
grid-free vision core decision-vision reads too, and everything grid-shaped comes from the shared numpy helpers
(edge_runtime/vision_lm/grid.py: bilinear position taps, rotary row/column ids, ``get_rope_index``).
Images are preprocessed by the shared :class:`~edge_runtime.vision_lm.processor.ImageProcessor`
(§3.8: ``smart_resize`` to multiples of patch x merge, bicubic, normalised, Qwen2-VL patch layout).

A question's prompt holds one ``<|image_pad|>`` per request image (prompt.py); :func:`image_row` expands each
to its image's ``tokens`` copies, gathers the token table, scatters the vision core's rows over the pads, and
gives the row Qwen's 3-D positions (text counting from 0, an image's tokens at (t, row + cur, col + cur), the
text after it at ``cur + max(h, w) / merge``): an :class:`~edge_runtime.engine.recurrent.EmbedsRow` the text
core reads as it reads any row.

The family's rows carry the images' patches, not their token rows: :class:`ImageForward` runs the vision core
inside the forward (on the engine's worker, as decision-vision does), once per image per call however many
rows share it, then hands :class:`~edge_runtime.engine.recurrent.EmbedsRow` /
:class:`~edge_runtime.engine.recurrent.EmbedsBranchRow` to the text core's Forward; rows without images pass
through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_runtime.engine.recurrent import EmbedsBranchRow, EmbedsRow, RecurrentForward, embeds_row
from edge_runtime.vision_lm.grid import IMAGE_EMBEDS, Block, check_core, core_feeds, rope_positions
from edge_runtime.vision_lm.processor import ImageProcessor, Patches, ProcessorSettings

if TYPE_CHECKING:  # importable without onnxruntime
    from edge_runtime.engine.session import GraphSession

#: §3.8: the runtime's own pixel budget for a resized image (not the preprocessor config's ``size``).
MIN_PIXELS, MAX_PIXELS = 65_536, 1_638_400


@dataclass(frozen=True)
class EncodedImage:
    """One image through the vision core: its patches' grid and its token rows ``float32 [tokens, H]``."""

    grid_h: int
    grid_w: int
    rows: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.rows.shape[0])


def processor_settings(raw: Mapping[str, Any]) -> ProcessorSettings:
    """The image processor of a package's ``decision_config.json`` ``vision.processor`` member."""
    return ProcessorSettings.from_card(dict(raw))


class VisionCore:
    """The package's vision core: an image's patches in, its LM token rows out (one call per image: attention
    inside an image is full and never crosses images, exactly Transformers' ``cu_seqlens``)."""

    def __init__(self, session: GraphSession, settings: ProcessorSettings, side: int, hidden: int) -> None:
        check_core(session)
        self.session, self.settings, self.side, self.hidden = session, settings, int(side), int(hidden)
        self.processor = ImageProcessor(settings)

    def encode(self, patches: Patches) -> EncodedImage:
        """The vision core over one image's patches."""
        m = self.settings.merge_size
        feeds = core_feeds(patches.patches, patches.grid_h, patches.grid_w, self.side, m)
        rows = self.session.run(feeds, [IMAGE_EMBEDS])[IMAGE_EMBEDS]
        tokens = (patches.grid_h // m) * (patches.grid_w // m)
        if rows.shape != (tokens, self.hidden):
            raise ValueError(f"the vision core gave {list(rows.shape)} for an image of {tokens} tokens")
        return EncodedImage(patches.grid_h, patches.grid_w, np.ascontiguousarray(rows, dtype=np.float32))


def expand_ids(ids: Sequence[int], image_id: int, tokens: Sequence[int]) -> tuple[np.ndarray, list[int]]:
    """The ids with the i-th ``image_id`` repeated ``tokens[i]`` times, and where each image's pads start."""
    out: list[int] = []
    starts: list[int] = []
    for t in ids:
        if t == image_id:
            if len(starts) == len(tokens):
                raise ValueError("the prompt holds more image placeholders than the request has images")
            starts.append(len(out))
            out += [image_id] * int(tokens[len(starts) - 1])
        else:
            out.append(int(t))
    if len(starts) != len(tokens):
        raise ValueError(f"the prompt holds {len(starts)} image placeholders for {len(tokens)} images")
    return np.asarray(out, dtype=np.int64), starts


def video_starts(ids: np.ndarray, video_id: int, pairs: Sequence[EncodedImage]) -> list[int]:
    """Where each video pair's pads start in already expanded ids (each pair's pads one run, in order)."""
    at = np.flatnonzero(ids == video_id)
    starts = [int(i) for k, i in enumerate(at) if k == 0 or at[k - 1] != i - 1]
    if len(starts) != len(pairs) or len(at) != sum(p.tokens for p in pairs):
        raise ValueError(f"the prompt holds {len(starts)} video pad runs ({len(at)} pads) for {len(pairs)} pairs")
    return starts


def image_row(ids: Sequence[int], image_id: int, images: Sequence[EncodedImage], embeddings: np.ndarray,
              merge: int, video_id: int = -1, pairs: Sequence[EncodedImage] = ()) -> EmbedsRow:
    """One question's row: image placeholders expanded (videos come expanded: video.expansion_ids), the images'
    and video pairs' rows scattered in, Qwen's 3-D positions (a pair is a block of t = 1, as an image)."""
    expanded, starts = expand_ids(ids, image_id, [im.tokens for im in images])
    embeds = np.array(embeddings[expanded], dtype=np.float32)
    blocks = []
    media = list(images)
    if pairs:
        starts = starts + video_starts(expanded, video_id, pairs)
        media += list(pairs)
    for start, im in zip(starts, media):
        embeds[start:start + im.tokens] = im.rows
        # rope_positions reads the grid only; the patches stay with the caller
        blocks.append(Block(start, np.empty((0, 0), dtype=np.float32), im.grid_h, im.grid_w))
    return embeds_row(embeds, rope_positions(len(expanded), blocks, merge))


@dataclass(frozen=True)
class ImageRow:
    """A prompt with images and videos: its ids (one placeholder per image, each video expanded) and the
    images' patches, then the video pairs' patches, in order."""

    ids: tuple[int, ...]
    images: tuple[Patches, ...]
    pairs: tuple[Patches, ...] = ()


@dataclass(frozen=True)
class ImageBranchRow:
    """A state-once row whose shared prefix holds the images; the branches are text (each at least one token)."""

    prefix: ImageRow
    branches: tuple[tuple[int, ...], ...]


class ImageForward:
    """The family's forward for a package with a vision core (see the module docstring)."""

    def __init__(self, text: RecurrentForward, core: VisionCore, image_id: int, embeddings: np.ndarray,
                 video_id: int = -1) -> None:
        self.text, self.core, self.image_id, self.embeddings = text, core, int(image_id), embeddings
        self.video_id = int(video_id)
        self.hidden = text.hidden

    def _tokens(self, row: ImageRow) -> int:
        m = self.core.settings.merge_size
        return len(row.ids) + sum((p.grid_h // m) * (p.grid_w // m) - 1 for p in row.images)

    def length(self, row: Any) -> int:
        """Tokens the row computes, each image counted as its tokens."""
        if isinstance(row, ImageRow):
            return self._tokens(row)
        if isinstance(row, ImageBranchRow):
            prefix = self._tokens(row.prefix)
            if not self.text.can_branch:
                return sum(prefix + len(b) for b in row.branches)
            return prefix + sum(len(b) for b in row.branches)
        return self.text.length(row)

    def __call__(self, rows: Sequence[Any]) -> list[np.ndarray]:
        """One result per row, as RecurrentForward gives it."""
        encoded: dict[int, EncodedImage] = {}  # an image shared by rows of this call runs once

        def encode(patches: Patches) -> EncodedImage:
            if id(patches) not in encoded:
                encoded[id(patches)] = self.core.encode(patches)
            return encoded[id(patches)]

        def row_of(row: ImageRow) -> EmbedsRow:
            return image_row(row.ids, self.image_id, [encode(p) for p in row.images], self.embeddings,
                             self.core.settings.merge_size, self.video_id, [encode(p) for p in row.pairs])

        converted: list[Any] = []
        for row in rows:
            if isinstance(row, ImageRow):
                converted.append(row_of(row))
            elif isinstance(row, ImageBranchRow):
                branches = tuple(EmbedsRow(np.array(self.embeddings[list(b)], dtype=np.float32))
                                 for b in row.branches)
                converted.append(EmbedsBranchRow(row_of(row.prefix), branches))
            else:
                converted.append(row)
        return self.text(converted)


__all__ = ["MAX_PIXELS", "MIN_PIXELS", "EncodedImage", "ImageBranchRow", "ImageForward", "ImageRow",
           "VisionCore", "expand_ids", "image_row", "processor_settings", "video_starts"]
