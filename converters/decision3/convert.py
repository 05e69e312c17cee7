"""`export SRC --kind decision3`: an upstream Decision 3.0 package becomes an edge-runtime decision3 package.

Steps: verify the source exactly as the released runtime does (source.py), build its tokenizer (tokenizer.py),
upcast the BF16 text weights exactly to fp32, export the text core (export.py: inputs_embeds in, GDN states and
attention caches in and out, the package's attention mode baked in), and check it: the code probabilities of
generated requests (choice, noul, score; empty, short and long states) read from the ONNX graph through the
server's own Forward (edge_runtime.engine.recurrent) against Transformers 5's ``Qwen3_5TextModel`` in fp32
(run in .venv-ref), within :data:`PROBABILITY_TOLERANCE`, plus the agreement of the fp32 answers with
Transformers in BF16 (how the released runtime computes). For causal packages the state-once path (the
longest common token prefix of a request's rows run once, each question continuing from its states) is
checked against the whole rows. ``--no-reference`` skips Transformers; the graph is then checked against
our own torch forward only and the card says it is not verified against Transformers.

The written package (docs/decision3.md): model.onnx, embeddings.npy (float32 [vocab, H]), head.npz (readout
[255, H], rounded through readout_dtype), decision_config.json (ours), tokenizer.json (as built), card.json,
golden.npz. A package with a vision tower (``vision_config``) also gets vision.onnx (decision-vision's grid-free
vision core, converters/decision3/vision.py) and a ``vision`` member in decision_config.json (token ids, the
image processor's settings, the position table's side); the image path (processor, vision core, placeholders
expanded and scattered, Qwen's 3-D positions, the text core) is checked against Transformers 5's
``Qwen3_5Model`` given the same pixels on the golden image request (§3.10) and a two-image request, within
:data:`PROBABILITY_TOLERANCE` on the code probabilities, and the card records the figures.
"""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.decision3 import source as src
from converters.decision3.tokenizer import (
    BuiltTokenizer,
    build_tokenizer,
    check_chat_template,
    check_codes,
    check_config_tokens,
)
from converters.decision3.verify import Verified, check_rows, sample_requests, verify
from converters.decision3.verify import goldens as golden_cases
from converters.decision3.vision import ImageVerified
from converters.errors import ConversionError
from converters.identity import PackageIdentity, identity_card, notice_files, sanitize_name
from converters.package_writer import ExportResult, PackageBuild, card_start, json_bytes
from converters.progress import log
from converters.verify import rounded
from edge_runtime.families.decision3.family import QUESTION_TYPES
from edge_runtime.families.decision3.prompt import D3Prompt
from edge_runtime.families.decision3.vision import MAX_PIXELS
from edge_runtime.packages.golden import npz_bytes
from edge_runtime.vision_lm.golden import VISION_GOLDEN

KIND = "decision3"
#: The image intake's limits (upstream-formats.md §3.8): decoded bytes, source pixels, the resized budget.
IMAGE_LIMITS = {"image_max_bytes": 8_000_000, "image_source_max_pixels": 16_000_000, "image_max_pixels": MAX_PIXELS}
#: The video intake's limits: the d3 runtime's 32,000,000 bytes; seconds and source pixels as decision-vision's;
#: frames and per-frame pixels as the package's video settings (converters/decision3/vision.py)
VIDEO_LIMITS = {"video_max_bytes": 32_000_000, "video_max_seconds": 300, "video_source_max_pixels": 8_294_400}
CONFIG_FORMAT = "decision3-config/1"
#: the largest |p_onnx - p_transformers| over the code probabilities accepted (fp32 both)
PROBABILITY_TOLERANCE = 1e-5
#: the largest |h_onnx - h_transformers| at an image question's read position accepted (fp32 both; decision-vision's)
IMAGE_HIDDEN_TOLERANCE = 1e-4
#: the largest |pixel_ours - pixel_transformers| accepted (the same Pillow semantics: measured 0.0 on the fixture)
PROCESSOR_TOLERANCE = 1e-6
DEFAULT_CHECK_REQUESTS = 50
#: rows per ORT call while checking (the server batches the same way; rows are batch-invariant)
NONCAUSAL_STATE_ONCE = ("a full-attention layer of a noncausal_full_attention package lets the prefix's positions "
                        "attend to the question's tokens, so the prefix's states depend on the question: every "
                        "question runs its whole prompt")


