"""decision-vision family: a Qwen3-VL decision model reads images and videos in its state.

The prompt, the media and the readout are planner.py's; the forward (forward.py) replaces the pad rows by
the vision core's output and runs the state once.

Every request runs state-once (``usage: state_once``): the state with its media is one block run
once, each question a branch of its key/value cache, so ``usage.input_tokens`` counts the state
once. A state-once request holds at most ``max_request_tokens`` (400 ``request_tokens``), the
videos of a request at most ``video_max_tokens`` (400 ``video_tokens``). Images and videos are
decoded while planning (edge_runtime.media), on the worker that tokenizes; a malformed or
over-limit one fails the request with 400 and its fixed reason (a batch entry fails in place).

Box questions (box_reader.py, where the package reads boxes) read the state's only image: each is a
tree branch of the same row, four forwards deep (one per edge), answered as edges over 0..1000 and the
card's confidence formula. With ``at`` a box reads the state's only video at that moment ("At <t>
seconds: ..."), and a track reads every moment k / rate up to the clip's end: a box tree and a
``visible`` Noul branch each. Their trees run one after another (no batching across moments yet).

Rows run alone (``batchable`` False): a row already batches its own questions, and rows of
different media share nothing worth padding for. Answers: ``softmax(R[:K] @ h / T)``, R the LM-head
rows of the codes, as decision-codes reads them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from edge_runtime.errors import ApiError
from edge_runtime.families.base import Graph, open_graphs
from edge_runtime.families.codes_prompt import READOUT
from edge_runtime.families.decision_plan import (
    DecisionFamily,
    DecisionPlan,
    Entry,
    Slot,
    answered_types,
    input_limit,
    plan_entries,
)
from edge_runtime.families.decision_vision.box_grid import CONFIDENCE_FORMULA
from edge_runtime.families.decision_vision.box_reader import BOX_READOUT
from edge_runtime.families.decision_vision.forward import (
    TreeBranch,
    VisionLanguageForward,
    VisionOutput,
    VisionRow,
    vision_row,
)
from edge_runtime.families.decision_vision.planner import StateTooLong, VisionPlanner
from edge_runtime.families.state_assets import StateAssets
from edge_runtime.heads.decisions import select_temperature
from edge_runtime.media.assets import replace_in
from edge_runtime.packages import Package
from edge_runtime.questions import InvalidQuestion, Question, answer, failed_answer, parse_question, refusal
from edge_runtime.questions.track import track_answer
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState
from edge_runtime.vision_lm.golden import VISION_GOLDEN, VISION_GRAPH, vision_golden
from edge_runtime.vision_lm.processor import VideoClip

QUESTION_TYPES = ("choice", "noul", "score", "box", "track")
CODE_TYPES = ("choice", "noul", "score")
EMBEDDINGS_FILE = "embeddings.npy"
#: Where this family reads images: in the state only. A question's own image would need its own
#: vision block after the shared state, and moving it into the state would change the other answers.
IMAGE_PLACEMENTS = ("state",)


def graphs(package: Package) -> list[Graph]:
    """The vision core beside the text core (model.onnx), self-checked when the package records it."""
    return [Graph("vision", VISION_GRAPH, vision_golden if VISION_GOLDEN in package.files else None)]


class DecisionVisionFamily(DecisionFamily[VisionLanguageForward]):
    """A loaded decision-vision package: plans decisions requests into VisionRows, answers from them."""

    batchable = False  # a row batches its own questions; see the module docstring

    def __init__(self, package: Package, session: Any = None, name: str | None = None,
                 max_input_tokens: int | None = None, opened: Mapping[str, Any] | None = None) -> None:
        card = package.card
        config = package.require_decision_config()
        self.name = name or card.name
        embeddings = np.load(package.file(EMBEDDINGS_FILE), mmap_mode="r", allow_pickle=False)
        weights = package.head_weights()
        if READOUT not in weights:
            raise ValueError(f"package {card.name}: head.npz has no {READOUT!r} array")
        self.planner = VisionPlanner(Tokenizer.from_file(str(package.file("tokenizer.json"))), config,
                                     dict(card.limits), embeddings, weights[READOUT], weights.get(BOX_READOUT))
        self.config = config
        limits = card.limits
        self.max_input_tokens = input_limit(card, max_input_tokens)
        self.max_request_tokens = int(limits.get("max_request_tokens", self.max_input_tokens))
        types = CODE_TYPES
        if self.planner.box is not None:
            types = (*CODE_TYPES, "box", *(("track",) if "video" in card.modalities else ()))
        self.question_types = answered_types(card, types)
        box_video = limits.get("box_video_max_seconds")
        self.box_video_max_seconds = None if box_video is None else float(box_video)
        self.modalities = frozenset(card.modalities)
        placements = card.raw.get("image_placements", list(IMAGE_PLACEMENTS))
        if "image" in self.modalities and tuple(placements) != IMAGE_PLACEMENTS:
            raise ValueError(f"package {card.name}: image_placements {placements} cannot be served; this family "
                             f"reads images in {list(IMAGE_PLACEMENTS)} only")
        if session is not None:
            if opened is None:  # built outside the loader (converters, tests): open it the same way
                # the vision core runs on the text core's device with its thread count
                opened, _ = open_graphs(package, graphs(package), session)
            self._forward = VisionLanguageForward(opened["vision"], session, embeddings,
                                                  merge=self.planner.settings.merge_size, side=self.planner.side)

    # -- engine hooks -----------------------------------------------------------------------

    def probe_row(self, length: int) -> VisionRow:
        """A text-only row of ``length`` tokens (rows run alone, so the probe is not run on them)."""
        ids = list(range(max(1, length)))
        return vision_row(ids[:-1] or ids, [], [ids[-1:]])

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {**super().describe(), "modalities": sorted(self.modalities),
                               "image_placements": list(IMAGE_PLACEMENTS)}
        if self.planner.box is not None:
            out["box_confidence"] = self.card_box_confidence()
        return out

    def card_box_confidence(self) -> str:
        """The formula a Box answer's confidence follows (the contract: the model card's formula)."""
        return CONFIDENCE_FORMULA

    # -- planning ---------------------------------------------------------------------------

    def plan_request(self, request: DecisionsRequest) -> DecisionPlan:
        """Decode media, render and tokenize every answerable question; decide the others now."""
        cap = self.budget(request)
        assets = StateAssets(request, self.planner.image_limits.max_bytes if "image" in self.modalities else None)
        return plan_entries(request, self.name, self.modalities,
                            lambda name, entry, rows: self._plan_entry(name, entry, cap, rows, assets),
                            last_check=assets.check_all_used)

    def _plan_entry(self, name: str | None, entry: DecisionState, cap: int, rows: list[VisionRow],
                    assets: StateAssets) -> Entry:
        planned = Entry(name, [])
        answerable: list[Slot] = []
        state, state_uses = assets.state(entry)
        targeted: set[str] = set()
        for q in entry.questions:
            refused = None if isinstance(q, InvalidQuestion) else self._unsupported(q)
            if refused is None and isinstance(q, Question) and q.type == "box" and q.at is None:
                aimed = self._box_asset_target(q, assets, state_uses, len(entry.images))
                if isinstance(aimed, InvalidQuestion):
                    refused = aimed
                elif aimed is not None:
                    q = aimed
                    targeted.add(q.id)
            if refused is None and isinstance(q, Question) and q.id not in targeted:
                refused = assets.question_refusal(self.name, q)
            slot = Slot(refused or q)
            planned.slots.append(slot)
            if isinstance(slot.question, Question):
                answerable.append(slot)
        planned.temperature = select_temperature(self.config, sum(1 for q in entry.valid if q.type in CODE_TYPES))
        images_in_state, videos_in_state = len(entry.images) + len(state_uses), len(entry.videos)
        for slot in answerable:
            if (isinstance(slot.question, Question) and slot.question.type in ("box", "track")
                    and slot.question.id not in targeted):
                slot.question = self._box_target(slot.question, images_in_state, videos_in_state) or slot.question
        answerable = [s for s in answerable if isinstance(s.question, Question)]
        if not answerable:
            return planned
        images, videos = self.planner.read_media(entry, assets.images(state_uses))
        try:
            state_ids, blocks = self.planner.state_with_media(state, images, videos, cap)
        except StateTooLong:
            for slot in answerable:
                slot.answer = self._too_long(slot.question, cap)  # type: ignore[arg-type]
            return planned
        box = self.planner.box
        codes: list[Slot] = []
        boxes: list[Slot] = []
        tracks: list[tuple[Slot, list[float], list[list[int]], list[list[int]]]] = []
        budget = cap - len(state_ids)
        for slot in answerable:
            q = slot.question
            assert isinstance(q, Question)
            if q.type in ("box", "track") and (q.at is not None or q.type == "track"):
                slot.answer = self._video_refusal(q, videos[0])
                if slot.answer is not None:
                    continue
            if q.type == "track":
                assert box is not None
                times = self._track_times(videos[0].seconds, q.rate or 1)
                asked = [box.question_ids(q, budget, t) for t in times]
                nouls = [self.planner.prompt.question_ids(self._visible(q, t), None, budget) for t in times]
                if any(x is None for x in [*asked, *nouls]):
                    slot.answer = self._too_long(q, cap)
                else:
                    tracks.append((slot, times, asked, nouls))  # type: ignore[arg-type]
                continue
            if q.type == "box":
                assert box is not None  # box is answered only where the package reads boxes
                ids = box.question_ids(q, budget, q.at)
            else:
                ids = self.planner.prompt.question_ids(q, None, budget)
            if ids is None:
                slot.answer = self._too_long(q, cap)
            else:
                slot.ids = ids
                (boxes if q.type == "box" else codes).append(slot)
        if not codes and not boxes and not tracks:
            return planned
        image_boxes = [s for s in boxes if s.question.at is None]  # type: ignore[union-attr]
        capped = (len(state_ids) + sum(len(s.ids or ()) for s in codes)
                  + sum(box.tokens(s.ids or ()) for s in image_boxes if box is not None))
        # the frame windows a video Box or track reads are bounded by the video limits, not this cap
        if capped > self.max_request_tokens:
            raise ApiError("invalid_request", f"the state once and every question take {capped} tokens, more than "
                           f"the model's max_request_tokens {self.max_request_tokens}",
                           reason="request_tokens", limit=self.max_request_tokens)
        row = len(rows)
        temperature = float(self.config.get("temperature", 1.0))  # Box and track keep the package's
        branches = [s.ids or [] for s in codes]
        trees: list[TreeBranch] = []
        for j, slot in enumerate(codes):
            slot.row, slot.branch = row, j
        for slot in boxes:
            assert box is not None
            slot.row, slot.branch = row, len(trees)
            trees.append(box.branch(slot.ids or [], temperature))
        total = capped + sum(box.tokens(s.ids or ()) for s in boxes if s not in image_boxes and box is not None)
        for slot, times, tree_ids, noul_ids in tracks:
            assert box is not None
            slot.row = row
            # where its trees and its visible branches start, and how many moments (at k / rate)
            slot.reading = (len(trees), len(branches), len(times))
            trees.extend(box.branch(ids, temperature) for ids in tree_ids)
            branches.extend(noul_ids)
            total += sum(box.tokens(ids) for ids in tree_ids) + sum(len(ids) for ids in noul_ids)
        rows.append(vision_row(state_ids, blocks, branches, trees))
        planned.tokens = total
        return planned

    @staticmethod
    def _track_times(seconds: float, rate: int) -> list[float]:
        """Every sampled moment: 0, 1/rate, 2/rate, ... up to the clip's end."""
        return [k / rate for k in range(int(math.floor(seconds * rate + 1e-9)) + 1)]

    @staticmethod
    def _visible(q: Question, t: float) -> Question:
        """The Noul a track reads at each moment for ``visible``."""
        what = q.instructions if isinstance(q.instructions, str) else json.dumps(q.instructions)
        made = parse_question(q.id, {"type": "noul", "instructions": f"At {t:.1f} seconds, is this visible: {what}"})
        assert isinstance(made, Question)
        return made

    def _video_refusal(self, q: Question, clip: VideoClip) -> dict[str, Any] | None:
        """box_video_too_long past limits.box_video_max_seconds or for a length the container does not state."""
        limit = self.box_video_max_seconds
        if limit is not None and (clip.seconds > limit or not clip.measured):
            why = (f"is {clip.seconds:.1f} s long, more than {limit:g} s" if clip.measured
                   else "does not state its length in its container")
            return failed_answer(q.type, "invalid_input", "box_video_too_long",
                                 f"a {q.type} question reads a clip of at most {limit:g} s; this video {why}")
        if q.at is not None and q.at > clip.seconds:
            return failed_answer(q.type, "invalid_question", "question_malformed",
                                 f"at {q.at:g} s is past the video's end ({clip.seconds:.1f} s)")
        return None

    def _box_target(self, q: Question, images: int, videos: int) -> InvalidQuestion | None:
        """A box reads the state's only image (with ``at``, and a track, its only video):
        box_needs_image without one, box_target_ambiguous with more."""
        on_video = q.at is not None or q.type == "track"
        count, what = (videos, "video") if on_video else (images, "image")
        if count == 0:
            return InvalidQuestion(q.id, q.type, "box_needs_image", f"a {q.type} question needs a {what} in the state")
        if count > 1:
            return InvalidQuestion(q.id, q.type, "box_target_ambiguous",
                                   f"the state has {count} {what}s; a {q.type} question reads the state's only {what}")
        return None

    def _unsupported(self, q: Question) -> InvalidQuestion | None:
        refused = refusal(q, self.name, self.question_types)
        if refused is None and len(q.options) > len(self.planner.prompt.codes):
            return InvalidQuestion(q.id, q.type, "too_many_options",
                                   f"model {self.name!r} lists at most {len(self.planner.prompt.codes)} options; "
                                   f"this question has {len(q.options)}")
        return refused

    def _box_asset_target(self, q: Question, assets: StateAssets, state_uses: list[str],
                          images: int) -> Question | InvalidQuestion | None:
        """A box whose instructions reference an image reads that image (the contract), which must be
        in the state (image_placements: state): the reference becomes the state's ``[image k]``."""
        if assets.assets is None:
            return None
        refs = assets.assets.used_in(q.instructions)
        if not refs:
            return None
        assets.used.extend(refs)
        if len(set(refs)) > 1:
            return InvalidQuestion(q.id, q.type, "box_target_ambiguous",
                                   f"the instructions reference {len(set(refs))} images; a box reads one")
        if refs[0] not in state_uses:
            return InvalidQuestion(q.id, q.type, "question_images_unsupported",
                                   f"model {self.name!r} reads images in the state only; put the image the box "
                                   "question locates in the state")
        k = images + state_uses.index(refs[0]) + 1
        return dataclasses.replace(q, instructions=replace_in(q.instructions, assets.assets,
                                                              lambda _: f"[image {k}]")[0])

    def _too_long(self, q: Question, cap: int) -> dict[str, Any]:
        return failed_answer(q.type, "max_length_exceeded", "question_tokens",
                             f"the state, its media and this question take more than the {cap} tokens "
                             "this model reads per question")

    # -- answers ----------------------------------------------------------------------------

    def read(self, q: Question, slot: Slot, entry: Entry, output: VisionOutput) -> dict[str, Any]:
        if q.type == "track":
            return self._read_track(q, slot, output)
        assert slot.branch is not None
        temperature = float(self.config.get("temperature", 1.0))
        box = self.planner.box
        if q.type == "box":
            assert box is not None
            return box.answer(output.trees[slot.branch], temperature, q.at)
        return answer(q, self.planner.probabilities(output.branches[slot.branch], len(q.options),
                                                    entry.temperature))

    def _read_track(self, q: Question, slot: Slot, output: VisionOutput) -> dict[str, Any]:
        """Every moment's box (its tree) and visible (its Noul branch: P(true))."""
        box = self.planner.box
        assert box is not None and slot.reading is not None
        first_tree, first_branch, moments = slot.reading
        times = [k / (q.rate or 1) for k in range(moments)]
        temperature = float(self.config.get("temperature", 1.0))
        points = []
        for k, t in enumerate(times):
            found = box.answer(output.trees[first_tree + k], temperature, t)
            visible = self.planner.probabilities(output.branches[first_branch + k], 2, temperature)[1]
            points.append((t, found["box"], found["confidence"], float(visible)))
        return track_answer(points)


__all__ = ["DecisionVisionFamily", "graphs"]
