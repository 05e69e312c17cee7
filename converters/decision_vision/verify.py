"""Verification of a decision-vision export: the two graphs against Transformers at three image sizes and a
video, state-once against each question alone, and the Box digit readout."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError
from converters.qwen_vision import verify_image
from edge_runtime.families.decision_vision.box_grid import digit_tree, edge_distribution

HIDDEN_TOLERANCE = 1e-4


BOX_TOLERANCE = 1e-5


PROBABILITY_TOLERANCE = 1e-4


#: Image sizes (height, width) the verification reads; chosen to give three different grids.
VERIFY_SIZES = ((64, 64), (96, 160), (150, 90))


VERIFY_VIDEO_FRAMES = 4


@dataclass
class Verified:
    hidden: float
    probabilities: float
    state_once: float
    processor: float
    cases: list[dict[str, Any]]


def verify_graphs(model: Any, hf_processor: Any, family: Any, work: Path,
            tolerance: float = HIDDEN_TOLERANCE) -> Verified:
    """The server's path against Qwen3VLModel, per case; raises ConversionError above tolerance."""
    import torch

    from edge_runtime.engine.session import create_session
    from edge_runtime.families.decision_vision.forward import VisionLanguageForward, vision_row
    from edge_runtime.requests.decisions import parse_decisions_request
    from edge_runtime.vision_lm.processor import VideoClip, pair_frames

    fwd = VisionLanguageForward(create_session(work / "vision.onnx", "cpu", 1),
                                create_session(work / "model.onnx", "cpu", 1), family.embeddings,
                                merge=family.settings.merge_size, side=family.side)
    question = parse_decisions_request({"state": "What does the picture show?", "questions": {
        "q": {"type": "choice", "instructions": "Which colour dominates?",
              "criteria": {"red": "mostly red", "green": "mostly green", "blue": "mostly blue"}}}}).single
    assert question is not None
    q = question.valid[0]
    q_ids = family.prompt.question_ids(q, None, 10_000)
    worst_h = worst_p = worst_branch = worst_pix = 0.0
    cases = []
    token_ids = family.config["token_ids"][: len(q.options)]

    def reference(ids: list[int], **media: Any) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), **media)
            hidden = model.model(input_ids=torch.tensor([ids]), **media).last_hidden_state[0, -1].numpy()
        z = out.logits[0, -1].double().numpy()[token_ids]
        e = np.exp(z - z.max())
        return hidden, e / e.sum()

    def compare(kind: str, ids: list[int], blocks: list[Any], ref_h: np.ndarray, ref_p: np.ndarray) -> None:
        nonlocal worst_h, worst_p, worst_branch
        state, branch = ids[: len(ids) - len(q_ids)], ids[len(ids) - len(q_ids):]
        _, whole_h, _ = fwd.prefill(vision_row(ids, blocks, [branch]))
        (branched_row,) = fwd([vision_row(state, blocks, [branch])])
        branched = branched_row.branches
        p = family.probabilities(branched[0], len(q.options), 1.0)
        dh = float(np.max(np.abs(whole_h - ref_h)))
        dp = float(np.max(np.abs(p - ref_p)))
        db = float(np.max(np.abs(branched[0] - whole_h)))
        worst_h, worst_p, worst_branch = max(worst_h, dh), max(worst_p, dp), max(worst_branch, db)
        cases.append({"case": kind, "tokens": len(ids), "hidden": float(f"{dh:.3g}"),
                      "probabilities": float(f"{dp:.3g}"), "state_once_vs_whole": float(f"{db:.3g}")})

    for i, (height, width) in enumerate(VERIFY_SIZES):
        image = verify_image(height, width, i)
        hf = hf_processor(images=[image], return_tensors="np")
        mine = family.processor.image(image, family.image_max_pixels)
        if (mine.grid_t, mine.grid_h, mine.grid_w) != tuple(int(x) for x in hf["image_grid_thw"][0]):
            raise ConversionError(f"processor grid {mine.grid_h}x{mine.grid_w} differs from Transformers' "
                                  f"{hf['image_grid_thw'][0].tolist()}")
        worst_pix = max(worst_pix, float(np.max(np.abs(mine.patches - hf["pixel_values"]))))
        state_ids, blocks = family.state_with_media(question.state, [mine], [])
        ids = [*state_ids, *q_ids]
        ref_h, ref_p = reference(ids, pixel_values=torch.from_numpy(hf["pixel_values"]),
                                 image_grid_thw=torch.from_numpy(hf["image_grid_thw"]))
        compare(f"image {height}x{width} (grid {mine.grid_h}x{mine.grid_w})", ids, blocks, ref_h, ref_p)

    frames = [verify_image(80, 112, 10 + k) for k in range(VERIFY_VIDEO_FRAMES)]
    times = [k * 0.5 for k in range(VERIFY_VIDEO_FRAMES)]
    clip = VideoClip(pair_frames(family.processor, frames, times, family.video_max_pixels), seconds=2.0)
    state_ids, blocks = family.state_with_media(question.state, [], [clip])
    ids = [*state_ids, *q_ids]
    pixel_values = np.concatenate([p.patches.patches for p in clip.pairs])
    first = clip.pairs[0].patches
    grid = torch.tensor([[len(clip.pairs), first.grid_h, first.grid_w]])
    ref_h, ref_p = reference(ids, pixel_values_videos=torch.from_numpy(pixel_values), video_grid_thw=grid)
    compare(f"video {len(frames)} frames as {len(clip.pairs)} pairs", ids, blocks, ref_h, ref_p)

    for name, value, tol in (("hidden state", worst_h, tolerance),
                             ("code probabilities", worst_p, PROBABILITY_TOLERANCE),
                             ("state-once vs the whole sequence", worst_branch, tolerance),
                             ("processor pixels", worst_pix, 0.0)):
        if not value <= tol:
            raise ConversionError(f"verification failed: {name} differ from Transformers' by {value:.3g}, "
                                  f"above {tol:g}; no package written")
    return Verified(worst_h, worst_p, worst_branch, worst_pix, cases)