@dataclass(kw_only=True)
class Decision3Options(PackageIdentity):
    """What `export --kind decision3` takes besides the identity."""

    reference: bool = True
    check_requests: int = DEFAULT_CHECK_REQUESTS
    max_input_tokens: int | None = None


# ---- export -------------------------------------------------------------------------------------


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def decision_config(source: src.Decision3Source, built: BuiltTokenizer, limit: int) -> dict[str, Any]:
    """The converted package's decision_config.json: what the server's family reads."""
    return {
        "format": CONFIG_FORMAT, "prompt": "d3", "codes": source.codes, "token_ids": source.token_ids,
        "temperature": source.temperature, "attention_mode": source.attention_mode, "pad_id": built.pad_id,
        "special_ids": built.special_ids, "max_input_tokens": limit,
        "layer_types": list(source.text_config["layer_types"]), "readout_dtype": source.readout_dtype,
        "source": {"format_id": src.FORMAT_ID, "model_sha256": source.model_sha256,
                   "manifest_sha256": source.manifest_sha256, "base_model": source.decision.get("base_model"),
                   "revision": source.decision.get("revision")},
    }


@dataclass
class CheckedSource:
    """An upstream package verified as the released runtime verifies it, with its tokenizer built."""

    source: src.Decision3Source
    template: str  # the chat template's sha256
    built: BuiltTokenizer


def _checked_source(src_path: str | Path) -> CheckedSource:
    """Read the upstream package and check its chat template, tokenizer, codes and config tokens."""
    source = src.read_source(src_path)
    template = check_chat_template(source.root)
    built = build_tokenizer(source.root)
    check_codes(built.tokenizer, source.codes, source.token_ids)
    check_config_tokens(built, source.config, source.vision_prefix is not None)
    return CheckedSource(source, template, built)


