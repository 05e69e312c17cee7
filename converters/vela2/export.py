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
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.errors import ConversionError
from converters.export import ExportResult, PackageIdentity, check_out, identity_card, notice_files, sanitize_name
from converters.package_writer import card_start
from converters.progress import Step, log
from converters.vela2.requests import generated_requests, golden_request
from converters.vela2.source import Vela2Source, load_tensors, read_source
from converters.vela2.verify import LOGIT_TOLERANCE, check_parity, onnx_hidden, torch_readout
from edge_runtime.families.vela2.answers import Calibration
from edge_runtime.families.vela2.layout import LayoutConfig, Tokens, pad_batch, strip_markers
from edge_runtime.families.vela2.marker import MarkerHead
from edge_runtime.families.vela2.pipeline import SCAN_INPUTS_CPU, graph_readout, run_request
from edge_runtime.families.vela2.state import PRESETS
from edge_runtime.packages.golden import npz_bytes
from edge_runtime.packages.manifest import compute_digest

KIND = "vela2"
CONFIG_FORMAT = "vela2-package/1"
QUESTION_TYPES = ("choice", "noul", "score", "set", "span")
DEFAULT_CHECK_REQUESTS = 50
GOLDEN_SEQUENCES = 3


@dataclass
class Vela2Options(PackageIdentity):
    """What `export --kind vela2` may be told; the rest comes from the source package."""

    check_requests: int = DEFAULT_CHECK_REQUESTS
    seed: int = 0
    #: the parity check's bound on logits and on answers' numbers; looser only for benchmark subjects
    #: of random weights (the card records the bound the package was checked under)
    tolerance: float = LOGIT_TOLERANCE


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


