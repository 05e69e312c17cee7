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
import json
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.decision_codes.export import (
    _lm_head,
    _stamp,
    _text_tokenizer,
    chat_markup,
    choose_codes,
)
from converters.decision_vision.verify import BOX_TOLERANCE, HIDDEN_TOLERANCE, verify_box, verify_graphs, verify_image
from converters.errors import ConversionError
from converters.export import ExportResult, PackageIdentity, identity_card, notice_files, sanitize_name
from converters.graph_files import EXTERNAL_DATA_BYTES, gather_graph
from converters.package_writer import card_start
from converters.progress import Step, log
from converters.source import resolve_source
from edge_runtime.families.code_options import SYSTEM
from edge_runtime.families.codes_prompt import CONFIG_FORMAT, PROMPT, READOUT, check_config
from edge_runtime.families.decision_vision.box_grid import CONFIDENCE_FORMULA
from edge_runtime.families.decision_vision.box_reader import BOX_READOUT
from edge_runtime.packages.golden import npz_bytes
from edge_runtime.vision_lm.golden import VISION_GOLDEN

KIND = "decision-vision"
OPSET = 18
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


def _vision_core(visual: Any) -> Any:
    """The grid-free vision tower: taps and row/col ids come from numpy (engine.vision_lm)."""
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
        raise ConversionError(f"{src_dir}: cannot read config.json: {str(e).strip().splitlines()[0]}") from None
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