def _text_weights(checked: CheckedSource) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The text weights upcast exactly to fp32, the embedding table and the readout matrix."""
    source = checked.source
    weights = src.text_weights(source)
    if "embed_tokens.weight" not in weights:
        raise ConversionError("the checkpoint has no language_model embed_tokens.weight")
    embeddings = np.ascontiguousarray(weights["embed_tokens.weight"].numpy(), dtype=np.float32)
    vocab = checked.built.tokenizer.get_vocab_size()
    if embeddings.shape[0] < vocab:
        raise ConversionError(f"the embedding table has {embeddings.shape[0]} rows; the tokenizer has {vocab} ids")
    return weights, embeddings, src.readout_matrix(source)


def _checked(verified: Verified) -> Verified:
    """``verified`` unless the graph or its state-once path is past PROBABILITY_TOLERANCE (ConversionError)."""
    if verified.probabilities > PROBABILITY_TOLERANCE:
        raise ConversionError(f"the graph's code probabilities differ from the reference by "
                              f"{verified.probabilities:.3g} (> {PROBABILITY_TOLERANCE})")
    if verified.state_once is not None and verified.state_once > PROBABILITY_TOLERANCE:
        raise ConversionError(f"state-once code probabilities differ from whole rows by {verified.state_once:.3g} "
                              f"(> {PROBABILITY_TOLERANCE})")
    return verified


def export_decision3(src_path: str | Path, out: Path, opts: Decision3Options) -> ExportResult:
    """Convert the upstream package ``src_path`` into the package ``out`` (see the module docstring)."""
    from converters.decision3.export import OPSET, export_text_core

    if opts.check_requests < 1:
        raise ConversionError("the parity check needs at least one request")
    with PackageBuild(out, "er-decision3-") as build:
        with build.step("verify", "verifying the upstream Decision 3.0 package"):
            checked = _checked_source(src_path)
        source, built = checked.source, checked.built
        limit = source.max_input_tokens
        if opts.max_input_tokens is not None:
            if not src.MIN_INPUT_TOKENS <= opts.max_input_tokens <= limit:
                raise ConversionError(f"--max-input-tokens must be in [{src.MIN_INPUT_TOKENS}, {limit}]")
            limit = opts.max_input_tokens
        with build.step("read", "reading the BF16 text weights (exact fp32 upcast)"):
            weights, embeddings, readout = _text_weights(checked)
        prompt = D3Prompt(built.tokenizer, source.codes)
        rows = check_rows(prompt, sample_requests(opts.check_requests), limit)
        with build.step("export", f"exporting the text core to ONNX (opset {OPSET}, {source.attention_mode})"):
            report = export_text_core(weights, source.text_config, source.attention_mode, build.work / "model.onnx")
        graph = report.files[0]
        what = "Transformers 5 (fp32 and bf16)" if opts.reference else "our torch forward (--no-reference)"
        with build.step("parity", f"checking code probabilities over {len(rows)} questions against {what}"):
            verified = _checked(verify(source, weights, graph, embeddings, readout, rows, built.pad_id,
                                       opts.reference))
        log(f"parity: max |dp| = {verified.probabilities:.3g}, hidden {verified.hidden:.3g}"
            + (f", bf16 argmax agreement {verified.bf16['argmax_agreement']}" if verified.bf16 else "")
            + (f", state-once vs whole {verified.state_once:.3g}" if verified.state_once is not None else ""))
        images = None
        vision_files: list[Path] = []
        config = decision_config(source, built, limit)
        if source.vision_prefix is not None:
            images, vision_files, config["vision"] = _vision(source, build, graph, prompt, embeddings, readout,
                                                             limit, opts.reference)
        goldens = {"fp32": golden_cases(graph, embeddings, rows)}
        if images is not None:  # the golden image question through the text core, self-checked at load
            goldens["fp32"].append(_image_golden(graph, images))
        files: dict[str, Path | bytes] = {
            **{p.name: p for p in report.files},
            **{p.name: p for p in vision_files},
            "embeddings.npy": _npy_bytes(embeddings),
            "head.npz": npz_bytes({"readout": readout}),
            "tokenizer.json": built.to_json(),
            "decision_config.json": json_bytes(config),
        }
        if images is not None:
            files[VISION_GOLDEN] = npz_bytes(images.golden_vision)
        files.update(notice_files(source.root, opts))
        card = _card(opts, checked, config, limit, (report.input_names, report.output_names), verified, images)
        return build.write(card, files, goldens)


def _card(opts: Decision3Options, checked: CheckedSource, config: dict[str, Any], limit: int,
          graph_names: tuple[list[str], list[str]], verified: Verified, images: ImageVerified | None) -> dict[str, Any]:
    import torch

    from converters.decision3.export import OPSET

    source, template = checked.source, checked.template
    vision = source.vision_prefix is not None
    video = vision and "video" in config.get("vision", {})
    video_limits: dict[str, Any] = {}
    if video:
        vs = config["vision"]["video"]
        video_limits = {**VIDEO_LIMITS, "video_max_frames": vs["max_frames"], "video_max_pixels": vs["max_pixels"],
                        # every sampled pair at the per-frame budget
                        "video_max_tokens": vs["max_frames"] // 2 * vs["max_pixels"]
                        // (vs["patch_size"] * vs["merge_size"]) ** 2}
    if opts.reference:
        reference = (f"Transformers 5 Qwen3_5TextModel fp32 ({source.attention_mode}, upstream's noncausal hook "
                     "where set), code probabilities at the last real token")
    else:
        reference = ("not verified against Transformers (--no-reference): the graph against edge-runtime's torch "
                     "Qwen3.5 forward it was exported from")
    outputs = {"probabilities": rounded(verified.probabilities),
               "last_hidden_state": rounded(verified.hidden),
               "torch_core_probabilities": rounded(verified.torch_core)}
    if verified.state_once is not None and verified.state_once_hidden is not None:  # measured together
        outputs["state_once_vs_whole"] = rounded(verified.state_once)
        outputs["state_once_vs_whole_hidden"] = rounded(verified.state_once_hidden)
    if images is not None and images.reference:
        outputs["image_probabilities"] = rounded(images.probabilities)
        outputs["image_last_hidden_state"] = rounded(images.hidden)
    identity = identity_card(
        opts, source.root, source_name=opts.source_name or str(source.decision.get("base_model") or source.root.name),
        architecture="Qwen3_5Model", stamp=source.model_sha256,
        description=f"Decision 3.0 code-readout model ({source.attention_mode}) from {source.root.name}")
    return {
        **card_start(sanitize_name(opts.name or source.manifest.get("model_name") or source.root.name), KIND, KIND,
                     identity, modalities=("text", "image", "video") if video else ("text", "image") if vision
                     else ("text",)),
        "head": {"output": "last_hidden_state", "pooling": "last", "readout": "head.npz:readout",
                 "codes": src.MAX_OPTIONS, "readout_dtype": source.readout_dtype,
                 "temperature": source.temperature},
        "limits": {"max_input_tokens": limit, **(IMAGE_LIMITS if vision else {}), **video_limits},
        "graph": {"inputs": graph_names[0], "outputs": graph_names[1], "opset": OPSET,
                  "attention_mode": source.attention_mode, "layer_types": config["layer_types"],
                  "embeddings": "embeddings.npy",
                  **({"vision": {"file": "vision.onnx", **{k: config["vision"][k] for k in
                                 ("inputs", "outputs", "patch_dim", "position_side")}}} if vision else {})},
        "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
        "verification": {"reference": reference, "max_abs_diff": outputs["probabilities"],
                         "tolerance": PROBABILITY_TOLERANCE, "cases": verified.cases, "outputs": outputs,
                         "lengths": verified.lengths, "transformers": verified.transformers,
                         **({"bf16": verified.bf16} if verified.bf16 else {}),
                         **({"images": _image_report(images)} if images is not None else {})},
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": source.model_sha256,
                  "torch": torch.__version__.split("+")[0],
                  "options": {"reference": opts.reference, "check_requests": opts.check_requests,
                              "max_input_tokens": opts.max_input_tokens}},
        "attention_mode": source.attention_mode,
        **({"image_placements": ["state"], "processor": config["vision"]["processor"],
            "videos": ("the d3 runtime's: frames by index at 2 fps, Transformers' video smart_resize per frame, "
                       "<t seconds> per frame pair" if video else "refused (video_unsupported): the source has no "
                       "video_preprocessor_config.json")} if vision else {}),
        "question_types": list(QUESTION_TYPES),
        "usage": "state_once" if source.attention_mode == "causal" else "per_question",
        "state_once": ("the longest common token prefix of a request's question prompts runs once; each "
                       "question continues from its GDN and attention states" if source.attention_mode == "causal"
                       else NONCAUSAL_STATE_ONCE),
        "upstream": {"format_id": src.FORMAT_ID, "model_sha256": source.model_sha256,
                     "manifest_sha256": source.manifest_sha256, "chat_template_sha256": template,
                     "vision_tower": ("converted: vision.onnx (Qwen3-VL's grid-free vision core, no deepstack)"
                                      if vision else "absent")},
    }


def _vision(source: src.Decision3Source, build: PackageBuild, graph: Path, prompt: D3Prompt, embeddings: np.ndarray,
            readout: np.ndarray, limit: int, reference: bool) -> tuple[ImageVerified, list[Path], dict[str, Any]]:
    """Export the vision tower and check the image path; returns the check, the files and the config member."""
    from converters.decision3.export import OPSET
    from converters.decision3.vision import check_images, export_vision, processor_settings, video_settings
    from converters.graph_files import gather_graph

    vcfg = source.vision_config or {}
    settings = processor_settings(source.root, vcfg)
    videos = video_settings(source.root, vcfg)
    with build.step("vision_export", f"exporting the vision tower to ONNX (opset {OPSET})"):
        path = build.work / "vision.onnx"
        shapes = export_vision(vcfg, src.vision_weights(source), path)
        files = gather_graph(path)
    what = "Transformers 5 Qwen3_5Model" if reference else "nothing (--no-reference): the path runs"
    with build.step("image_parity", f"checking the image path against {what}"):
        images = check_images(source, graph, path, settings, prompt, embeddings, readout, limit, reference, videos)
    if reference:
        if not (images.probabilities <= PROBABILITY_TOLERANCE and images.hidden <= IMAGE_HIDDEN_TOLERANCE
                and images.processor <= PROCESSOR_TOLERANCE):
            raise ConversionError(f"the image path differs from Transformers': code probabilities by "
                                  f"{images.probabilities:.3g} (tolerance {PROBABILITY_TOLERANCE}), hidden states by "
                                  f"{images.hidden:.3g} (tolerance {IMAGE_HIDDEN_TOLERANCE}), pixel values by "
                                  f"{images.processor:.3g} (tolerance {PROCESSOR_TOLERANCE}); no package written")
        log(f"image parity: max |dp| = {images.probabilities:.3g}, hidden {images.hidden:.3g}, "
            f"processor pixels {images.processor:.3g} "
            f"({images.cases} questions, grids {images.grids})")
    member = {"graph": path.name, "inputs": shapes["inputs"], "outputs": shapes["outputs"],
              "patch_dim": shapes["patch_dim"], "position_side": shapes["position_side"],
              "image_token_id": int(source.config["image_token_id"]),
              "video_token_id": int(source.config["video_token_id"]),
              "vision_start_token_id": int(source.config["vision_start_token_id"]),
              "vision_end_token_id": int(source.config["vision_end_token_id"]),
              "processor": settings.card(), **({"video": videos.card()} if videos is not None else {})}
    return images, files, member


def _image_golden(graph: Path, images: ImageVerified) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A batch-1 golden case of the text core on the golden image question (vision rows and 3-D positions)."""
    from edge_runtime.engine.recurrent import RecurrentForward
    from edge_runtime.engine.session import create_session

    session = create_session(graph, "cpu", 1)
    row = images.golden_row
    assert row.positions is not None
    n = len(row.embeds)
    feeds = {"inputs_embeds": row.embeds[None], "attention_mask": np.ones((1, n), dtype=np.int64),
             "position_ids": row.positions[None], **RecurrentForward(session).empty_states(1)}
    return feeds, session.run(feeds, ["last_hidden_state"])


