"""`export --kind decision2`: an upstream Decision 2.0 package -> a verified edge-runtime package.

Steps: verify the package (decision2_source.py: pointer, exact inventory, identity, config,
calibration, score bias, head names; an adapter's pinned base and LoRA contract), load the
Qwen3 backbone (a ``qwen-adapter`` has its LoRA merged, ``W + (alpha / r) B A``, and the merge is
checked against the unmerged forward), export ``Qwen3Model`` with Optimum (``last_hidden_state``,
final-normed; causal, right-padded rows), keep the candidate head as numpy data (head.npz) and
the temperatures and score bias in decision_config.json.

Parity: each check question (the Decision 2.0 golden questions and generated ones over every
type) is rendered by the server's segment code (edge_runtime.families.decision2.prompt); its
candidate logits from ONNX Runtime (rows right-padded into one batch) and the numpy head are
compared with PyTorch (each row alone) and the §1.7 head math written here in torch. Refused
above LOGIT_TOLERANCE; the answers (§1.8) must agree too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.causal_lm import OPSET, export_backbone
from converters.decision2.source import (
    PROMPT_VERSION,
    Decision2Source,
    read_decision2,
)
from converters.decision2.verify import (
    GOLDEN_QUESTIONS,
    GOLDEN_STATE,
    LOGIT_TOLERANCE,
    MERGE_TOLERANCE,
    Decision2Parity,
    graph_feeds,
    unmerged_hidden,
    verify_parity,
)
from converters.errors import ConversionError
from converters.identity import PackageIdentity, identity_card, sanitize_name
from converters.lora import LoraFactor, merge
from converters.package_writer import ExportResult, PackageBuild, card_start, json_bytes
from converters.progress import log
from converters.verify import create_session, rounded, torch_reference
from edge_runtime.families.decision2.prompt import render
from edge_runtime.packages.golden import npz_bytes

KIND = "decision2"
CONFIG_FORMAT = "decision2-package/1"


@dataclass
class Decision2Options(PackageIdentity):
    base: Path | None = None
    check_questions: int = 24
    seed: int = 0


# ---- backbone -------------------------------------------------------------------------------


def _strip(name: str) -> str | None:
    """A base/backbone tensor name as Qwen3Model names it; None for tensors it does not hold."""
    for prefix in ("model.language_model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix):]
    if name.startswith(("lm_head.", "visual.")):
        return None
    return name


def _load_weights(files: Sequence[Path]) -> dict[str, Any]:
    from safetensors.torch import load_file

    out = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            name = _strip(k)
            if name is not None and not name.startswith("visual."):
                out[name] = v.float()
    return out


def build_model(cfg: dict[str, Any], weights: dict[str, Any]) -> Any:
    """HF ``Qwen3Model`` (SDPA, fp32, eval) with the backbone's tensors (tied embeddings: nothing else
    may be missing)."""
    from transformers import Qwen3Config, Qwen3Model

    from converters.torch_models import load_backbone

    return load_backbone(Qwen3Model, Qwen3Config, cfg, weights, "the backbone")


def lora_factors(source: Decision2Source) -> dict[str, LoraFactor]:
    """{target module: its A [r, in], B [out, r] and scaling alpha / r}, checked against the contract."""
    from safetensors.torch import load_file

    contract = source.config.get("lora") or {}
    acfg = json.loads((source.root / "adapter" / "adapter_config.json").read_text(encoding="utf-8"))
    targets = contract.get("target_modules") or []
    if acfg.get("peft_type") != "LORA" or acfg.get("bias") != "none" or acfg.get("r") != contract.get("rank") \
            or acfg.get("lora_alpha") != contract.get("alpha"):
        raise ConversionError("adapter_config.json differs from the decision_config.json LoRA contract")
    tensors = load_file(str(source.root / "adapter" / "adapter_model.safetensors"))
    scaling = float(contract["alpha"]) / float(contract["rank"])
    factors = {}
    dims = contract.get("target_dimensions") or {}
    for t in targets:
        a, b = tensors.get(f"base_model.model.{t}.lora_A.weight"), tensors.get(f"base_model.model.{t}.lora_B.weight")
        if a is None or b is None or a.dtype.__str__() != "torch.float32" or b.dtype.__str__() != "torch.float32":
            raise ConversionError(f"adapter: {t} needs F32 lora_A and lora_B")
        inn, out = dims.get(t, [None, None])
        if list(a.shape) != [contract["rank"], inn] or list(b.shape) != [out, contract["rank"]]:
            raise ConversionError(f"adapter: {t} factors have shapes {list(a.shape)}, {list(b.shape)}")
        factors[t] = LoraFactor(a, b, scaling)
    if len(tensors) != 2 * len(factors):
        raise ConversionError("adapter: tensors beyond the contract's target modules")
    return factors


# ---- export --------------------------------------------------------------------------------------


@dataclass
class Decision2Backbone:
    """The source's backbone as PyTorch holds it (a LoRA merged in), its candidate head and tokenizer."""

    model: Any
    merge_diff: float | None  # merged against unmerged forward, for a qwen-adapter
    head_arrays: dict[str, Any]
    tokenizer: Any
    pad_id: int


