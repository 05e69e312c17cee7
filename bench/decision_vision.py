"""Comparison: a decision-vision package at Qwen3-VL-2B's shape, our server against Transformers.

The subject is the decision-vision fixture source (``converters.decision_vision.build_fixture_source``)
with its text and vision configs set to Qwen3-VL-2B's shape (SHAPE_TEXT, SHAPE_VISION), random
weights N(0, 0.02²), and the fixture's small byte-level BPE (1,126 tokens; the 2B's 151k vocabulary
is a table lookup and a tied LM head whose code rows alone are read: it would only add memory).
Departures from the 2B, recorded in the tables: no deepstack mergers (the fixture's convention:
``deepstack_visual_indexes []``, the Qwen3.5 tower's layout; the 2B taps layers 5, 11 and 17) and
the fixture's vocabulary. All 28 text layers are built: the 5.6 GB text graph is packaged with its
weights in ``model.onnx.data`` (converters.graph_files). The source is written and converted
(``export_decision_vision``, its parity checks at their default bounds) once into the packages
directory, in a subprocess (``python -m bench.decision_vision build``).

Contestants, each in its own process with the same intra-op thread count:

- our server (``python -m edge_runtime serve``) over HTTP POST /v1/decisions, keep-alive: the
  family is state-once, so the media and state are read once and each question branches from
  their cache;
- the same server without state-once: each question sent as its own request (media, state and
  that one question), one after the other, as a client that asks one question at a time would;
- Transformers (``python -m bench.decision_vision torch``): what a user would do without state-once,
  ``Qwen3VLForConditionalGeneration``'s ``Qwen3VLModel`` (the class the converter verifies against)
  over each question's full sequence (media, state and that question) one by one, reading the same
  last position through the package's code rows; the token ids and pixels come from the package's
  own numpy processor (the converter checked it equal to Transformers' pixel for pixel).

Measured in interleaved rounds: one 448x448 PNG with a state and four questions (choice, noul,
score, noul), and a 2-second MP4 (PyAV, 224x224) with four questions; per-question latency
(request time / questions) and agreement of every answer's probabilities.

This module is also the entry point of its subprocesses (``build`` and ``torch`` import torch; the
harness imports neither torch nor onnxruntime).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.answers import max_abs_diff, response_probabilities
from bench.harness.clients import HttpDecider, OneByOne
from bench.harness.lab import Lab
from bench.harness.report import Table, fmt_ms, fmt_ratio
from bench.harness.runners import Answer, WorkerProcess, build_in_subprocess, contestant_main, interleaved_rounds
from bench.harness.server import ServerProcess
from bench.harness.stats import Summary, ratio, summarize

#: Qwen3-VL-2B-Instruct's text config (its config.json), as overrides of the fixture's.
SHAPE_TEXT: dict[str, Any] = {
    "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 5_000_000.0,
    "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True},
    "initializer_range": 0.02}
#: Its vision config; deepstack_visual_indexes stays the fixture's [] (the 2B's is [5, 11, 17]).
SHAPE_VISION: dict[str, Any] = {
    "depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16, "patch_size": 16,
    "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 2048, "num_position_embeddings": 2304,
    "initializer_range": 0.02}
#: Text layers built: the 2B's 28 (50.3M parameters each: a 5.6 GB text graph, packaged as
#: model.onnx + model.onnx.data).
TEXT_LAYERS = 28
SEED = 0
#: The converter's hidden-state parity bound: None keeps its 1e-4 (8 layers met it with 9.4e-6).
#: A deeper build may need it loosened (``DecisionVisionOptions.parity_tolerance``, recorded in the card).
TOLERANCE: float | None = None
IMAGE_SIDE = 448  # the request's PNG, read at this size (image_max_pixels = 448²: 28x28 patches, 196 tokens)
VIDEO_SIDE = 224  # the clip's frames (video_max_pixels = 224²: 14x14 patches, 49 tokens a pair)
VIDEO_SECONDS, VIDEO_FPS = 2.0, 10  # encoded at 10 fps; the card samples 2 fps: 4 frames, 2 pairs
MAX_INPUT_TOKENS = 2048
SOURCE_DIR = "bench-qwen3-vl-2b-shape-source"
PACKAGE_DIR = "bench-qwen3-vl-2b-shape"
MODEL = "bench-qwen3-vl-2b-shape"
BUILD_TIMEOUT_S = 2400
READY_TIMEOUT_S = 600.0
TIMED_BUDGET_S = 420.0  # no round starts after this many seconds of timed rounds
SETTLE_S = 0.3
IMAGE, VIDEO = "image", "video"
OURS, ONE_BY_ONE, TORCH = "ours", "ours-one-by-one", "torch"


# ---- build ---------------------------------------------------------------------------------------


def build(source: Path, package: Path) -> None:
    """Write the source at the 2B's shape when missing and convert it (imports torch)."""
    from converters.decision_vision.export import DecisionVisionOptions, export_decision_vision
    from converters.decision_vision.fixture import build_fixture_source

    if not (source / "config.json").is_file() or not (source / "preprocessor_config.json").is_file():
        shutil.rmtree(source, ignore_errors=True)
        build_fixture_source(source, SEED, text={**SHAPE_TEXT, "num_hidden_layers": TEXT_LAYERS},
                             vision=SHAPE_VISION)
    opts = DecisionVisionOptions(
        name=MODEL, version="0.0.1", release_date="2025-01-01", license="Apache-2.0",
        description="Random-weight Qwen3-VL at the 2B's shape (fewer text layers); a benchmark subject, not a model",
        source_name=f"edge-runtime bench qwen3-vl 2B shape, {TEXT_LAYERS} text layers (seed {SEED})",
        max_input_tokens=MAX_INPUT_TOKENS, image_max_pixels=IMAGE_SIDE * IMAGE_SIDE,
        video_max_pixels=VIDEO_SIDE * VIDEO_SIDE, parity_tolerance=TOLERANCE)
    export_decision_vision(source, package, opts)


