"""`export --kind decision-vision`: a Qwen3-VL checkpoint becomes a vision-language decision model.

Optimum exports no VLM and exporting the whole vision forward fails three ways (the grid is baked
in or data-dependent: docs/reference/multimodal-feasibility.md §1), so this export writes two grid-free
graphs with the TorchScript tracer at opset 18:

- ``vision.onnx`` (the vision core): ``patches``, ``pos_idx``, ``pos_w``, ``rowcol`` in,
  ``image_embeds`` (and ``deepstack_embeds`` where the tower has deepstack mergers) out;
- ``model.onnx`` (the text core): ``inputs_embeds``, ``attention_bias`` (4-D additive),
  ``position_ids`` (M-RoPE, [3, B, q]), ``past_key_values.{i}.key|value`` (and
  ``deepstack_embeds``) in, ``last_hidden_state`` and ``present.{i}.*`` out;

with everything grid-shaped computed by the server in numpy (edge_runtime.vision_lm.grid). The
token table goes beside them as ``embeddings.npy`` (float32, memory-mapped by the server); the
readout is the LM-head rows of the code tokens in head.npz, as decision-codes extracts it.

Qwen3-VL with ``deepstack_visual_indexes: []`` is the Qwen3.5 vision tower (same tensors, same
outputs); Qwen3.5's gated-delta-net text layers need transformers 5 and do not export at opset 18,
so a Qwen3.5 checkpoint is refused here. Qwen2.5-VL is refused too: it needs a third vision-core
variant (window permutation and block-diagonal bias, no position table), sectioned M-RoPE without
q/k norms in the text core, and time-scaled video positions without timestamp text; measured, each
fits the two-graph design, but none is written yet (docs/packages.md, "Qwen2.5-VL").

Verification, recorded in the card, refused above tolerance: the last-position hidden state of
the server's own path (numpy processor, vision core per block, text core, state once with the
question branched from its cache) against ``Qwen3VLModel`` with the slow ``Qwen2VLImageProcessor``
at three image sizes, one video (frames paired after their timestamps), and the code
probabilities from the LM's logits.
"""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.causal_lm import chat_markup, choose_codes, lm_head_rows, text_tokenizer, weights_stamp
from converters.decision_vision.verify import BOX_TOLERANCE, HIDDEN_TOLERANCE, Verified, verify_box, verify_graphs
from converters.errors import ConversionError, first_line
from converters.graph_files import EXTERNAL_DATA_BYTES, gather_graph
from converters.identity import PackageIdentity, identity_card, notice_files, sanitize_name
from converters.package_writer import ExportResult, PackageBuild, card_start, json_bytes
from converters.progress import log
from converters.qwen_vision import OPSET, export_vision_core, verify_image, vision_golden
from converters.source import package_tokenizer, resolve_source
from converters.verify import rounded, torch_reference
from edge_runtime.families.code_options import SYSTEM
from edge_runtime.families.codes_prompt import CONFIG_FORMAT, PROMPT, READOUT, check_config
from edge_runtime.families.decision_vision.box_grid import CONFIDENCE_FORMULA
from edge_runtime.families.decision_vision.box_reader import BOX_READOUT
from edge_runtime.packages.golden import npz_bytes
from edge_runtime.vision_lm.golden import VISION_GOLDEN

KIND = "decision-vision"
BOX_PREFIX = '{"bbox_2d": ['
SPECIALS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
#: The Qwen2 pre-tokenizer split: digits one per token (\p{N} alone), which Box readouts rely on.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

#: Card limits: the contract's defaults (upstream runtime digest §2.3) unless an option sets them.
DEFAULT_LIMITS = {
    "image_max_bytes": 16 * 1024 * 1024,
    "image_source_max_pixels": 16_000_000,
    "video_max_bytes": 32_000_000,
    "video_max_seconds": 300,
    "video_source_max_pixels": 8_294_400,
    "video_fps": 2,
    "video_max_frames": 768,
}


