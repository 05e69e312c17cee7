"""decision3 family: Decision 3.0 code-readout packages on a hybrid recurrent/attention text core.

A question is one prompt (prompt.py, the released d3 format) whose options are listed under single-token
answer codes; the text core (model.onnx: Qwen3.5's Gated DeltaNet and attention layers, fp32 on the BF16
weights) reads it, and the readout scores the question's codes at its last real token:
``p = softmax(h R[:K]^T / T)`` (heads/decisions.code_probabilities; float64 softmax), renormalised and
answered through the shared question registry (Choice, Noul, Score; the contract's confidence).

Rows: one per question, right-padded in batches (engine/recurrent.py: padded positions neither decay nor
write the recurrent state, so a row's answer does not depend on its batch; the load-time probe proves it).
``attention_mode`` ``causal``: state-once, the longest common token prefix of a request's question prompts
runs once and each question continues from its GDN and attention states (``usage`` counts the prefix once).
``noncausal_full_attention``: every question runs its whole prompt: a full-attention layer lets the prefix's
positions attend to the question's tokens, so no prefix state can be shared. Nothing is truncated: a prompt
over ``max_input_tokens`` fails its question with ``max_length_exceeded``.

Images (packages with a vision core, card modality ``image``): the request's ``images`` (data URLs) and the
assets its state uses (each use one more image after ``images``, named ``[image k]`` in the state) go through
the shared media intake (edge_runtime.media: the card's image_max_bytes and image_source_max_pixels, the same
reasons as decision-vision), are resized and patched by the Qwen-VL processor (edge_runtime.vision_lm) within
image_max_pixels, and are shared by every question of the entry: each prompt holds one placeholder per image in
front of the user text (§3.6), counted as the image's tokens against ``max_input_tokens``. An asset used in a
question is refused (question_images_unsupported: images sit in the state only). The vision core runs in the
forward (vision.py, ImageForward). Image rows batch as text rows do (noncausal: whole rows, right-padded; causal: the
images sit in the shared prefix, which runs once).

Videos (card modality ``video``): the request's ``videos`` go through the shared video intake (the card's
video_max_bytes, video_max_seconds, video_source_max_pixels; decision-vision's reasons), are sampled, sized and
timestamped as the released d3 runtime does (video.py), and each prompt's video placeholder (after the images')
becomes, per pair of frames, ``<t seconds><|vision_start|>`` + pads + ``<|vision_end|>``, counted against
``max_input_tokens``; a request's videos take at most ``video_max_tokens`` (reason video_tokens). Each pair runs
through the vision core as a block of t = 1 and sits in the rows as an image does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edge_runtime.engine.causal import CausalRow, branch_row, causal_row
from edge_runtime.engine.recurrent import CAUSAL, NONCAUSAL, RecurrentForward
from edge_runtime.families.base import Graph, open_graphs
from edge_runtime.families.code_options import check_codes
from edge_runtime.families.decision3 import video as vid
from edge_runtime.families.decision3.prompt import (
    IMAGE_TOKEN,
    VIDEO_TOKEN,
    D3Prompt,
    PromptTokens,
    common_prefix,
    refusal,
)
from edge_runtime.families.decision3.vision import (
    ImageBranchRow,
    ImageForward,
    ImageRow,
    VisionCore,
    processor_settings,
)
from edge_runtime.families.decision_plan import (
    DecisionFamily,
    DecisionPlan,
    Entry,
    Slot,
    answered_types,
    input_limit,
    plan_entries,
)
from edge_runtime.families.state_assets import StateAssets
from edge_runtime.heads.decisions import code_probabilities
from edge_runtime.media.image import ImageLimits
from edge_runtime.media.video import VideoLimits, check_video_tokens
from edge_runtime.packages import Package
from edge_runtime.questions import InvalidQuestion, Question, answer
from edge_runtime.questions import refusal as type_refusal
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState
from edge_runtime.vision_lm.golden import VISION_GOLDEN, VISION_GRAPH, vision_golden
from edge_runtime.vision_lm.processor import ImageProcessor, Patches

CONFIG_FORMAT = "decision3-config/1"
QUESTION_TYPES = ("choice", "noul", "score")
READOUT = "readout"  # head.npz: float32 [255, hidden]
EMBEDDINGS = "embeddings.npy"


def graphs(package: Package) -> list[Graph]:
    """The vision core beside the text core, where the package has one (self-checked on its golden case)."""
    if VISION_GRAPH not in package.files:
        return []
    return [Graph("vision", VISION_GRAPH, vision_golden if VISION_GOLDEN in package.files else None)]


def check_config(config: dict[str, Any]) -> None:
    """Raise ValueError when decision_config.json is not one this family reads."""
    if config.get("format") != CONFIG_FORMAT or config.get("prompt") != "d3":
        raise ValueError(f"decision_config.json must have format {CONFIG_FORMAT!r} and prompt 'd3'")
    check_codes(config)
    if config.get("attention_mode") not in (CAUSAL, NONCAUSAL):
        raise ValueError(f"attention_mode must be {CAUSAL} or {NONCAUSAL}")
    t = config.get("temperature")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
        raise ValueError("temperature must be a finite number > 0")
    if not isinstance(config.get("pad_id"), int):
        raise ValueError("decision_config pad_id must be an integer")


class Decision3Family(DecisionFamily[RecurrentForward | ImageForward]):
    """A loaded decision3 package: plans decisions requests into rows, answers from last hidden states."""

    def __init__(self, package: Package, session: Any = None, name: str | None = None,
                 max_input_tokens: int | None = None, opened: Mapping[str, Any] | None = None) -> None:
        card = package.card
        config = package.require_decision_config()
        check_config(config)
        self.name = name or card.name
        self.config = config
        self.prompt = D3Prompt.from_file(package.file("tokenizer.json"), config["codes"])
        self.prompt.check_codes(config["token_ids"])
        readout = package.head_weights().get(READOUT)
        if readout is None or readout.ndim != 2 or readout.shape[0] != len(self.prompt.codes):
            raise ValueError(f"package {card.name}: head.npz needs {READOUT!r} [{len(self.prompt.codes)}, hidden]")
        self.readout = np.ascontiguousarray(readout, dtype=np.float32)
        self.embeddings = np.load(package.file(EMBEDDINGS), mmap_mode="r", allow_pickle=False)
        if self.embeddings.ndim != 2 or self.embeddings.shape[1] != self.readout.shape[1]:
            raise ValueError(f"{EMBEDDINGS} is {list(self.embeddings.shape)}; the readout's hidden size is "
                             f"{self.readout.shape[1]}")
        self.attention_mode = str(config["attention_mode"])
        self.state_once = self.attention_mode == CAUSAL
        self.batchable = not self.state_once  # a state-once row already batches its own questions
        self.temperature = float(config["temperature"])
        self.max_input_tokens = input_limit(card, max_input_tokens)
        self.question_types = answered_types(card, QUESTION_TYPES)
        self.modalities = frozenset(card.modalities)
        self._vocab = self.prompt.tokenizer.get_vocab_size()
        if self._vocab > self.embeddings.shape[0]:
            raise ValueError(f"the tokenizer has {self._vocab} ids; {EMBEDDINGS} has {self.embeddings.shape[0]} rows")
        self.vision = config.get("vision") if "image" in self.modalities else None
        if "image" in self.modalities:
            self._init_images(package)
        self.video_id = -1
        if "video" in self.modalities:
            self._init_videos(package)
        if session is not None:
            text = RecurrentForward(session, self.embeddings, attention_mode=self.attention_mode)
            if text.hidden != self.readout.shape[1]:
                raise ValueError(f"the graph's hidden size {text.hidden} differs from the readout's "
                                 f"{self.readout.shape[1]}")
            self._forward = text
            if self.vision is not None:
                if opened is None:  # built outside the loader (converters, tests): open it the same way
                    opened, _ = open_graphs(package, graphs(package), session)
                core = VisionCore(opened["vision"], self.processor.s, int(self.vision["position_side"]), text.hidden)
                self._forward = ImageForward(text, core, self.image_id, self.embeddings, self.video_id)
        self._probe_rng = np.random.default_rng(0)

    def _init_images(self, package: Package) -> None:
        """The image intake of a package whose card lists the image modality."""
        if not isinstance(self.vision, dict) or VISION_GRAPH not in package.files:
            raise ValueError(f"package {package.card.name}: the card lists images but the package has no vision "
                             f"core ({VISION_GRAPH} and decision_config's vision member)")
        self.processor = ImageProcessor(processor_settings(self.vision["processor"]))
        self.image_id = int(self.vision["image_token_id"])
        if self.prompt.tokenizer.token_to_id(IMAGE_TOKEN) != self.image_id:
            raise ValueError(f"the tokenizer's {IMAGE_TOKEN} is not the vision image_token_id {self.image_id}")
        limits = package.card.limits
        self.image_limits = ImageLimits(int(limits["image_max_bytes"]), int(limits["image_source_max_pixels"]))
        self.image_max_pixels = int(limits["image_max_pixels"])

    def _init_videos(self, package: Package) -> None:
        """The video intake of a package whose card lists the video modality (after the image intake)."""
        if "image" not in self.modalities or not isinstance(self.vision, dict) or "video" not in self.vision:
            raise ValueError(f"package {package.card.name}: the card lists videos but decision_config's vision "
                             "member has no video settings")
        self.video_settings = vid.VideoSettings.from_config(self.vision["video"])
        self.video_id = int(self.vision["video_token_id"])
        if self.prompt.tokenizer.token_to_id(VIDEO_TOKEN) != self.video_id:
            raise ValueError(f"the tokenizer's {VIDEO_TOKEN} is not the vision video_token_id {self.video_id}")
        self.vision_start = int(self.vision["vision_start_token_id"])
        self.vision_end = int(self.vision["vision_end_token_id"])
        limits = package.card.limits
        self.video_limits = VideoLimits(int(limits["video_max_bytes"]), float(limits["video_max_seconds"]),
                                        int(limits["video_source_max_pixels"]), vid.SAMPLE_FPS,
                                        int(limits["video_max_frames"]))
        self.video_max_tokens = int(limits["video_max_tokens"])
        self._stamp = len(self._encode_text(vid.TIMESTAMP.format(t=0.0)))  # the fewest tokens a timestamp takes

    def _encode_text(self, text: str) -> list[int]:
        return list(self.prompt.tokenizer.encode(text, add_special_tokens=False).ids)

    # -- engine hooks -----------------------------------------------------------------------

    def probe_row(self, length: int) -> CausalRow:
        """A fresh random row of ``length`` tokens on every call (the probe needs distinct rows)."""
        return causal_row(self._probe_rng.integers(0, self._vocab, size=max(1, length)))

    def probabilities(self, hidden: np.ndarray, count: int) -> np.ndarray:
        """The first ``count`` codes' probabilities for one last-token hidden state."""
        return code_probabilities(hidden, self.readout, count, self.temperature)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"question_types": list(self.question_types)}
        if "image" in self.modalities:
            out |= {"modalities": sorted(self.modalities),
                    "image_placements": ["state"]}
        return out

    # -- planning ---------------------------------------------------------------------------

    def plan_request(self, request: DecisionsRequest) -> DecisionPlan:
        """Decode the images, render and tokenize every answerable question; decide the others' answers now."""
        cap = self.budget(request)
        assets = StateAssets(request, self.image_limits.max_bytes if "image" in self.modalities else None)
        return plan_entries(request, self.name, self.modalities,
                            lambda name, entry, rows: self._plan_entry(name, entry, cap, rows, assets),
                            last_check=assets.check_all_used)

    def _plan_entry(self, name: str | None, entry: DecisionState, cap: int, rows: list[Any],
                    assets: StateAssets) -> Entry:
        planned = Entry(name, [], temperature=self.temperature)
        state, state_uses = assets.state(entry)
        answerable: list[Slot] = []
        for q in entry.questions:
            refused: InvalidQuestion | None = None
            if isinstance(q, Question):
                refused = (type_refusal(q, self.name, self.question_types) or refusal(q, len(self.prompt.codes))
                           or assets.question_refusal(self.name, q))
            slot = Slot(refused or q)
            planned.slots.append(slot)
            if isinstance(slot.question, Question):
                answerable.append(slot)
        if not answerable:
            return planned
        images = self._images(entry, assets.images(state_uses))
        clips = self._videos(entry)
        m = self.processor.s.merge_size if images or clips else 1
        tokens = [(p.grid_h // m) * (p.grid_w // m) for p in images]
        expansions = [vid.expansion_ids(self._encode_text, c, self.vision_start, self.video_id, self.vision_end, m)
                      for c in clips]
        pairs = tuple(p.patches for c in clips for p in c)
        run: list[Slot] = []
        for slot in answerable:
            assert isinstance(slot.question, Question)
            got = self.prompt.tokens(state, slot.question, cap, tokens + [len(e) for e in expansions], len(clips))
            if isinstance(got, PromptTokens):
                slot.ids = self._expand_videos(got.ids, expansions)
                run.append(slot)
            else:
                slot.answer = got
        if not run:
            return planned
        ids = [s.ids or [] for s in run]
        extra = sum(tokens) - len(tokens)  # each placeholder is its image's tokens (videos come expanded)
        shared = common_prefix(ids) if self.state_once and len(run) > 1 else 0
        # the media sit in front of the user text, so in the shared prefix; where they do not, run whole rows
        if (images or clips) and shared <= max(i for i, t in enumerate(ids[0]) if t in (self.image_id, self.video_id)):
            shared = 0
        if shared:
            for j, slot in enumerate(run):
                slot.row, slot.branch = len(rows), j
            branches = [r[shared:] for r in ids]
            rows.append(ImageBranchRow(ImageRow(tuple(ids[0][:shared]), tuple(images), pairs),
                                       tuple(tuple(b) for b in branches)) if images or clips
                        else branch_row(ids[0][:shared], branches))
            planned.tokens = shared + extra + sum(len(r) - shared for r in ids)
        else:
            for slot, r in zip(run, ids):
                slot.row = len(rows)
                rows.append(ImageRow(tuple(r), tuple(images), pairs) if images or clips else causal_row(r))
            planned.tokens = sum(len(r) + extra for r in ids)
        return planned

    def _images(self, entry: DecisionState, asset_images: Sequence[bytes]) -> list[Patches]:
        """The entry's images (then the assets its state uses, one image per use), decoded through the media
        intake and patched as the model reads them; MediaError (a 400 with its reason) refuses the entry."""
        if not entry.images and not asset_images:
            return []
        return self.processor.read_images(entry.images, asset_images, self.image_limits, self.image_max_pixels)

    def _videos(self, entry: DecisionState) -> list[list[vid.VideoPair]]:
        """The entry's videos, decoded through the shared intake and read as the d3 runtime reads them; a request
        whose videos take more than video_max_tokens is refused (video_tokens), before decoding where it can."""
        if not entry.videos:
            return []
        clips: list[list[vid.VideoPair]] = []
        used = 0
        m = self.video_settings.merge_size

        def before_decode(frames: int, height: int, width: int) -> None:
            pads = vid.input_tokens(self.video_settings, frames, height, width)
            stamps = -(-frames // self.video_settings.temporal_patch_size) * (self._stamp + 2)
            check_video_tokens(self.video_max_tokens, used + pads + stamps)

        for url in entry.videos:
            clip = vid.pairs(self.processor, vid.decode(url, self.video_limits, self.video_settings, before_decode))
            used += len(vid.expansion_ids(self._encode_text, clip, self.vision_start, self.video_id,
                                          self.vision_end, m))
            check_video_tokens(self.video_max_tokens, used)
            clips.append(clip)
        return clips

    def _expand_videos(self, ids: Sequence[int], expansions: Sequence[list[int]]) -> list[int]:
        """The prompt ids with the k-th ``<|video_pad|>`` replaced by the k-th video's expansion."""
        if not expansions:
            return list(ids)
        out: list[int] = []
        k = 0
        for t in ids:
            if t == self.video_id:
                out += expansions[k]
                k += 1
            else:
                out.append(int(t))
        return out

    # -- answers ------------------------------------------------------------------------------

    def read(self, q: Question, slot: Slot, entry: Entry, output: np.ndarray) -> dict[str, Any]:
        hidden = output if slot.branch is None else output[slot.branch]
        return answer(q, self.probabilities(hidden, len(q.options)))


__all__ = ["CONFIG_FORMAT", "Decision3Family", "QUESTION_TYPES", "check_config", "graphs"]