def prepare(packages: Path, log_dir: Path) -> tuple[Path, Path, float | None]:
    """(source, package, seconds the build took this run or None when reused), built once into ``packages``."""
    source, package = packages / SOURCE_DIR, packages / PACKAGE_DIR
    if (source / "config.json").is_file() and (package / "card.json").is_file():
        return source, package, None
    built_s = build_in_subprocess("bench.decision_vision", "decision-vision", source, package, log_dir, BUILD_TIMEOUT_S)
    return source, package, built_s



# ---- requests ------------------------------------------------------------------------------------


def test_png(side: int = IMAGE_SIDE, seed: int = 3) -> bytes:
    """A PNG of smooth gradients plus noise (every pixel differs; resizing has work to do)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side]
    base = np.stack([x * 255 / (side - 1), y * 255 / (side - 1), (x + y) % 256], axis=-1)
    img = Image.fromarray(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8), "RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_mp4(side: int = VIDEO_SIDE, seconds: float = VIDEO_SECONDS, fps: int = VIDEO_FPS) -> bytes:
    """An MP4 (MPEG-4 part 2, PyAV) whose frames are moving gradients with noise."""
    import av

    rng = np.random.default_rng(5)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width = stream.height = side
        stream.pix_fmt = "yuv420p"
        y, x = np.mgrid[0:side, 0:side]
        for k in range(int(round(seconds * fps))):
            base = np.stack([(x + 8 * k) % 256, (y + 4 * k) % 256, (x + y) % 256], axis=-1).astype(np.float64)
            arr = np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


IMAGE_QUESTIONS: dict[str, Any] = {
    "colour": {"type": "choice", "instructions": "Which colour dominates the picture?",
               "criteria": {"red": "mostly red", "green": "mostly green", "blue": "mostly blue"}},
    "receipt": {"type": "noul", "instructions": "Does the picture show a receipt?"},
    "quality": {"type": "score", "instructions": "How sharp is the picture?",
                "levels": ["blurry", "fair", "sharp", "crisp"]},
    "busy": {"type": "noul", "instructions": "Is the picture busy?"},
}
VIDEO_QUESTIONS: dict[str, Any] = {
    "motion": {"type": "choice", "instructions": "Which way does the picture move?",
               "criteria": {"left": "towards the left", "right": "towards the right", "still": "it does not move"}},
    "paid": {"type": "noul", "instructions": "Does the clip show the receipt being paid?"},
    "light": {"type": "score", "instructions": "How bright is the clip?", "levels": ["dark", "dim", "bright"]},
    "person": {"type": "noul", "instructions": "Is a person visible?"},
}


def bench_requests(model: str = MODEL) -> dict[str, dict[str, Any]]:
    """The two timed requests: a 448x448 PNG and a 2-second MP4, each with a state and four questions."""
    png = "data:image/png;base64," + base64.b64encode(test_png()).decode()
    mp4 = "data:video/mp4;base64," + base64.b64encode(test_mp4()).decode()
    return {IMAGE: {"model": model, "state": "A photo taken at the shop counter, sent by the customer.",
                    "images": [png], "questions": IMAGE_QUESTIONS},
            VIDEO: {"model": model, "state": "A short clip from the counter camera.", "videos": [mp4],
                    "questions": VIDEO_QUESTIONS}}


# ---- contestants ---------------------------------------------------------------------------------


class TorchVision(WorkerProcess):
    """``python -m bench.decision_vision torch``: Transformers over each question's full sequence."""

    label = "Transformers (Qwen3VLModel, each question's full sequence, in-process)"

    def __init__(self, threads: int, source: Path, package: Path, log_path: Path) -> None:
        super().__init__(self.label, "bench.decision_vision",
                         ["torch", "--source", str(source), "--package", str(package)], threads, log_path)

    def answers(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._ask({"op": "answer", "body": body})

    def time(self, body: dict[str, Any], n: int) -> list[float]:
        return [float(s) for s in self._ask({"op": "time", "body": body, "n": n})["seconds"]]


def load_torch(source: Path, package: Path, threads: int) -> Answer:
    """A decisions body -> {"answers": ...}: each question's whole sequence (media, state, question)
    through Qwen3VLModel one by one, the last position read through the package's code rows.

    The ids and pixels are the package's (its tokenizer, chat markup and numpy processor, which the
    converter checked equal to Transformers' pixel for pixel), so both contestants read the same input.
    """
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    from tokenizers import Tokenizer
    from transformers import Qwen3VLForConditionalGeneration

    from edge_runtime.families.codes_prompt import READOUT
    from edge_runtime.families.decision_vision.planner import VisionPlanner
    from edge_runtime.families.registry import read_package
    from edge_runtime.heads.decisions import select_temperature
    from edge_runtime.questions import answer
    from edge_runtime.requests.decisions import parse_decisions_request

    pkg = read_package(package)
    root = Path(package)
    config = json.loads((root / "decision_config.json").read_text(encoding="utf-8"))
    head = np.load(root / "head.npz")
    planner = VisionPlanner.from_parts(Tokenizer.from_file(str(root / "tokenizer.json")), config,
                                       pkg.card.raw["limits"], np.load(root / "embeddings.npy", mmap_mode="r"),
                                       head[READOUT])
    model = Qwen3VLForConditionalGeneration.from_pretrained(source, dtype=torch.float32).eval()
    if "onnxruntime" in sys.modules:
        raise RuntimeError("onnxruntime was imported into the torch contestant")

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        entry = parse_decisions_request(body).single
        assert entry is not None
        images, videos = planner.read_media(entry)
        state_ids, _blocks = planner.state_with_media(entry.state, images, videos)
        media: dict[str, Any] = {}
        if images:
            media["pixel_values"] = torch.from_numpy(np.concatenate([p.patches for p in images]))
            media["image_grid_thw"] = torch.tensor([[p.grid_t, p.grid_h, p.grid_w] for p in images])
        if videos:
            clip = videos[0]
            first = clip.pairs[0].patches
            media["pixel_values_videos"] = torch.from_numpy(np.concatenate([p.patches.patches for p in clip.pairs]))
            media["video_grid_thw"] = torch.tensor([[len(clip.pairs), first.grid_h, first.grid_w]])
        temperature = select_temperature(config, len(entry.valid))
        answers = {}
        for q in entry.valid:
            ids = [*state_ids, *planner.prompt.question_ids(q, None, 1 << 30)]
            with torch.no_grad():
                hidden = model.model(input_ids=torch.tensor([ids]), **media).last_hidden_state[0, -1].numpy()
            answers[q.id] = answer(q, planner.probabilities(hidden, len(q.options), temperature))
        return {"answers": answers}

    return respond


# ---- the comparison ------------------------------------------------------------------------------


def run(lab: Lab) -> list[Table]:
    """Build (or reuse) the package, start both contestants, time them in interleaved rounds."""
    settings = lab.settings
    source, package, built_s = prepare(settings.packages, lab.log_dir)
    requests = bench_requests()
    server = lab.adopt(ServerProcess(package, "fp32", settings.threads, name=MODEL, log_dir=lab.log_dir))
    worker = TorchVision(settings.threads, source, package, lab.log_dir / "decision-vision-torch.log")
    started = time.perf_counter()
    try:
        server.wait_ready(READY_TIMEOUT_S)
        worker.wait_ready(READY_TIMEOUT_S)
        load_s = time.perf_counter() - started
        ours = HttpDecider("edge-runtime (HTTP POST /v1/decisions, keep-alive)", server)
        contestants: dict[str, HttpDecider | OneByOne | TorchVision] = {
            OURS: ours, ONE_BY_ONE: OneByOne(HttpDecider(OneByOne.label, server)), TORCH: worker}
        # One untimed call each warms every contestant; its answers are the agreement check.
        answers = {name: {k: c.answers(body) for k, c in contestants.items()} for name, body in requests.items()}
        samples = interleaved_rounds(settings.rounds, TIMED_BUDGET_S, SETTLE_S, {
            name: {k: functools.partial(c.time, body, 1) for k, c in contestants.items()}
            for name, body in requests.items()})
    finally:
        worker.stop()
        server.stop()
    per_q = {n: {k: [[s / len(requests[n]["questions"]) for s in rnd] for rnd in v] for k, v in by.items()}
             for n, by in samples.items()}
    stats = {n: {k: summarize(v) for k, v in by.items()} for n, by in per_q.items()}
    rounds = len(samples[IMAGE][OURS])
    tokens = {n: {k: int(a[k]["usage"]["input_tokens"]) for k in (OURS, ONE_BY_ONE)} for n, a in answers.items()}
    card = json.loads((package / "card.json").read_text(encoding="utf-8"))
    return [subject_table(built_s, card["verification"], load_s, settings.threads),
            latency_table(stats, tokens, rounds),
            agreement_table(answers)]


def subject_table(built_s: float | None, verification: Mapping[str, Any], load_s: float, threads: int) -> Table:
    """What was measured; ``verification`` is the package card's record of the converter's parity check."""
    built = "reused from an earlier run" if built_s is None else f"{built_s:.0f} s this run"
    t, v = SHAPE_TEXT, SHAPE_VISION
    out = verification.get("outputs", {})
    rows = [
        ["text model", f"random-weight Qwen3-VL text model at the 2B's shape: hidden {t['hidden_size']}, "
                       f"{TEXT_LAYERS} layers (the 2B has {t['num_hidden_layers']}), {t['num_attention_heads']} "
                       f"heads, {t['num_key_value_heads']} KV heads, head_dim {t['head_dim']}, intermediate "
                       f"{t['intermediate_size']}, M-RoPE {t['rope_scaling']['mrope_section']}; weights N(0, 0.02²); "
                       "the text graph's weights in model.onnx.data"],
        ["vision tower", f"the 2B's: depth {v['depth']}, hidden {v['hidden_size']}, {v['num_heads']} heads, "
                         f"intermediate {v['intermediate_size']}, patch {v['patch_size']}, spatial merge "
                         f"{v['spatial_merge_size']}, out hidden {v['out_hidden_size']}, position table "
                         f"{v['num_position_embeddings']}; no deepstack mergers (the fixture's [], the Qwen3.5 "
                         "tower's layout; the 2B taps layers 5, 11, 17)"],
        ["vocabulary", "the fixture's 1,126-token byte-level BPE, not the 2B's 151,936 (an embedding lookup and "
                       "the code rows of a tied LM head: it would add memory, not time)"],
        ["inputs", f"{IMAGE_SIDE}x{IMAGE_SIDE} PNG read at {IMAGE_SIDE}² pixels (28x28 patches, 196 image tokens); "
                   f"a {VIDEO_SECONDS:g} s MP4 of {VIDEO_SIDE}x{VIDEO_SIDE} at {VIDEO_FPS} fps, sampled at the "
                   "card's 2 fps (4 frames, 2 temporal pairs of 49 tokens)"],
        ["build (once, into the packages directory)", built],
        ["converter's parity check (card)",
         f"max |Δ hidden| {verification['max_abs_diff']:g} within {verification['tolerance']:g}; code "
         f"probabilities {out.get('probabilities', '?')}, state-once vs whole "
         f"{out.get('state_once_vs_whole', '?')}; {verification['cases']} cases (3 images, 1 video, box)"],
        ["modes", "ours state-once reads the media and state once and branches each question; ours one by one "
                  "sends each question as its own request (media, state and that question each time); "
                  "Transformers runs each question's full sequence (media, state, question) one by one"],
        ["threads", f"{threads} intra-op, 1 inter-op for both contestants"],
        ["start-up", f"{load_s:.0f} s until the server was ready and Transformers had loaded (in parallel)"],
    ]
    return Table("decision-vision: what was measured", ["item", "value"], rows)


def latency_table(stats: Mapping[str, Mapping[str, Summary]], tokens: Mapping[str, Mapping[str, int]],
                  rounds: int) -> Table:
    shapes = {IMAGE: f"one {IMAGE_SIDE}x{IMAGE_SIDE} PNG + state + 4 questions (choice, noul, score, noul)",
              VIDEO: f"one {VIDEO_SECONDS:g} s MP4 ({VIDEO_SIDE}², 2 pairs) + state + 4 questions"}
    rows = []
    for name, s in stats.items():
        ours, one, torch = s[OURS], s[ONE_BY_ONE], s[TORCH]
        rows.append([shapes[name], f"{tokens[name][OURS]:,} / {tokens[name][ONE_BY_ONE]:,}", f"1 × {rounds}",
                     fmt_ms(ours.median, 0), f"{fmt_ms(ours.round_low, 0)}–{fmt_ms(ours.round_high, 0)}",
                     fmt_ms(one.median, 0), fmt_ms(torch.median, 0),
                     f"{fmt_ms(torch.round_low, 0)}–{fmt_ms(torch.round_high, 0)}",
                     fmt_ratio(ratio(torch.median, ours.median)), fmt_ratio(ratio(torch.median, one.median)),
                     fmt_ratio(ratio(one.median, ours.median))])
    return Table(
        f"decision-vision at Qwen3-VL-2B's shape ({TEXT_LAYERS} text layers): per-question latency, "
        f"with and without state-once, against Transformers per question ({rounds} rounds)",
        ["request", "tokens read (state-once / one by one)", "calls", "ours state-once ms / question",
         "its round medians", "ours one by one ms / question", "Transformers ms / question",
         "Transformers round medians", "state-once vs Transformers", "one by one vs Transformers",
         "state-once vs one by one"],
        rows,
        ["Per question: a request's time ÷ its 4 questions. Ours: client wall time over HTTP (base64 media, "
         "decoding, processor, vision tower, JSON answers); state-once reads the media and state once and "
         "branches 4 questions, one by one sends 4 requests of one question each (media and state read each "
         "time). Transformers: in-process from the body to the answers (media decoded and processed by the "
         "package's numpy processor once, then 4 full forwards, vision tower included each time). Speed: the "
         "slower ÷ the faster.",
         "Tokens read: the responses' usage."],
    )


def agreement_table(answers: Mapping[str, Mapping[str, dict[str, Any]]]) -> Table:
    rows = []
    for name, by in answers.items():
        ours = response_probabilities(by[OURS])
        worst = max_abs_diff(ours, response_probabilities(by[TORCH]))
        a = {q: x.get("choice") for q, x in by[OURS]["answers"].items() if x.get("type") == "choice"}
        b = {q: x.get("choice") for q, x in by[TORCH]["answers"].items() if x.get("type") == "choice"}
        rows.append([name, f"{worst:.2e}", f"{sum(a[k] == b.get(k) for k in a)}/{len(a)}",
                     f"{max_abs_diff(ours, response_probabilities(by[ONE_BY_ONE])):.2e}"])
    return Table("decision-vision at Qwen3-VL-2B's shape: agreement",
                 ["request", "max |Δp| ours vs Transformers (every answer's probabilities)", "same choices",
                  "max |Δp| state-once vs one question per request"], rows,
                 ["ONNX Runtime's vision and text cores (state once, branches from its cache) against Qwen3VLModel "
                  "over each full sequence, fp32 both, on the timed requests. State-once is built to answer each "
                  "question exactly as a request of that question alone: 0 expected."])


def main(argv: Sequence[str] | None = None) -> int:
    return contestant_main(argv, "python -m bench.decision_vision", build, load_torch, "Transformers")


if __name__ == "__main__":
    sys.exit(main())