def export_decision_vision(src: str | Path, out: Path, opts: DecisionVisionOptions) -> ExportResult:
    """Export ``src`` (a Qwen3-VL directory) as a decision-vision package at ``out``."""
    timings: dict[str, float] = {}
    src_dir = resolve_source(str(src))
    with Step("loading PyTorch, transformers and the model") as s:
        import torch
        import transformers

        from converters.export import package_tokenizer

        model = _load(src_dir)
        cfg = model.config
        tcfg, vcfg = cfg.text_config, cfg.vision_config
        tok = package_tokenizer(src_dir)
        before, after, markup = chat_markup(src_dir)
        codes, token_ids = choose_codes(_text_tokenizer(tok))
        readout, bias = _lm_head(model, token_ids)
        box_config, box_ids = _box_tokens(_text_tokenizer(tok))
        box_readout = _lm_head(model, box_ids)[0] if box_ids else None
        hf_processor, processor = _processor_settings(src_dir, opts, vcfg)
        stamp = _stamp(src_dir)
    timings["load"] = s.seconds
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
    name = sanitize_name(opts.name or src_dir.name)
    embeddings = model.model.language_model.embed_tokens.weight.detach().float().numpy()
    with tempfile.TemporaryDirectory(prefix="er-decision-vision-") as tmp:
        work = Path(tmp)
        with Step(f"exporting the vision core and the text core (TorchScript, opset {OPSET})") as s:
            vision_path, text_path, shapes = export_graphs(model, work / "onnx")
            graph_files = [*gather_graph(vision_path, opts.external_data_above),
                           *gather_graph(text_path, opts.external_data_above)]
        timings["export"] = s.seconds
        np.save(work / "onnx" / "embeddings.npy", np.ascontiguousarray(embeddings))
        head = {READOUT: readout}
        if box_readout is not None:
            head[BOX_READOUT] = box_readout
        files: dict[str, Path | bytes] = {
            **{f.name: f for f in graph_files}, "embeddings.npy": work / "onnx" / "embeddings.npy",
            "tokenizer.json": tok.to_str().encode("utf-8"), "head.npz": npz_bytes(head),
            "decision_config.json": (json.dumps(config, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode(),
        }
        with Step("checking the server's path against Transformers (images, video, state-once)") as s:
            from edge_runtime.families.decision_vision.planner import VisionPlanner

            planner = VisionPlanner.from_parts(tok, config, limits, np.load(work / "onnx" / "embeddings.npy",
                                                                          mmap_mode="r"), readout, box_readout)
            tolerance = opts.parity_tolerance or HIDDEN_TOLERANCE
            verified = verify_graphs(model, hf_processor, planner, work / "onnx", tolerance)
            box_diff = verify_box(model, hf_processor, planner, work / "onnx") if planner.box else None
            if box_diff is not None:
                verified.cases.append({"case": "box: edges 1 and 2, P(v) over 0..1000 against Transformers "
                                               "brute force (every digit path)", "distribution": box_diff})
                if not box_diff <= BOX_TOLERANCE:
                    raise ConversionError(f"verification failed: box edge distributions differ from Transformers' "
                                          f"by {box_diff:.3g}, above {BOX_TOLERANCE:g}; no package written")
        timings["parity"] = s.seconds
        log(f"parity: hidden {verified.hidden:.3g}, probabilities {verified.probabilities:.3g}, "
            f"state-once {verified.state_once:.3g}, processor {verified.processor:.3g}")
        architecture = (getattr(cfg, "architectures", None) or [type(model).__name__])[0]
        # The torch weights are done with: free them before the golden cases load the graphs into
        # ONNX Runtime again (at the 2B's shape, 7 GB of torch beside 7 GB of ONNX Runtime).
        del model
        gc.collect()
        goldens = {"fp32": _goldens(work / "onnx" / "model.onnx", tcfg)}
        files[VISION_GOLDEN] = _vision_golden(work / "onnx" / "vision.onnx", planner)
        files.update(notice_files(src_dir, opts))
        reference = (f"PyTorch {torch.__version__.split('+')[0]} / transformers {transformers.__version__} "
                     f"{architecture} last-position hidden state and LM logits at the code tokens, "
                     "slow Qwen2VLImageProcessor")
        card = {
            **card_start(name, KIND, KIND, identity_card(
                opts, src_dir, source_name=opts.source_name or src_dir.name, architecture=architecture, stamp=stamp,
                description=f"{architecture} vision-language decision model from {src_dir.name}"),
                modalities=("text", "image", "video")),
            "head": {"output": "last_hidden_state", "pooling": "last", "readout": f"head.npz:{READOUT}",
                     "codes": len(codes), "source": "lm_head", "embeddings": "embeddings.npy"},
            "limits": limits,
            "graph": {"inputs": shapes["text"]["inputs"], "outputs": shapes["text"]["outputs"], "opset": OPSET,
                      "vision": {"file": "vision.onnx", **shapes["vision"]}},
            "processor": processor,
            "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
            "verification": {"reference": reference, "max_abs_diff": float(f"{verified.hidden:.3g}"),
                             "tolerance": tolerance, "cases": len(verified.cases),
                             "outputs": {"last_hidden_state": float(f"{verified.hidden:.3g}"),
                                         "probabilities": float(f"{verified.probabilities:.3g}"),
                                         "state_once_vs_whole": float(f"{verified.state_once:.3g}"),
                                         "processor_pixels": float(f"{verified.processor:.3g}")},
                             "per_case": verified.cases},
            "build": {"converter_version": CONVERTER_VERSION, "source_stamp": stamp,
                      "exporter": "torch.onnx TorchScript tracer (grid-free wrappers)"},
            "question_types": ["choice", "noul", "score", *(["box", "track"] if box_config else [])],
            **({"box": {"format": 'Qwen3-VL {"bbox_2d": [x1, y1, x2, y2]} on a 0..1000 grid, read as exact '
                                  "distributions from a digit tree", "confidence": CONFIDENCE_FORMULA}}
               if box_config else {}),
            "image_placements": ["state"],
            "usage": "state_once",
            "checks": {"qwen3_5": "vision tower as Qwen3-VL with deepstack_visual_indexes []; its gated-delta-net "
                                  "text layers are not exported (transformers 5, opset 18 unsupported)"},
        }
        with Step(f"writing package {out}") as s:
            from converters.package_writer import write_package

            digest = write_package(Path(out), card, files, goldens)
        timings["write"] = s.seconds
    from edge_runtime.families.registry import read_package

    log(f"package {name} written to {out} (digest {digest[:16]}...)")
    return ExportResult(path=Path(out), digest=digest, card=read_package(Path(out)).card.raw, timings=timings)


def _vision_golden(vision_graph: Path, planner: Any) -> bytes:
    """The vision core's golden case (a 6x10 grid), which the family checks when it warms up."""
    from edge_runtime.engine.session import create_session
    from edge_runtime.vision_lm.grid import PATCHES, POS_IDX, POS_W, ROWCOL, position_taps, rowcol

    session = create_session(vision_graph, "cpu", 1)
    patches = planner.processor.image(verify_image(96, 160, 21), planner.image_max_pixels)
    idx, w = position_taps(patches.grid_h, patches.grid_w, planner.side, planner.settings.merge_size)
    feeds = {PATCHES: patches.patches, POS_IDX: idx, POS_W: w,
             ROWCOL: rowcol(patches.grid_h, patches.grid_w, planner.settings.merge_size)}
    out = session.run(feeds, session.output_names)
    return npz_bytes({**{f"in/{k}": v for k, v in feeds.items()}, **{f"out/{k}": v for k, v in out.items()}})


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


__all__ = ["DecisionVisionOptions", "export_decision_vision", "export_graphs", "export_vision_core"]