@dataclass
class DecisionVisionOptions(PackageIdentity):
    """What to export; None means the source's value or the documented default."""

    max_input_tokens: int | None = None
    max_request_tokens: int | None = None
    image_max_pixels: int | None = None
    video_max_pixels: int | None = None
    video_max_tokens: int | None = None
    box_video_max_seconds: float | None = None
    temperature: float = 1.0
    #: The parity check's bound on hidden states (and state-once vs the whole sequence); None is
    #: HIDDEN_TOLERANCE. A deep random-weight subject needs it loosened (bench/decision_vision.py).
    parity_tolerance: float | None = None
    #: Graphs over this many bytes keep their weights in one ``<graph>.onnx.data`` file beside them
    #: (a 2B's text core is ~6 GB, past protobuf's 2 GB).
    external_data_above: int = EXTERNAL_DATA_BYTES


# ---- the two graphs ------------------------------------------------------------------------


def _text_core(lm: Any, deepstack: int) -> Any:
    """The text model over inputs_embeds, an additive 4-D bias, M-RoPE positions and a past."""
    import torch
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb, repeat_kv

    layers = len(lm.layers)

    class TextCore(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, inputs_embeds: Any, attention_bias: Any, position_ids: Any, *rest: Any) -> Any:
            past = rest[: 2 * layers]
            deep = rest[2 * layers] if deepstack else None
            h = inputs_embeds
            b, q_len = h.shape[0], h.shape[1]
            # position_ids is [B, 3, q] (batch first, as golden cases and batching want it)
            cos, sin = self.lm.rotary_emb(h, position_ids.transpose(0, 1))
            presents = []
            for i, layer in enumerate(self.lm.layers):
                a = layer.self_attn
                x = layer.input_layernorm(h)
                shape = (b, q_len, -1, a.head_dim)
                q = a.q_norm(a.q_proj(x).view(shape)).transpose(1, 2)
                k = a.k_norm(a.k_proj(x).view(shape)).transpose(1, 2)
                v = a.v_proj(x).view(shape).transpose(1, 2)
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
                k = torch.cat([past[2 * i], k], dim=2)
                v = torch.cat([past[2 * i + 1], v], dim=2)
                presents += [k, v]
                w = torch.matmul(q, repeat_kv(k, a.num_key_value_groups).transpose(2, 3)) * a.scaling
                w = torch.nn.functional.softmax(w + attention_bias, dim=-1, dtype=torch.float32)
                o = torch.matmul(w, repeat_kv(v, a.num_key_value_groups)).transpose(1, 2).reshape(b, q_len, -1)
                h = h + a.o_proj(o)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
                if deep is not None and i < deepstack:
                    h = h + deep[:, i]
            return (self.lm.norm(h), *presents)

    return TextCore().eval()


def export_graphs(model: Any, work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """Trace both cores (TorchScript, opset 18); returns their paths and the shapes the card records."""
    import torch

    visual, lm = model.model.visual, model.model.language_model
    vcfg, tcfg = model.config.vision_config, model.config.text_config
    deepstack = len(vcfg.deepstack_visual_indexes)
    work.mkdir(parents=True, exist_ok=True)
    vision_path = work / "vision.onnx"
    vision_shapes = export_vision_core(visual, vcfg, vision_path)
    layers, kv, hd, hidden = (tcfg.num_hidden_layers, tcfg.num_key_value_heads, tcfg.head_dim, tcfg.hidden_size)
    b, q, p = 2, 5, 3
    past_names = [f"past_key_values.{i}.{t}" for i in range(layers) for t in ("key", "value")]
    present_names = [f"present.{i}.{t}" for i in range(layers) for t in ("key", "value")]
    text_args: list[Any] = [torch.randn(b, q, hidden), torch.zeros(b, 1, q, p + q),
                            torch.arange(q).expand(b, 3, q).contiguous()]
    text_args += [torch.randn(b, kv, p, hd) for _ in past_names]
    inputs = ["inputs_embeds", "attention_bias", "position_ids", *past_names]
    axes = {"inputs_embeds": {0: "batch", 1: "q"}, "attention_bias": {0: "batch", 2: "q", 3: "keys"},
            "position_ids": {0: "batch", 2: "q"}, "last_hidden_state": {0: "batch", 1: "q"}}
    axes.update({name: {0: "batch", 2: "past"} for name in past_names})
    axes.update({name: {0: "batch", 2: "keys"} for name in present_names})
    if deepstack:
        text_args.append(torch.zeros(b, deepstack, q, hidden))
        inputs.append("deepstack_embeds")
        axes["deepstack_embeds"] = {0: "batch", 2: "q"}
    text_path = work / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_text_core(lm, deepstack), tuple(text_args), str(text_path), dynamo=False,
                          opset_version=OPSET, input_names=inputs,
                          output_names=["last_hidden_state", *present_names], dynamic_axes=axes)
    shapes = {"vision": vision_shapes,
              "text": {"inputs": inputs, "outputs": ["last_hidden_state", *present_names]}}
    return vision_path, text_path, shapes


