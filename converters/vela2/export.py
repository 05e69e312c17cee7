"""`export --kind vela2`: an upstream Vela 2.0 (0.3B encoder) package -> a verified edge-runtime package.

Steps: read and verify the source (config.json, calibration.json, tokenizer.json,
model.safetensors, SHA256SUMS when present; vela2_source.py), load the backbone into Transformers'
``ModernBertModel`` (SDPA; global and local attention, YaRN or default RoPE as HF computes them),
export it with Optimum (feature-extraction: ``last_hidden_state``, final-normed), and keep the
marker head as numpy data (head.npz) and the layout and calibration as JSON
(decision_config.json). The tokenizer is written with the 8 marker tokens removed from its added
tokens: markers are inserted by id only, so no user text can produce one.

Parity: the server's own pipeline (``edge_runtime.families.vela2.pipeline``: layout, windows,
sorted right-padded batches, numpy head, answers) runs every check request twice, once reading
the ONNX graph with the numpy head, once reading PyTorch (each sequence alone, unpadded) with the
§2.7 head math written here in torch. Option, set and span logits must agree within 1e-5 and the
answers must agree (same choices, selections and spans; numbers within 1e-5), over the §2.12
golden request and generated requests that cover every question type, presets, roles, windows and
truncation. An export outside tolerance is refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.attention_shapes import fold_file
from converters.errors import ConversionError
from converters.identity import PackageIdentity, identity_card, notice_files, sanitize_name
from converters.package_writer import ExportResult, PackageBuild, card_start, json_bytes
from converters.progress import log
from converters.vela2.requests import generated_requests, golden_request
from converters.vela2.source import Vela2Source, load_tensors, read_source
from converters.vela2.verify import (
    LOGIT_TOLERANCE,
    Vela2Parity,
    check_parity,
    int8_agreement,
    onnx_hidden,
    run_requests,
    torch_readout,
)
from converters.verify import create_session, rounded, torch_reference
from edge_runtime.families.vela2.answers import Calibration
from edge_runtime.families.vela2.layout import LayoutConfig, Tokens, pad_batch, strip_markers
from edge_runtime.families.vela2.marker import MarkerHead
from edge_runtime.families.vela2.pipeline import SCAN_INPUTS_CPU, RequestResult, graph_readout, run_request
from edge_runtime.families.vela2.state import PRESETS
from edge_runtime.packages.golden import npz_bytes
from edge_runtime.packages.manifest import compute_digest

KIND = "vela2"
CONFIG_FORMAT = "vela2-package/1"
QUESTION_TYPES = ("choice", "noul", "score", "set", "span")
DEFAULT_CHECK_REQUESTS = 50
GOLDEN_SEQUENCES = 3
#: The exact int8 is calibrated on the check requests' shortest sequences, whole (markers and all):
#: at most this many.
CALIBRATION_SEQUENCES = 32
#: About how many of the check requests' sequences (spread over their lengths, up to PROOF_MAX_TOKENS: past
#: the 128-token local attention window) prove the folded graph bit-identical to the export.
PROOF_ROWS = 16
PROOF_MAX_TOKENS = 320
#: Its integer products are proven on this many of them, cut to this many tokens (every integer GEMM's
#: operands of the batch are held at once).
EXACTNESS_ROWS, EXACTNESS_MAX_TOKENS = 8, 64


@dataclass
class Vela2Options(PackageIdentity):
    """What `export --kind vela2` may be told; the rest comes from the source package."""

    check_requests: int = DEFAULT_CHECK_REQUESTS
    seed: int = 0
    #: the parity check's bound on logits and on answers' numbers; looser only for benchmark subjects
    #: of random weights (the card records the bound the package was checked under)
    tolerance: float = LOGIT_TOLERANCE
    #: the variant written beside fp32: "int8" (exact per-token, what a CPU serves by default),
    #: "int8-dynamic" (ONNX Runtime's, approximate) or None (fp32 only)
    quantize: str | None = "int8"


# ---- PyTorch reference --------------------------------------------------------------------


def load_backbone(source: Vela2Source, backbone: dict[str, Any]) -> Any:
    """HF ``ModernBertModel`` (SDPA, fp32, eval) with the source's backbone, every tensor accounted for."""
    from transformers import ModernBertConfig, ModernBertModel

    from converters.torch_models import load_backbone

    return load_backbone(ModernBertModel, ModernBertConfig, dict(source.config["encoder_config"]), backbone,
                         "model.safetensors (encoder_config)")


