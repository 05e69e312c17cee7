"""What a decision-vision request becomes before the engine: media decoded and processed, the state's
tokens with its vision blocks, and the readout of the codes (everything but the sessions).

The prompt is codes-v1 (codes_prompt.py) with the media in front of the state text, inside the user
turn, as the upstream Decision 3.0 layout puts them: ``chat.before``, each image as ``<|vision_start|>``
+ ``<|image_pad|>`` x tokens + ``<|vision_end|>``, then each video as its frame pairs, each
``<{t:.1f} seconds>`` followed by ``<|vision_start|>`` + ``<|video_pad|>`` x tokens + ``<|vision_end|>``,
then ``State:...``. Images and videos are decoded by edge_runtime.media and processed by the shared
Qwen-VL processor (edge_runtime.vision_lm.processor); a malformed or over-limit one raises its ApiError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from edge_runtime.families.codes_prompt import CodesPrompt
from edge_runtime.families.decision_vision.box_reader import BoxReader
from edge_runtime.heads.decisions import code_probabilities
from edge_runtime.media.image import ImageLimits
from edge_runtime.media.video import VideoLimits, check_video_tokens, decode_video
from edge_runtime.requests.decisions import DecisionState
from edge_runtime.vision_lm.grid import Block
from edge_runtime.vision_lm.processor import ImageProcessor, Patches, ProcessorSettings, VideoClip, pair_frames


class StateTooLong(Exception):
    """The state does not fit the question budget."""


class VisionPlanner:
    """Prompt, processor and readout of a decision-vision package: everything but the sessions."""

    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any], limits: dict[str, Any],
                 embeddings: np.ndarray, readout: np.ndarray, box_readout: np.ndarray | None = None) -> None:
        vision = config.get("vision")
        if not isinstance(vision, dict):
            raise ValueError("decision_config.json has no vision member")
        self.config = config
        self.prompt = CodesPrompt(tokenizer, config)
        self.prompt.check_codes(config["token_ids"])
        self.settings = ProcessorSettings.from_card(vision["processor"])
        self.processor = ImageProcessor(self.settings)
        tokens = vision["tokens"]
        self.start, self.end = int(tokens["<|vision_start|>"]), int(tokens["<|vision_end|>"])
        self.image_pad, self.video_pad = int(tokens["<|image_pad|>"]), int(tokens["<|video_pad|>"])
        self.timestamp = str(vision.get("timestamp", "<{t:.1f} seconds>"))
        self.side = int(vision["position_side"])
        self.embeddings = embeddings
        self.readout = np.ascontiguousarray(readout, dtype=np.float32)
        if self.readout.shape != (len(self.prompt.codes), embeddings.shape[1]):
            raise ValueError(f"head.npz readout has shape {self.readout.shape}, expected "
                             f"[{len(self.prompt.codes)}, {embeddings.shape[1]}]")
        self.box = (BoxReader(self.prompt, config["box"], box_readout)
                    if box_readout is not None and isinstance(config.get("box"), dict) else None)
        self.limits = limits
        self.image_max_pixels = int(limits["image_max_pixels"])
        self.video_max_pixels = int(limits["video_max_pixels"])
        self.video_max_tokens = int(limits["video_max_tokens"])
        self.image_limits = ImageLimits(int(limits["image_max_bytes"]), int(limits["image_source_max_pixels"]))
        self.video_limits = VideoLimits(int(limits["video_max_bytes"]), float(limits["video_max_seconds"]),
                                        int(limits["video_source_max_pixels"]), float(limits["video_fps"]),
                                        int(limits["video_max_frames"]))

    @classmethod
    def from_parts(cls, tokenizer: Tokenizer, config: dict[str, Any], limits: dict[str, Any],
                   embeddings: np.ndarray, readout: np.ndarray,
                   box_readout: np.ndarray | None = None) -> VisionPlanner:
        return cls(tokenizer, config, limits, embeddings, readout, box_readout)

    def probabilities(self, hidden: np.ndarray, count: int, temperature: float) -> np.ndarray:
        """The first ``count`` codes' probabilities for one last-token hidden state."""
        return code_probabilities(hidden, self.readout, count, temperature, None, None)

    def video_ids(self, clip: VideoClip) -> tuple[list[int], list[tuple[int, Patches]]]:
        """A clip's tokens and, per pair, the offset of its pads within them."""
        ids: list[int] = []
        blocks = []
        for pair in clip.pairs:
            ids.extend(self.prompt.text.encode(self.timestamp.format(t=pair.time), add_special_tokens=False).ids)
            ids.append(self.start)
            blocks.append((len(ids), pair.patches))
            ids.extend([self.video_pad] * self._tokens(pair.patches))
            ids.append(self.end)
        return ids, blocks

    def _tokens(self, p: Patches) -> int:
        m = self.settings.merge_size
        return (p.grid_h // m) * (p.grid_w // m)

    def state_with_media(self, state: Any, images: Sequence[Patches], videos: Sequence[VideoClip],
                         budget: int = 1 << 30) -> tuple[list[int], list[Block]]:
        """The state's ids (chat markup, media, state text) and its vision blocks."""
        ids = list(self.prompt.before)
        blocks: list[Block] = []
        for image in images:
            ids.append(self.start)
            blocks.append(Block(len(ids), image.patches, image.grid_h, image.grid_w))
            ids.extend([self.image_pad] * self._tokens(image))
            ids.append(self.end)
        for clip in videos:
            vids, at = self.video_ids(clip)
            blocks.extend(Block(len(ids) + off, p.patches, p.grid_h, p.grid_w) for off, p in at)
            ids.extend(vids)
        text = self.prompt.bounded(self.prompt.state_text(state), budget - len(ids))
        if text is None:
            raise StateTooLong()
        return [*ids, *text], blocks

    def read_media(self, entry: DecisionState,
                   asset_images: Sequence[bytes] = ()) -> tuple[list[Patches], list[VideoClip]]:
        """The entry's images (then the assets its state uses, one image per use) and videos,
        decoded, checked and processed; ApiError with the reason."""
        images = self.processor.read_images(entry.images, asset_images, self.image_limits, self.image_max_pixels)
        videos = []
        used = 0
        # the fewest tokens a pair's timestamp takes: a clip refused on this bound is refused undecoded
        stamp = len(self.prompt.text.encode(self.timestamp.format(t=0.0), add_special_tokens=False).ids)

        def before_decode(frames: int, width: int, height: int) -> None:
            pair = self.processor.tokens(height, width, self.video_max_pixels) + stamp + 2
            check_video_tokens(self.video_max_tokens, used + (frames + 1) // 2 * pair)

        for url in entry.videos:
            # frames are kept at the size the model reads them (resized once, from the source, as
            # the processor would), so many large frames never sit in memory together
            frames = decode_video(url, self.video_limits, before_decode,
                                  lambda h, w: self.processor.target_size(h, w, self.video_max_pixels))
            clip = VideoClip(pair_frames(self.processor, frames.images, frames.times, self.video_max_pixels),
                             frames.seconds, frames.measured)
            used += len(self.video_ids(clip)[0])
            check_video_tokens(self.video_max_tokens, used)
            videos.append(clip)
        return images, videos


__all__ = ["StateTooLong", "VisionPlanner"]