# ---- verification --------------------------------------------------------------------------


def _box_tokens(text_tok: Any) -> tuple[dict[str, Any] | None, list[int]]:
    """The box config and its readout token ids, or (None, []) when the tokenizer does not write
    numbers one digit per token (then the package answers no box: its digits would not be a tree)."""
    def ids(text: str) -> list[int]:
        return list(text_tok.encode(text, add_special_tokens=False).ids)

    digits = [ids(str(d)) for d in range(10)]
    if any(len(d) != 1 for d in digits):
        return None, []
    digit_ids = [d[0] for d in digits]
    sep, end, prefix = ids(", "), ids("]}"), ids(BOX_PREFIX)
    for sample in ((0, 1000, 12, 999), (100, 7, 1000, 10), (345, 20, 5, 678)):
        want = [*prefix]
        for i, v in enumerate(sample):
            want += [digit_ids[int(c)] for c in str(v)] + (sep if i < 3 else end)
        if ids(BOX_PREFIX + ", ".join(map(str, sample)) + "]}") != want:
            return None, []  # the JSON does not tokenize piecewise: no exact tree
    config = {"prefix": BOX_PREFIX, "prefix_ids": prefix, "digit_ids": digit_ids, "separator_ids": sep,
              "end_ids": end, "grid": 1000, "confidence": CONFIDENCE_FORMULA}
    return config, [*digit_ids, sep[0], end[0]]


# ---- export --------------------------------------------------------------------------------


def _processor_settings(src: Path, opts: DecisionVisionOptions, vcfg: Any) -> tuple[Any, dict[str, Any]]:
    """The slow Qwen2VLImageProcessor of the source and its settings as the card records them."""
    from transformers import Qwen2VLImageProcessor

    from edge_runtime.vision_lm.processor import ProcessorSettings

    path = src / "preprocessor_config.json"
    if not path.is_file():
        raise ConversionError(f"{src}: no preprocessor_config.json (the image processor's settings)")
    hf = Qwen2VLImageProcessor.from_pretrained(src)
    size = hf.size or {}  # what preprocess() reads (min_pixels/max_pixels, when saved, were folded into it)
    settings = ProcessorSettings(
        patch_size=int(hf.patch_size), merge_size=int(hf.merge_size), temporal_patch_size=int(hf.temporal_patch_size),
        min_pixels=int(size.get("shortest_edge", hf.min_pixels)),
        max_pixels=int(size.get("longest_edge", hf.max_pixels)),
        image_mean=tuple(float(x) for x in np.atleast_1d(hf.image_mean)),
        image_std=tuple(float(x) for x in np.atleast_1d(hf.image_std)),
        rescale_factor=float(hf.rescale_factor))
    if (settings.patch_size, settings.merge_size, settings.temporal_patch_size) != (
            vcfg.patch_size, vcfg.spatial_merge_size, vcfg.temporal_patch_size):
        raise ConversionError("preprocessor_config.json and the vision config disagree on patch, merge or "
                              "temporal patch size")
    if not hf.do_resize or not hf.do_rescale or not hf.do_normalize or int(hf.resample) != 3:
        raise ConversionError("the image processor must resize (bicubic), rescale and normalise, as Qwen's do")
    max_pixels = opts.image_max_pixels or settings.max_pixels
    hf_fixed = Qwen2VLImageProcessor.from_pretrained(
        src, size={"shortest_edge": settings.min_pixels, "longest_edge": max_pixels},
        min_pixels=settings.min_pixels, max_pixels=max_pixels)
    return hf_fixed, {**settings.card(), "max_pixels": max_pixels}