# ---- export -------------------------------------------------------------------------------


def package_config(source: Vela2Source) -> dict[str, Any]:
    """decision_config.json of a vela2 package: layout, head mode and calibration, by value."""
    c = source.config
    return {
        "format": CONFIG_FORMAT,
        "layout": {k: c[k] for k in ("marker_ids", "bos_token_id", "eos_token_id", "pad_token_id", "max_length",
                                     "window_overlap")},
        "readout": c["readout"],
        "proj_dim": int(c["proj_dim"]),
        "hidden_size": int(c["encoder_config"]["hidden_size"]),
        "calibration": source.calibration,
        "source": {"identity": source.identity, "files_sha256": dict(sorted(source.sha256.items())),
                   "model_name": c.get("model_name")},
    }


def _goldens(session: Any, seqs: Sequence[Any]) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    cases = []
    for s in seqs:
        feeds = pad_batch([s], 0)
        cases.append((feeds, {"last_hidden_state": onnx_hidden(session)(feeds)}))
    return cases


@dataclass
class Vela2Assets:
    """The source's backbone in PyTorch, its marker head and the stripped tokenizer, as the server reads them."""

    model: Any
    head_arrays: dict[str, Any]
    head: MarkerHead
    layout: LayoutConfig
    tokenizer_json: dict[str, Any]  # the source's, marker tokens stripped
    tokens: Tokens
    calibration: Calibration


def _assets(source: Vela2Source) -> Vela2Assets:
    """Load the backbone and head; strip the markers from the tokenizer and check no text makes one."""
    from tokenizers import Tokenizer

    backbone, head_arrays = load_tensors(source)
    model = load_backbone(source, backbone)
    try:
        head = MarkerHead.from_arrays(head_arrays, source.config["readout"])
        layout = LayoutConfig.from_config(source.config)
    except ValueError as e:
        raise ConversionError(f"model.safetensors: {e}") from None
    stripped = strip_markers(source.tokenizer_json)
    tokens = Tokens(Tokenizer.from_str(json.dumps(stripped)))
    leaked = [m for m in layout.marker_ids if set(tokens.ids(m)) & set(layout.marker_ids.values())]
    if leaked:
        raise ConversionError(f"tokenizer.json still produces marker ids for {leaked} after stripping")
    return Vela2Assets(model, head_arrays, head, layout, stripped, tokens, Calibration(source.calibration))


def _graph(assets: Vela2Assets, work: Path) -> tuple[Path, list[str], list[str]]:
    """Export the ModernBERT backbone with Optimum (feature-extraction) and check its signature."""
    import onnx

    from converters import onnx_export

    graph = onnx_export.export_onnx(assets.model, "embedding", work / "onnx")
    g = onnx.load(str(graph), load_external_data=False)
    inputs, outputs = [i.name for i in g.graph.input], [o.name for o in g.graph.output]
    if "last_hidden_state" not in outputs or inputs[:2] != ["input_ids", "attention_mask"]:
        raise ConversionError(f"unexpected graph signature: inputs {inputs}, outputs {outputs}")
    return graph, inputs, outputs