def _image_report(images: ImageVerified) -> dict[str, Any]:
    """The card's record of the image check."""
    if not images.reference:
        return {"reference": "not verified against Transformers (--no-reference)", "cases": images.cases,
                "grids": images.grids, **({"video_cases": images.videos} if images.videos else {})}
    return {"reference": "Transformers 5 Qwen3_5Model fp32 given the same pixel_values and image_grid_thw (its "
                         "vision tower, placeholder scatter and get_rope_index), last token",
            "cases": images.cases, "grids": images.grids, "tolerance": PROBABILITY_TOLERANCE,
            "hidden_tolerance": IMAGE_HIDDEN_TOLERANCE,
            "max_abs_diff_probabilities": float(f"{images.probabilities:.3g}"),
            "max_abs_diff_last_hidden_state": float(f"{images.hidden:.3g}"),
            "processor": "ours (decision-vision's numpy + Pillow) against Transformers 5 Qwen2VLImageProcessorPil on "
                         "the same images: grids equal, max |d pixel|",
            "max_abs_diff_processor_pixels": float(f"{images.processor:.3g}"),
            **({"video_cases": images.videos,
                "video": "a 3-frame clip's 2 timestamped pairs (the last frame repeated) in the cases above: "
                         "the server's expanded ids, pixel_values_videos and video_grid_thw given to Transformers "
                         "(its get_video_features, scatter and get_rope_index for video)"} if images.videos else {})}