def _backbone(source: Decision2Source) -> Decision2Backbone:
    """Build the Qwen3 backbone (merging and checking a qwen-adapter's LoRA), read the head and tokenizer."""
    import torch
    from safetensors.numpy import load_file as load_np
    from tokenizers import Tokenizer

    merge_diff = None
    if source.profile == "qwen-full":
        weights = _load_weights(sorted((source.root / "backbone").glob("*.safetensors")))
        model = build_model(source.backbone_config, weights)
    else:
        assert source.base is not None
        weights = _load_weights(sorted(source.base.glob("*.safetensors")))
        model = build_model(source.backbone_config, weights)
        factors = lora_factors(source)
        tok0 = Tokenizer.from_file(str(source.root / "tokenizer.json"))
        probe = render(tok0, GOLDEN_STATE, "choice", GOLDEN_QUESTIONS[0][1], GOLDEN_QUESTIONS[0][2],
                       int(source.manifest["max_input_tokens"])).ids
        unmerged = unmerged_hidden(model, factors, probe)
        merge(model, factors)
        with torch.no_grad():
            merged = model(input_ids=torch.tensor([probe])).last_hidden_state[0]
        merge_diff = float((merged - unmerged).abs().max())
        base_only = build_model(source.backbone_config, weights)
        with torch.no_grad():
            moved = float((base_only(input_ids=torch.tensor([probe])).last_hidden_state[0] - merged).abs().max())
        if not merge_diff <= MERGE_TOLERANCE or moved <= 10 * MERGE_TOLERANCE:
            raise ConversionError(f"LoRA merge check failed: merged vs unmerged {merge_diff:.3g}, "
                                  f"vs the base alone {moved:.3g}")
        log(f"LoRA merged: merged vs unmerged forward {merge_diff:.3g} (the adapter moves states by {moved:.3g})")
    head_arrays = load_np(str(source.root / "decision_head.safetensors"))
    tok = Tokenizer.from_file(str(source.root / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    tcfg = json.loads((source.root / "tokenizer_config.json").read_text(encoding="utf-8"))
    pad_token = tcfg.get("pad_token") or tcfg.get("eos_token")
    pad = tok.token_to_id(pad_token) if isinstance(pad_token, str) else None
    if pad is None:
        raise ConversionError("tokenizer_config.json names no pad_token or eos_token the tokenizer knows")
    return Decision2Backbone(model, merge_diff, head_arrays, tok, int(pad))


def package_config(source: Decision2Source, pad: int) -> dict[str, Any]:
    """decision_config.json of a decision2 package: prompt version, limits, temperatures, score bias."""
    return {
        "format": CONFIG_FORMAT, "prompt_version": PROMPT_VERSION, "pad_token_id": int(pad),
        "max_input_tokens": int(source.manifest["max_input_tokens"]), "head_dim": int(source.config["head_dim"]),
        "temperature_by_type": source.temperatures,
        "score_bias": {str(k): v for k, v in (source.score_bias or {}).items()} or None,
        "source": {"identity": source.identity, "profile": source.profile,
                   "model_name": source.pointer.get("model_name"),
                   "lora_merged": source.profile == "qwen-adapter"},
    }


def export_decision2(src: str | Path, out: Path, opts: Decision2Options) -> ExportResult:
    """Convert the Decision 2.0 package at ``src`` into an edge-runtime package at ``out``."""
    with PackageBuild(out, "er-decision2-") as build:
        with build.step("read", f"reading and verifying {src}"):
            source = read_decision2(Path(src), opts.base)
        with build.step("imports", "loading PyTorch, transformers and Optimum"):
            import onnx
            import transformers  # noqa: F401 - loaded here, so that the load step times the backbone alone
        with build.step("load", f"loading the {source.profile} backbone"):
            backbone = _backbone(source)
        with build.step("export", "exporting Qwen3Model to ONNX"):
            graph = export_backbone(backbone.model, "causal", build.work / "onnx")
        session = create_session(graph)
        with build.step("parity", "checking candidate logits against PyTorch"):
            parity = verify_parity(backbone.model, session, backbone.tokenizer, backbone.head_arrays, source,
                                   backbone.pad_id, opts.check_questions, opts.seed)
        log(f"parity: max |package - torch| candidate logit {parity.logits:.3g} over {parity.questions} questions")
        g = onnx.load(str(graph), load_external_data=False)
        inputs, outputs = [i.name for i in g.graph.input], [o.name for o in g.graph.output]
        golden_row = render(backbone.tokenizer, GOLDEN_STATE, "choice", GOLDEN_QUESTIONS[0][1],
                            GOLDEN_QUESTIONS[0][2], int(source.manifest["max_input_tokens"]))
        feeds = graph_feeds([golden_row], inputs, backbone.pad_id)
        goldens = {"fp32": [(feeds, {"last_hidden_state": session.run(["last_hidden_state"], feeds)[0]})]}
        files: dict[str, Path | bytes] = {
            "model.onnx": graph, "tokenizer.json": backbone.tokenizer.to_str().encode("utf-8"),
            "head.npz": npz_bytes({k: np.asarray(v, dtype=np.float32) for k, v in backbone.head_arrays.items()}),
            # ASCII-escaped, as this converter has always written it (the digest of a package stays the same)
            "decision_config.json": json_bytes(package_config(source, backbone.pad_id), ensure_ascii=True),
        }
        return build.write(_card(opts, Path(src), source, backbone, (inputs, outputs), parity), files, goldens)


def _card(opts: Decision2Options, src: Path, source: Decision2Source, backbone: Decision2Backbone,
          graph_names: tuple[list[str], list[str]], parity: Decision2Parity) -> dict[str, Any]:
    outputs_diff = {"candidate_logits": rounded(parity.logits)}
    if backbone.merge_diff is not None:
        outputs_diff["lora_merge_hidden"] = rounded(backbone.merge_diff)
    name = sanitize_name(opts.name or source.pointer.get("model_name") or src.name)
    return {
        **card_start(name, KIND, KIND, identity_card(
            opts, src, source_name=opts.source_name or source.pointer.get("model_name") or src.name,
            architecture=source.config["architecture"], stamp=source.identity,
            description=f"Decision 2.0 ({source.profile}) converted from {src.name}")),
        "head": {"output": "last_hidden_state", "readout": "candidate", "weights": "head.npz",
                 "head_dim": int(source.config["head_dim"])},
        "limits": {"max_input_tokens": int(source.manifest["max_input_tokens"])},
        "graph": {"inputs": graph_names[0], "outputs": graph_names[1], "opset": OPSET},
        "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
        "verification": {"reference": torch_reference("Qwen3Model + candidate head in torch"),
                         "max_abs_diff": outputs_diff["candidate_logits"], "tolerance": LOGIT_TOLERANCE,
                         "cases": parity.questions, "outputs": outputs_diff},
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": source.identity,
                  "options": {"kind": KIND, "check_questions": opts.check_questions}},
        "question_types": ["choice", "noul", "score"],
    }