def _load(src_dir: Path) -> Any:
    import torch
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    try:
        config = AutoConfig.from_pretrained(src_dir)
    except Exception as e:  # noqa: BLE001
        raise ConversionError(f"{src_dir}: cannot read config.json: {first_line(e)}") from None
    if config.model_type != "qwen3_vl":
        why = {"qwen2_5_vl": "not exported yet: its window-attention tower needs a window permutation and a"
                             " block-diagonal bias fed to the vision graph, its text layers sectioned M-RoPE"
                             " without q/k norms, its videos time-scaled positions without timestamp text;"
                             " docs/packages.md, Qwen2.5-VL",
               "qwen2_vl": "its tower has no position table and reads absolute-time M-RoPE",
               "qwen3_5": "its gated-delta-net text layers need transformers 5 and do not export at opset 18"}
        raise ConversionError(f"{src_dir}: model type {config.model_type!r} is not exported as {KIND}"
                              + (f" ({why[config.model_type]})" if config.model_type in why else "; Qwen3-VL only"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Qwen3VLForConditionalGeneration.from_pretrained(src_dir, dtype=torch.float32).eval()


@dataclass
class VisionSource:
    """A loaded Qwen3-VL source and what its package is made from."""

    src_dir: Path
    model: Any
    tokenizer: Any
    codes: list[str]
    readout: np.ndarray
    box_readout: np.ndarray | None
    hf_processor: Any  # the slow Qwen2VLImageProcessor, at the package's pixel budget
    config: dict[str, Any]  # decision_config.json
    limits: dict[str, Any]
    stamp: str
    architecture: str
    name: str


def _source(src_dir: Path, opts: DecisionVisionOptions) -> VisionSource:
    """Load the model and its tokenizer; choose codes and Box tokens; build the decision config and limits."""
    model = _load(src_dir)
    cfg = model.config
    tcfg, vcfg = cfg.text_config, cfg.vision_config
    tok = package_tokenizer(src_dir)
    before, after, markup = chat_markup(src_dir)
    codes, token_ids = choose_codes(text_tokenizer(tok))
    readout, _ = lm_head_rows(model, token_ids)
    box_config, box_ids = _box_tokens(text_tokenizer(tok))
    box_readout = lm_head_rows(model, box_ids)[0] if box_ids else None
    hf_processor, processor = _processor_settings(src_dir, opts, vcfg)
    stamp = weights_stamp(src_dir)
    specials = {}
    for name in SPECIALS:
        tid = tok.token_to_id(name)
        if tid is None:
            raise ConversionError(f"the tokenizer has no {name} token")
        specials[name] = tid
    if (specials["<|image_pad|>"], specials["<|video_pad|>"], specials["<|vision_start|>"]) != (
            cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id):
        raise ConversionError("the tokenizer's vision tokens differ from the model config's ids")
    positions = int(getattr(tcfg, "max_position_embeddings", 0) or 0)
    max_input = int(opts.max_input_tokens or positions)
    if not max_input or (positions and max_input > positions):
        raise ConversionError(f"max_input_tokens {max_input} must be set and within "
                              f"max_position_embeddings {positions}")
    limits: dict[str, Any] = {
        "max_input_tokens": max_input,
        "max_request_tokens": int(opts.max_request_tokens or max_input),
        **DEFAULT_LIMITS,
        "image_max_pixels": int(processor["max_pixels"]),
        "video_max_pixels": int(opts.video_max_pixels or processor["max_pixels"]),
        "video_max_tokens": int(opts.video_max_tokens or max_input // 2),
    }
    if opts.box_video_max_seconds is not None:
        limits["box_video_max_seconds"] = opts.box_video_max_seconds
    config = {
        "format": CONFIG_FORMAT, "prompt": PROMPT, "codes": codes, "token_ids": [int(i) for i in token_ids],
        "attention_mode": "prefix_causal", "prompt_layout": None, "chat": {"before": before, "after": after},
        "system": SYSTEM, "readout": "lm_head", "temperature": float(opts.temperature),
        "temperature_by_questions": None, "logit_softcap": None, "pad_token_id": 0,
        "source_model": opts.source_name or src_dir.name, "chat_markup": markup,
        "vision": {"tokens": specials, "processor": processor,
                   "position_side": int(vcfg.num_position_embeddings ** 0.5),
                   "deepstack_layers": len(vcfg.deepstack_visual_indexes),
                   "timestamp": "<{t:.1f} seconds>"},
    }
    if box_config is not None:
        config["box"] = box_config
    try:
        check_config(config)
    except ValueError as e:
        raise ConversionError(f"decision config: {e}") from None
    return VisionSource(src_dir=src_dir, model=model, tokenizer=tok, codes=codes, readout=readout,
                        box_readout=box_readout, hf_processor=hf_processor, config=config, limits=limits, stamp=stamp,
                        architecture=(getattr(cfg, "architectures", None) or [type(model).__name__])[0],
                        name=sanitize_name(opts.name or src_dir.name))


def _verify(source: VisionSource, planner: Any, graphs: Path, tolerance: float) -> Verified:
    """The server's path against Transformers (images, a video, state-once) and, where the package reads
    boxes, the Box edge distributions; ConversionError above tolerance."""
    verified = verify_graphs(source.model, source.hf_processor, planner, graphs, tolerance)
    box_diff = verify_box(source.model, source.hf_processor, planner, graphs) if planner.box else None
    if box_diff is not None:
        verified.cases.append({"case": "box: edges 1 and 2, P(v) over 0..1000 against Transformers "
                                       "brute force (every digit path)", "distribution": box_diff})
        if not box_diff <= BOX_TOLERANCE:
            raise ConversionError(f"verification failed: box edge distributions differ from Transformers' "
                                  f"by {box_diff:.3g}, above {BOX_TOLERANCE:g}; no package written")
    return verified


def export_decision_vision(src: str | Path, out: Path, opts: DecisionVisionOptions) -> ExportResult:
    """Export ``src`` (a Qwen3-VL directory) as a decision-vision package at ``out``."""
    from edge_runtime.families.decision_vision.planner import VisionPlanner

    with PackageBuild(out, "er-decision-vision-") as build:
        src_dir = resolve_source(str(src))
        with build.step("load", "loading PyTorch, transformers and the model"):
            source = _source(src_dir, opts)
        onnx = build.work / "onnx"
        with build.step("export", f"exporting the vision core and the text core (TorchScript, opset {OPSET})"):
            vision_path, text_path, shapes = export_graphs(source.model, onnx)
            graph_files = [*gather_graph(vision_path, opts.external_data_above),
                           *gather_graph(text_path, opts.external_data_above)]
        embeddings = source.model.model.language_model.embed_tokens.weight.detach().float().numpy()
        np.save(onnx / "embeddings.npy", np.ascontiguousarray(embeddings))
        head = {READOUT: source.readout}
        if source.box_readout is not None:
            head[BOX_READOUT] = source.box_readout
        files: dict[str, Path | bytes] = {
            **{f.name: f for f in graph_files}, "embeddings.npy": onnx / "embeddings.npy",
            "tokenizer.json": source.tokenizer.to_str().encode("utf-8"), "head.npz": npz_bytes(head),
            "decision_config.json": json_bytes(source.config),
        }
        tolerance = opts.parity_tolerance or HIDDEN_TOLERANCE
        with build.step("parity", "checking the server's path against Transformers (images, video, state-once)"):
            planner = VisionPlanner.from_parts(source.tokenizer, source.config, source.limits,
                                               np.load(onnx / "embeddings.npy", mmap_mode="r"), source.readout,
                                               source.box_readout)
            verified = _verify(source, planner, onnx, tolerance)
        log(f"parity: hidden {verified.hidden:.3g}, probabilities {verified.probabilities:.3g}, "
            f"state-once {verified.state_once:.3g}, processor {verified.processor:.3g}")
        tcfg = source.model.config.text_config
        # The torch weights are done with: free them before the golden cases load the graphs into
        # ONNX Runtime again (at the 2B's shape, 7 GB of torch beside 7 GB of ONNX Runtime).
        source.model = None
        gc.collect()
        goldens = {"fp32": _goldens(onnx / "model.onnx", tcfg)}
        files[VISION_GOLDEN] = _vision_golden(onnx / "vision.onnx", planner)
        files.update(notice_files(src_dir, opts))
        return build.write(_card(opts, source, shapes, verified, tolerance), files, goldens)


def _card(opts: DecisionVisionOptions, source: VisionSource, shapes: dict[str, Any], verified: Verified,
          tolerance: float) -> dict[str, Any]:
    box = "box" in source.config
    src_dir = source.src_dir
    return {
        **card_start(source.name, KIND, KIND, identity_card(
            opts, src_dir, source_name=opts.source_name or src_dir.name, architecture=source.architecture,
            stamp=source.stamp,
            description=f"{source.architecture} vision-language decision model from {src_dir.name}"),
            modalities=("text", "image", "video")),
        "head": {"output": "last_hidden_state", "pooling": "last", "readout": f"head.npz:{READOUT}",
                 "codes": len(source.codes), "source": "lm_head", "embeddings": "embeddings.npy"},
        "limits": source.limits,
        "graph": {"inputs": shapes["text"]["inputs"], "outputs": shapes["text"]["outputs"], "opset": OPSET,
                  "vision": {"file": "vision.onnx", **shapes["vision"]}},
        "processor": source.config["vision"]["processor"],
        "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
        "verification": {"reference": torch_reference(f"{source.architecture} last-position hidden state and LM "
                                                      "logits at the code tokens, slow Qwen2VLImageProcessor"),
                         "max_abs_diff": rounded(verified.hidden),
                         "tolerance": tolerance, "cases": len(verified.cases),
                         "outputs": {"last_hidden_state": rounded(verified.hidden),
                                     "probabilities": rounded(verified.probabilities),
                                     "state_once_vs_whole": rounded(verified.state_once),
                                     "processor_pixels": rounded(verified.processor)},
                         "per_case": verified.cases},
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": source.stamp,
                  "exporter": "torch.onnx TorchScript tracer (grid-free wrappers)"},
        "question_types": ["choice", "noul", "score", *(["box", "track"] if box else [])],
        **({"box": {"format": 'Qwen3-VL {"bbox_2d": [x1, y1, x2, y2]} on a 0..1000 grid, read as exact '
                              "distributions from a digit tree", "confidence": CONFIDENCE_FORMULA}}
           if box else {}),
        "image_placements": ["state"],
        "usage": "state_once",
        "checks": {"qwen3_5": "vision tower as Qwen3-VL with deepstack_visual_indexes []; its gated-delta-net "
                              "text layers are not exported (transformers 5, opset 18 unsupported)"},
    }


def _vision_golden(vision_graph: Path, planner: Any) -> bytes:
    """The vision core's golden case (a 6x10 grid), which the family checks when it warms up."""
    from edge_runtime.engine.session import create_session

    patches = planner.processor.image(verify_image(96, 160, 21), planner.image_max_pixels)
    return npz_bytes(vision_golden(create_session(vision_graph, "cpu", 1), patches, planner.side,
                                   planner.settings.merge_size))
def _goldens(text_graph: Path, tcfg: Any) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Golden cases of the text core (the session the runtime self-checks): two seeded inputs."""
    from edge_runtime.engine.session import create_session
    from edge_runtime.families.decision_vision.forward import causal_bias

    session = create_session(text_graph, "cpu", 1)
    recorded = []
    rng = np.random.default_rng(0)
    for q, p in ((7, 0), (3, 5)):
        feeds: dict[str, np.ndarray] = {
            "inputs_embeds": rng.standard_normal((1, q, tcfg.hidden_size)).astype(np.float32),
            "attention_bias": np.concatenate([np.zeros((q, p), np.float32), causal_bias(q)], axis=1)[None, None],
            "position_ids": np.broadcast_to(p + np.arange(q), (1, 3, q)).astype(np.int64).copy()}
        for name in session.input_names:
            if name.startswith("past_key_values."):
                feeds[name] = rng.standard_normal((1, tcfg.num_key_value_heads, p, tcfg.head_dim)).astype(np.float32)
            elif name == "deepstack_embeds":
                layers = int(session.inputs[name].shape[1] or 0)
                feeds[name] = np.zeros((1, layers, q, tcfg.hidden_size), np.float32)
        recorded.append((feeds, session.run(feeds, ["last_hidden_state"])))
    return recorded


__all__ = ["DecisionVisionOptions", "export_decision_vision", "export_graphs"]