def export_vela2(src: str | Path, out: Path, opts: Vela2Options) -> ExportResult:
    """Convert the upstream package at ``src`` into an edge-runtime package at ``out``."""
    src_dir = Path(src)
    with PackageBuild(out, "er-vela2-") as build:
        with build.step("read", f"reading and verifying {src_dir}"):
            source = read_source(src_dir)
        with build.step("imports", "loading PyTorch, transformers and Optimum"):
            from transformers.utils import logging as hf_logging

            from converters.onnx_export import OPSET
            hf_logging.set_verbosity_error()
        with build.step("load", "loading the backbone into ModernBertModel"):
            assets = _assets(source)
        with build.step("export", f"exporting the ModernBERT backbone to ONNX (opset {OPSET})"):
            graph, inputs, outputs = _graph(assets, build.work)
        session = create_session(graph)
        layout = assets.layout
        # long parts of about 3.5 characters per token of max_length: windows and cuts get exercised
        requests = [golden_request(), *generated_requests(opts.check_requests, seed=opts.seed,
                                                          long_chars=int(layout.max_length * 3.5))]
        with build.step("parity", f"checking parity against PyTorch on {len(requests)} requests"):
            parity = check_parity(requests, tokens=assets.tokens, layout=layout, calibration=assets.calibration,
                                  package=graph_readout(onnx_hidden(session), assets.head),
                                  reference=torch_readout(assets.model, assets.head_arrays, source.config["readout"]),
                                  tolerance=opts.tolerance)
        log(f"parity: max |package - torch| option {parity.option:.3g}, set {parity.set:.3g}, span "
            f"{parity.span:.3g} over {parity.requests} requests ({parity.sequences} sequences, "
            f"{parity.windowed_rows} windowed rows, {parity.truncated_rows} truncated rows)")
        with build.step("fold", "folding the graph's shape arithmetic into constants, checked bit-identical"):
            results = run_requests(requests, graph_readout(onnx_hidden(session), assets.head), tokens=assets.tokens,
                                   layout=layout, calibration=assets.calibration)
            rows = [r for r in sequence_rows(results) if len(r["input_ids"]) <= PROOF_MAX_TOKENS]
            graph, folding = fold_file(graph, rows[::max(1, len(rows) // PROOF_ROWS)], layout.pad, build.work)
        log(folding.summary())
        if folding.changed:
            session = create_session(graph)
        state, questions = golden_request()
        golden_seqs = [s for seqs in run_request(
            state, questions, tokens=assets.tokens, layout=layout, calibration=assets.calibration,
            readout=graph_readout(onnx_hidden(session), assets.head)).sequences for s in seqs][:GOLDEN_SEQUENCES]
        files: dict[str, Path | bytes] = {
            "model.onnx": graph,
            "tokenizer.json": json.dumps(assets.tokenizer_json, ensure_ascii=False).encode("utf-8"),
            "head.npz": npz_bytes({k: np.asarray(v, dtype=np.float32) for k, v in assets.head_arrays.items()}),
            "decision_config.json": json_bytes(package_config(source)),
        }
        variants: dict[str, dict[str, Any]] = {"fp32": {"file": "model.onnx", "dtype": "fp32"}}
        goldens = {"fp32": _goldens(session, golden_seqs)}
        products = None
        if opts.quantize is not None:
            from converters import quantize

            variant = opts.quantize
            with build.step("quantize", f"quantizing to {variant} ({quantize.QUANTIZATIONS[variant]} activation "
                                        "scales, per-channel int8 weights) and measuring its agreement"):
                q_path, q_session, variants[variant], products = _quantized(
                    variant, requests, assets, session, graph, build.work)
            log(f"{variant} agreement with fp32: {variants[variant]['agreement']}")
            goldens[variant] = _goldens(q_session, golden_seqs)
            files[quantize.variant_file(variant)] = q_path
        files.update(notice_files(src_dir, opts))
        card = _card(opts, source, src_dir, assets, inputs, outputs, parity, variants)
        if folding.changed:
            card["verification"]["shape_folding"] = folding.describe()
        if products is not None:
            card["verification"]["integer_products"] = products
        return build.write(card, files, goldens)


def _quantized(variant: str, requests: Sequence[tuple[Any, dict[str, Any]]], assets: Vela2Assets, session: Any,
               graph: Path, work: Path) -> tuple[Path, Any, dict[str, Any], dict[str, Any] | None]:
    """The quantized variant of the backbone: its file, session, card entry (its answers against fp32's on
    the check requests, read through the server's pipeline) and, for the exact int8, the proof of its
    integer products on this CPU. The exact int8 takes the encoders' calibrated recipe (smoothing, and each
    activation's largest channels in fp32): ModernBERT's activation outliers broke upstream's dynamic int8."""
    from converters import quantize
    from converters.verify import pad_batch as pad_rows

    def read(graph_session: Any) -> list[RequestResult]:
        return run_requests(requests, graph_readout(onnx_hidden(graph_session), assets.head), tokens=assets.tokens,
                            layout=assets.layout, calibration=assets.calibration)

    fp32 = read(session)
    calibration = sequence_rows(fp32)[:CALIBRATION_SEQUENCES]
    recipe = quantize.CALIBRATED_RECIPE if variant == "int8" else None
    path = quantize.quantize_variant(variant, graph, work / quantize.variant_file(variant),
                                     recipe or quantize.DEFAULT_RECIPE, calibration)
    q_session = create_session(path)
    agreement = int8_agreement(read(q_session), fp32)
    agreement["inputs"] = "the parity check's requests: the golden one and the generated ones"
    products = None
    if recipe is not None:
        short = [{k: v[:EXACTNESS_MAX_TOKENS] for k, v in r.items()} for r in calibration[:EXACTNESS_ROWS]]
        pad = assets.layout.pad
        try:
            products = quantize.check_integer_products_on(
                path, pad_rows(short, ["input_ids", "attention_mask"], pad), recipe)
        except ValueError as exc:
            raise ConversionError(f"int8: {exc}; no package written") from None
    return path, q_session, quantize.variant_entry(variant, agreement, recipe), products


def sequence_rows(results: Sequence[RequestResult]) -> list[dict[str, np.ndarray]]:
    """The distinct token sequences the requests' forwards ran, shortest first, as graph rows."""
    ids = sorted({tuple(s.ids) for result in results for row in result.sequences for s in row}, key=len)
    return [{"input_ids": np.asarray(i, dtype=np.int64), "attention_mask": np.ones(len(i), np.int64)} for i in ids]


def _card(opts: Vela2Options, source: Vela2Source, src_dir: Path, assets: Vela2Assets, inputs: list[str],
          outputs: list[str], parity: Vela2Parity, variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from converters.onnx_export import OPSET

    stamp = compute_digest(source.sha256)
    architecture = "Vela2Model (ModernBERT + marker head)"
    return {
        **card_start(sanitize_name(opts.name or source.config.get("model_name") or src_dir.name), KIND, KIND,
                     identity_card(opts, src_dir, architecture=architecture, stamp=stamp,
                                   source_name=opts.source_name or source.config.get("model_name") or src_dir.name,
                                   description=f"Vela 2.0 encoder decision model converted from {src_dir.name}")),
        "head": {"output": "last_hidden_state", "readout": "marker", "mode": source.config["readout"],
                 "weights": "head.npz", "proj_dim": int(source.config["proj_dim"]),
                 "hidden_size": assets.head.hidden},
        # the scan budget on CPU: four model inputs (docs/reference/upstream-formats.md §2.4)
        "limits": {"max_input_tokens": assets.layout.max_length,
                   "max_scan_tokens": SCAN_INPUTS_CPU * assets.layout.max_length},
        "graph": {"inputs": inputs, "outputs": outputs, "opset": OPSET},
        "variants": variants,
        "verification": {
            "reference": torch_reference("ModernBertModel (sdpa) + marker head in torch, each sequence alone"),
            "max_abs_diff": rounded(parity.worst), "tolerance": opts.tolerance,
            "cases": parity.requests,
            "outputs": {"option_logits": rounded(parity.option), "set_logits": rounded(parity.set),
                        "span_logits": rounded(parity.span)},
            "sequences": parity.sequences, "windowed_rows": parity.windowed_rows,
            "truncated_rows": parity.truncated_rows,
        },
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": stamp,
                  "options": {"kind": KIND, "check_requests": opts.check_requests, "seed": opts.seed,
                              "quantize": opts.quantize}},
        "question_types": list(QUESTION_TYPES),
        "presets": [p for p in PRESETS if isinstance(source.calibration.get(f"{p}_schema"), dict)],
    }