def export_vela2(src: str | Path, out: Path, opts: Vela2Options) -> ExportResult:
    """Convert the upstream package at ``src`` into an edge-runtime package at ``out``."""
    check_out(Path(out))
    timings: dict[str, float] = {}
    src_dir = Path(src)
    with Step(f"reading and verifying {src_dir}") as s:
        source = read_source(src_dir)
    timings["read"] = s.seconds
    with Step("loading PyTorch, transformers and Optimum") as s:
        import torch
        import transformers
        from transformers.utils import logging as hf_logging

        from converters import onnx_export, verify
        hf_logging.set_verbosity_error()
    timings["imports"] = s.seconds
    with Step("loading the backbone into ModernBertModel") as s:
        backbone, head_arrays = load_tensors(source)
        model = load_backbone(source, backbone)
        try:
            head = MarkerHead.from_arrays(head_arrays, source.config["readout"])
            layout = LayoutConfig.from_config(source.config)
        except ValueError as e:
            raise ConversionError(f"model.safetensors: {e}") from None
        from tokenizers import Tokenizer

        stripped = strip_markers(source.tokenizer_json)
        tok = Tokenizer.from_str(json.dumps(stripped))
        tokens = Tokens(tok)
        calibration = Calibration(source.calibration)
        leaked = [m for m in layout.marker_ids if set(tokens.ids(m)) & set(layout.marker_ids.values())]
        if leaked:
            raise ConversionError(f"tokenizer.json still produces marker ids for {leaked} after stripping")
    timings["load"] = s.seconds
    name = sanitize_name(opts.name or source.config.get("model_name") or src_dir.name)
    stamp = compute_digest(source.sha256)

    with tempfile.TemporaryDirectory(prefix="er-vela2-") as tmp:
        work = Path(tmp)
        with Step(f"exporting the ModernBERT backbone to ONNX (opset {onnx_export.OPSET})") as s:
            graph = onnx_export.export_onnx(model, "embedding", work / "onnx")
            import onnx

            g = onnx.load(str(graph), load_external_data=False)
            inputs, outputs = [i.name for i in g.graph.input], [o.name for o in g.graph.output]
            if "last_hidden_state" not in outputs or inputs[:2] != ["input_ids", "attention_mask"]:
                raise ConversionError(f"unexpected graph signature: inputs {inputs}, outputs {outputs}")
        timings["export"] = s.seconds
        session = verify.create_session(graph)
        # long parts of about 3.5 characters per token of max_length: windows and cuts get exercised
        requests = [golden_request(), *generated_requests(opts.check_requests, seed=opts.seed,
                                                          long_chars=int(layout.max_length * 3.5))]
        with Step(f"checking parity against PyTorch on {len(requests)} requests") as s:
            parity = check_parity(requests, tokens=tokens, layout=layout, calibration=calibration,
                                  package=graph_readout(onnx_hidden(session), head),
                                  reference=torch_readout(model, head_arrays, source.config["readout"]),
                                  tolerance=opts.tolerance)
        timings["parity"] = s.seconds
        log(f"parity: max |package - torch| option {parity.option:.3g}, set {parity.set:.3g}, span "
            f"{parity.span:.3g} over {parity.requests} requests ({parity.sequences} sequences, "
            f"{parity.windowed_rows} windowed rows, {parity.truncated_rows} truncated rows)")
        state, questions = golden_request()
        golden_seqs = [s for seqs in run_request(
            state, questions, tokens=tokens, layout=layout, calibration=calibration,
            readout=graph_readout(onnx_hidden(session), head)).sequences for s in seqs][:GOLDEN_SEQUENCES]
        files: dict[str, Path | bytes] = {
            "model.onnx": graph,
            "tokenizer.json": json.dumps(stripped, ensure_ascii=False).encode("utf-8"),
            "head.npz": npz_bytes({k: np.asarray(v, dtype=np.float32) for k, v in head_arrays.items()}),
            "decision_config.json": (json.dumps(package_config(source), sort_keys=True, indent=2,
                                                ensure_ascii=False) + "\n").encode("utf-8"),
        }
        files.update(notice_files(src_dir, opts))
        architecture = "Vela2Model (ModernBERT + marker head)"
        card = {
            **card_start(name, KIND, KIND, identity_card(
                opts, src_dir, source_name=opts.source_name or source.config.get("model_name") or src_dir.name,
                architecture=architecture, stamp=stamp,
                description=f"Vela 2.0 encoder decision model converted from {src_dir.name}")),
            "head": {"output": "last_hidden_state", "readout": "marker", "mode": source.config["readout"],
                     "weights": "head.npz", "proj_dim": int(source.config["proj_dim"]),
                     "hidden_size": head.hidden},
            # the scan budget on CPU: four model inputs (docs/reference/upstream-formats.md §2.4)
            "limits": {"max_input_tokens": layout.max_length, "max_scan_tokens": SCAN_INPUTS_CPU * layout.max_length},
            "graph": {"inputs": inputs, "outputs": outputs, "opset": onnx_export.OPSET},
            "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
            "verification": {
                "reference": (f"PyTorch {torch.__version__.split('+')[0]} / transformers {transformers.__version__} "
                              f"ModernBertModel (sdpa) + marker head in torch, each sequence alone"),
                "max_abs_diff": float(f"{parity.worst:.3g}"), "tolerance": opts.tolerance,
                "cases": parity.requests,
                "outputs": {"option_logits": float(f"{parity.option:.3g}"), "set_logits": float(f"{parity.set:.3g}"),
                            "span_logits": float(f"{parity.span:.3g}")},
                "sequences": parity.sequences, "windowed_rows": parity.windowed_rows,
                "truncated_rows": parity.truncated_rows,
            },
            "build": {"converter_version": CONVERTER_VERSION, "source_stamp": stamp,
                      "options": {"kind": KIND, "check_requests": opts.check_requests, "seed": opts.seed}},
            "question_types": list(QUESTION_TYPES),
            "presets": [p for p in PRESETS if isinstance(source.calibration.get(f"{p}_schema"), dict)],
        }
        with Step(f"writing package {out}") as s:
            from converters.package_writer import write_package

            digest = write_package(Path(out), card, files, {"fp32": _goldens(session, golden_seqs)})
        timings["write"] = s.seconds
    from edge_runtime.families.registry import read_package

    log(f"package {name} written to {out} (digest {digest[:16]}...)")
    return ExportResult(path=Path(out), digest=digest, card=read_package(Path(out)).card.raw, timings=timings)