def build_fixture(out: Path, variant: str = "text", attention_mode: str = "causal", seed: int = 0,
                  reference: bool = False, check_requests: int = 12) -> ExportResult:
    """A converted tiny decision3 package (the upstream fixture written to a temporary directory, then
    exported as a user would)."""
    from converters.decision3.fixture import write_source_fixture

    with tempfile.TemporaryDirectory(prefix="er-decision3-src-") as tmp:
        source = write_source_fixture(Path(tmp) / f"decision3-{variant}", variant, seed=seed,
                                      attention_mode=attention_mode)
        return export_decision3(source, out, Decision3Options(
            name=f"fixture-decision3-{variant}", version="0.0.1", release_date="2025-01-01", license="Apache-2.0",
            description=f"Tiny random-weight Decision 3.0 fixture ({variant}, {attention_mode}, seed {seed}); "
                        "for tests", source_name=f"edge-runtime fixture decision3-{variant} (seed {seed})",
            reference=reference, check_requests=check_requests))


__all__ = ["DEFAULT_CHECK_REQUESTS", "IMAGE_HIDDEN_TOLERANCE", "PROBABILITY_TOLERANCE", "PROCESSOR_TOLERANCE",
           "Decision3Options", "build_fixture", "decision_config", "export_decision3"]