def verify_box(model: Any, hf_processor: Any, planner: Any, work: Path) -> float:
    """The first two edges' P(v) against Transformers run on every digit path (brute force)."""
    import torch

    from edge_runtime.engine.session import create_session
    from edge_runtime.families.decision_vision.forward import VisionLanguageForward, vision_row
    from edge_runtime.requests.decisions import parse_decisions_request

    fwd = VisionLanguageForward(create_session(work / "vision.onnx", "cpu", 1),
                                create_session(work / "model.onnx", "cpu", 1), planner.embeddings,
                                merge=planner.settings.merge_size, side=planner.side)
    image = verify_image(96, 128, 7)
    entry = parse_decisions_request({"state": "Find it.", "questions": {
        "b": {"type": "box", "instructions": "the brightest corner"}}}).single
    assert entry is not None
    q = entry.valid[0]
    box = planner.box
    patches = planner.processor.image(image, planner.image_max_pixels)
    state, blocks = planner.state_with_media(entry.state, [patches], [])
    q_ids = box.question_ids(q, 10_000)
    (out,) = fwd([vision_row(state, blocks, [], [box.branch(q_ids, 1.0)])])
    hf = hf_processor(images=[image], return_tensors="pt")
    tree = digit_tree()
    prefixes = ["", *tree.index]
    committed: list[int] = []
    worst = 0.0
    for edge in range(2):
        term = box.readout.shape[0] - 2 if edge < 3 else box.readout.shape[0] - 1
        columns = [*box.digit_ids.tolist(), [*box.separator_ids][0] if term == 10 else 0]
        # Transformers' own generation path: the committed text once, then each digit path continued
        # from a copy of its cache (as generate() would continue it), 102 short forwards per edge
        base = [*state, *q_ids, *committed]
        with torch.no_grad():
            first = model(input_ids=torch.tensor([base]), pixel_values=hf["pixel_values"],
                          image_grid_thw=hf["image_grid_thw"], use_cache=True)
            logits = [first.logits[0, -1].double().numpy()[columns]]
            for p in prefixes[1:]:
                path = [int(box.digit_ids[int(c)]) for c in p]
                z = model(input_ids=torch.tensor([path]), past_key_values=copy.deepcopy(first.past_key_values),
                          cache_position=torch.arange(len(base), len(base) + len(path)), use_cache=True)
                logits.append(z.logits[0, -1].double().numpy()[columns])
        want = edge_distribution(np.asarray(logits), tree)
        got = box.distribution(edge, out.trees[0][edge], 1.0)
        if abs(want.sum() - 1) > 1e-9:
            raise ConversionError("verification: the box grammar's P(v) does not sum to 1")
        worst = max(worst, float(np.max(np.abs(got - want))))
        v = int(np.argmax(got))
        committed += [*(int(box.digit_ids[int(c)]) for c in str(v)), *box.separator_ids]
    return float(f"{worst:.3g}")
