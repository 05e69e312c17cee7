"""`export --kind decision-codes`: any causal LM Optimum exports becomes a decision model.

The backbone is exported without its LM head (``last_hidden_state``; attention_mode
``prefix_causal`` adds past key/values so that the server can run a state once and branch every
question from its cache). The readout goes to head.npz as ``readout`` (float32 [codes, hidden]):

- a trained readout when the source has one: ``readout.safetensors`` holding ``weight``
  [codes, hidden], with the codes in the source's ``decision_config.json`` (default: the alphabet);
- else the LM-head rows of the code tokens (and their bias, and the model's final logit
  soft-capping when it has them), so that the readout is exactly the LM's next-token logits.

Codes and chat markup as every causal-LM converter takes them (converters/causal_lm.py; a trained
readout's codes must all be single tokens: checked here and at load).

Steps: the source (the LM, its tokenizer, codes, readout and limits), the graph, its verification,
the card, the write.

Verification: sample requests are rendered by the server's own prompt code and their code
probabilities compared with Transformers' (``softmax`` of the LM's logits at the code tokens, or
of the hidden state times the trained readout); state-once is compared with running each question
alone. An export above the tolerance is refused. Golden cases record the graph's
``last_hidden_state`` for prompts (empty past) and, for state-once graphs, a continuation.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.causal_lm import (
    OPSET,
    chat_markup,
    choose_codes,
    code_candidates,
    export_backbone,
    lm_head_rows,
    text_tokenizer,
    weights_stamp,
)
from converters.decision_codes.verify import (
    PROBABILITY_TOLERANCE,
    Case,
    Verified,
    int8_agreement,
    sample_cases,
    verify_graph,
)
from converters.errors import ConversionError, first_line
from converters.identity import PackageIdentity, identity_card, notice_files, sanitize_name
from converters.package_writer import ExportResult, GoldenCases, PackageBuild, card_start, json_bytes
from converters.progress import log
from converters.source import package_tokenizer, resolve_source
from converters.verify import rounded, torch_reference
from edge_runtime.families.code_options import SYSTEM
from edge_runtime.families.codes_prompt import (
    ATTENTION_MODES,
    CONFIG_FORMAT,
    PROMPT,
    READOUT,
    READOUT_BIAS,
    CodesPrompt,
    check_config,
)
from edge_runtime.families.decision_codes.family import QUESTION_TYPES
from edge_runtime.packages.golden import npz_bytes

KIND = "decision-codes"
GOLDEN_CASES = 3
CODE_ALPHABET = ("A..Z, then AA, AB, ..., ZZ: the first codes in that order that the tokenizer reads "
                 "as one token each; option i is listed under codes[i]")


@dataclass
class DecisionCodesOptions(PackageIdentity):
    """What to export; None means "read it from the source" or the documented default."""

    attention_mode: str = "causal"
    prompt_layout: str | None = None
    temperature: float | None = None
    temperature_by_questions: dict[str, list] | None = None
    max_input_tokens: int | None = None
    validated_input_tokens: int | None = None
    max_request_tokens: int | None = None
    #: "int8": also write the per-token (exact) int8 backbone; dynamic int8 is never offered here
    quantize: str | None = None


@dataclass
class CodesSource:
    """A loaded causal LM and what its package is made from: codes, readout, decision config, limits."""

    src_dir: Path
    lm: Any
    tokenizer: Any
    codes: list[str]
    token_ids: list[int]
    readout: np.ndarray
    bias: np.ndarray | None
    trained: bool  # a trained readout (else the LM-head rows of the codes)
    config: dict[str, Any]  # decision_config.json
    limits: dict[str, int]
    stamp: str
    architecture: str
    name: str

    @property
    def pad_id(self) -> int:
        return int(self.config["pad_token_id"])


# ---- the source ----------------------------------------------------------------------------


def _read_source_decision(src: Path) -> dict[str, Any]:
    path = src / "decision_config.json"
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return obj


def _trained_readout(src: Path) -> np.ndarray | None:
    path = src / "readout.safetensors"
    if not path.is_file():
        return None
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    if set(tensors) != {"weight"} or tensors["weight"].ndim != 2:
        raise ConversionError(f"{path}: expected exactly one tensor 'weight' [codes, hidden]")
    return np.ascontiguousarray(tensors["weight"].astype(np.float32))


def _source(src_dir: Path, opts: DecisionCodesOptions) -> CodesSource:
    """Load the causal LM; choose its codes and readout; build and check its decision config."""
    import torch
    from transformers import AutoModelForCausalLM

    declared = _read_source_decision(src_dir)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lm = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32).eval()
    except Exception as e:  # noqa: BLE001
        raise ConversionError(f"{src_dir}: cannot load as a causal LM: {first_line(e)}") from None
    if lm.base_model is lm:
        raise ConversionError(f"{src_dir}: the causal LM has no separate backbone to export")
    tok = package_tokenizer(src_dir)
    before, after, markup = chat_markup(src_dir)
    trained = _trained_readout(src_dir)
    given = declared.get("codes")
    if trained is not None and given is None:
        given = code_candidates()[: trained.shape[0]]
    codes, token_ids = choose_codes(text_tokenizer(tok), given)
    text_config = lm.config.get_text_config()
    if trained is not None:
        if trained.shape != (len(codes), int(text_config.hidden_size)):
            raise ConversionError(f"readout.safetensors has shape {trained.shape}, expected "
                                  f"[{len(codes)} codes, hidden {text_config.hidden_size}]")
        readout, bias = trained, None
    else:
        readout, bias = lm_head_rows(lm, token_ids)
    limits = _limits(opts, src_dir, text_config)
    stamp = weights_stamp(src_dir)
    softcap = getattr(text_config, "final_logit_softcapping", None)
    pad_id = getattr(lm.config, "pad_token_id", None)
    for token in ("<|endoftext|>", "<pad>", "</s>"):
        if pad_id is None:
            pad_id = tok.token_to_id(token)
    pad_id = pad_id or 0  # right padding: the pad id is masked and never read
    config = _config_skeleton(codes, token_ids, before, after, opts)
    config.update({
        "readout": "trained" if trained is not None else "lm_head",
        "temperature": float(opts.temperature if opts.temperature is not None else declared.get("temperature", 1.0)),
        "temperature_by_questions": opts.temperature_by_questions or declared.get("temperature_by_questions"),
        "logit_softcap": float(softcap) if softcap else None,
        "pad_token_id": int(pad_id),
        "source_model": opts.source_name or src_dir.name,
        "chat_markup": markup,
    })
    try:
        check_config(config)
    except ValueError as e:
        raise ConversionError(f"decision config: {e}") from None
    try:
        CodesPrompt(tok, config).check_codes(token_ids)
    except ValueError as e:
        raise ConversionError(str(e)) from None
    return CodesSource(src_dir=src_dir, lm=lm, tokenizer=tok, codes=codes, token_ids=token_ids, readout=readout,
                       bias=bias, trained=trained is not None, config=config, limits=limits, stamp=stamp,
                       architecture=(getattr(lm.config, "architectures", None) or [type(lm).__name__])[0],
                       name=sanitize_name(opts.name or src_dir.name))


# ---- golden cases --------------------------------------------------------------------------


def _goldens(
    graph: Path, groups: list[list[Case]], pad_id: int
) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Golden cases (batch 1): prompts over an empty past, and for a past graph one continuation."""
    from edge_runtime.engine.session import create_session

    session = create_session(graph, "cpu", 1)
    past_names = [n for n in session.input_names if n.startswith("past_key_values.")]

    def feeds(ids: Sequence[int], past: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        n_past = 0 if past is None else next(iter(past.values())).shape[2]
        out = {"input_ids": np.asarray([ids], dtype=np.int64),
               "attention_mask": np.ones((1, n_past + len(ids)), dtype=np.int64)}
        if "position_ids" in session.inputs:
            out["position_ids"] = (n_past + np.arange(len(ids), dtype=np.int64))[None]
        for name in past_names:
            spec = session.inputs[name]
            out[name] = past[name] if past is not None else np.zeros((1, spec.shape[1], 0, spec.shape[3]), np.float32)
        return out

    cases = sorted((c for g in groups for c in g), key=lambda c: len(c.ids))
    picks = sorted({round(i * (len(cases) - 1) / (GOLDEN_CASES - 1)) for i in range(GOLDEN_CASES)})
    recorded = []
    for i in picks:
        f = feeds(cases[i].ids, None)
        recorded.append((f, session.run(f, ["last_hidden_state"])))
    if past_names:
        first = cases[0]
        f = feeds(first.state_ids, None)
        present = session.run(f, [n.replace("past_key_values.", "present.") for n in past_names])
        past = {n: present[n.replace("past_key_values.", "present.")] for n in past_names}
        f = feeds(first.question_ids, past)
        recorded.append((f, session.run(f, ["last_hidden_state"])))
    return recorded


# ---- export --------------------------------------------------------------------------------


def _check_options(opts: DecisionCodesOptions) -> None:
    if opts.attention_mode not in ATTENTION_MODES:
        raise ConversionError(f"--attention-mode {opts.attention_mode!r}: one of {', '.join(ATTENTION_MODES)}")
    if opts.max_request_tokens is not None and opts.attention_mode != "prefix_causal":
        raise ConversionError("--max-request-tokens applies to attention mode prefix_causal (state-once) only")
    if opts.quantize not in (None, "int8"):
        # dynamic int8 takes one activation scale per batch: never batch-invariant, so never offered here
        raise ConversionError(f"--quantize {opts.quantize!r}: decision-codes backbones take int8 (per-token) only")
    for name in ("max_input_tokens", "validated_input_tokens", "max_request_tokens"):
        value = getattr(opts, name)
        if value is not None and value < 16:
            raise ConversionError(f"--{name.replace('_', '-')} must be at least 16, not {value}")


def _limits(opts: DecisionCodesOptions, model_dir: Path, config: Any) -> dict[str, int]:
    positions = getattr(config, "max_position_embeddings", None)
    value = opts.max_input_tokens
    if value is None:
        cfg_path = model_dir / "tokenizer_config.json"
        if cfg_path.is_file():
            mml = json.loads(cfg_path.read_text(encoding="utf-8")).get("model_max_length")
            if isinstance(mml, (int, float)) and 0 < mml < 1_000_000:
                value = int(mml)
        value = min(v for v in (value, positions) if v) if (value or positions) else None
    if not value:
        raise ConversionError("cannot tell the model's input limit; pass --max-input-tokens")
    if positions and value > positions:
        raise ConversionError(f"max_input_tokens {value} exceeds the model's max_position_embeddings {positions}")
    limits = {"max_input_tokens": int(value)}
    if opts.validated_input_tokens is not None:
        if opts.validated_input_tokens > value:
            raise ConversionError(
                f"validated_input_tokens {opts.validated_input_tokens} exceeds max_input_tokens {value}"
            )
        limits["validated_input_tokens"] = int(opts.validated_input_tokens)
    if opts.attention_mode == "prefix_causal":
        limits["max_request_tokens"] = int(opts.max_request_tokens or value)
    return limits


def export_decision_codes(src: str | Path, out: Path, opts: DecisionCodesOptions) -> ExportResult:
    """Export ``src`` (a causal LM directory or hub id) as a decision-codes package at ``out``."""
    _check_options(opts)
    with PackageBuild(out, "er-decision-codes-") as build:
        src_dir = resolve_source(str(src))
        if not (src_dir / "config.json").is_file():
            raise ConversionError(f"{src_dir}: no config.json (not a Hugging Face model directory)")
        with build.step("imports", "loading PyTorch and transformers"):
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
        with build.step("load", f"loading {src_dir}"):
            source = _source(src_dir, opts)
        with build.step("export", f"exporting the backbone to ONNX (opset {OPSET}, attention {opts.attention_mode})"):
            graph = export_backbone(source.lm.base_model, opts.attention_mode, build.work / "onnx")
            inputs, outputs = _graph_names(graph)
        cap = source.limits.get("validated_input_tokens", source.limits["max_input_tokens"])
        groups = sample_cases(CodesPrompt(source.tokenizer, source.config), source.config, cap)
        with build.step("parity", "checking code probabilities against Transformers"):
            verified = verify_graph(source.lm, graph, groups, source.token_ids, source.readout, source.bias,
                                    source.trained, source.config["logit_softcap"], source.pad_id,
                                    opts.attention_mode == "prefix_causal")
        log(f"parity: max |p_onnx - p_torch| = {verified.probabilities:.3g}, hidden {verified.hidden:.3g}"
            + (f", state-once vs alone {verified.state_once:.3g}" if verified.state_once is not None else "")
            + f" over {verified.cases} questions")
        goldens: dict[str, GoldenCases] = {"fp32": _goldens(graph, groups, source.pad_id)}
        variants: dict[str, dict[str, Any]] = {"fp32": {"file": "model.onnx", "dtype": "fp32"}}
        head = {READOUT: source.readout}
        if source.bias is not None:
            head[READOUT_BIAS] = np.ascontiguousarray(source.bias, dtype=np.float32)
        files: dict[str, Path | bytes] = {
            "model.onnx": graph,
            "tokenizer.json": source.tokenizer.to_str().encode("utf-8"),
            "head.npz": npz_bytes(head),
            "decision_config.json": json_bytes(source.config),
        }
        if opts.quantize is not None:
            from converters import quantize

            with build.step("quantize", "quantizing the backbone to int8 (per-token activation scales, "
                                        "per-channel weights)"):
                q_path = quantize.quantize_variant(opts.quantize, graph,
                                                   build.work / quantize.variant_file(opts.quantize))
                agreement = int8_agreement(graph, q_path, groups, source.readout, source.bias,
                                           source.config["logit_softcap"], source.pad_id)
            log(f"{opts.quantize} agreement with fp32: {agreement}")
            variants[opts.quantize] = quantize.variant_entry(opts.quantize, agreement, quantize.DEFAULT_RECIPE)
            goldens[opts.quantize] = _goldens(q_path, groups, source.pad_id)
            files[quantize.variant_file(opts.quantize)] = q_path
            if q_path.with_name(q_path.name + ".data").is_file():
                files[q_path.name + ".data"] = q_path.with_name(q_path.name + ".data")
        files.update(notice_files(src_dir, opts))
        return build.write(_card(opts, source, inputs, outputs, variants, verified), files, goldens)


def _card(opts: DecisionCodesOptions, source: CodesSource, inputs: list[str], outputs: list[str],
          variants: dict[str, dict[str, Any]], verified: Verified) -> dict[str, Any]:
    outputs_diff = {"probabilities": rounded(verified.probabilities), "last_hidden_state": rounded(verified.hidden)}
    if verified.state_once is not None:
        outputs_diff["state_once_vs_alone"] = rounded(verified.state_once)
    target = "fp32 hidden state x trained readout" if source.trained else "fp32 LM logits at the code tokens"
    src_dir = source.src_dir
    return {
        **card_start(source.name, KIND, KIND, identity_card(
            opts, src_dir, source_name=opts.source_name or src_dir.name, architecture=source.architecture,
            stamp=source.stamp,
            description=f"{source.architecture} decision model (codes readout) from {src_dir.name}")),
        "head": {"output": "last_hidden_state", "pooling": "last", "readout": f"head.npz:{READOUT}",
                 "codes": len(source.codes), "source": source.config["readout"]},
        "limits": source.limits,
        "graph": {"inputs": inputs, "outputs": outputs, "opset": OPSET},
        "variants": variants,
        "verification": {"reference": torch_reference(f"{source.architecture} {target}"),
                         "max_abs_diff": outputs_diff["probabilities"], "tolerance": PROBABILITY_TOLERANCE,
                         "cases": verified.cases, "outputs": outputs_diff, "lengths": verified.lengths},
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": source.stamp,
                  "options": {"attention_mode": opts.attention_mode, "prompt_layout": opts.prompt_layout,
                              "max_input_tokens": opts.max_input_tokens,
                              "validated_input_tokens": opts.validated_input_tokens,
                              "max_request_tokens": opts.max_request_tokens,
                              **({"quantize": opts.quantize} if opts.quantize else {})}},
        "question_types": list(QUESTION_TYPES),
        "usage": "state_once" if opts.attention_mode == "prefix_causal" else "per_question",
    }


def _config_skeleton(codes: Sequence[str], token_ids: Sequence[int], before: str, after: str,
                     opts: DecisionCodesOptions) -> dict[str, Any]:
    return {
        "format": CONFIG_FORMAT,
        "prompt": PROMPT,
        "codes": list(codes),
        "token_ids": [int(i) for i in token_ids],
        "code_alphabet": CODE_ALPHABET,
        "attention_mode": opts.attention_mode,
        "prompt_layout": opts.prompt_layout,
        "chat": {"before": before, "after": after},
        "system": SYSTEM,
    }


def _graph_names(path: Path) -> tuple[list[str], list[str]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    versions = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    if versions.get("ai.onnx") != OPSET:
        raise ConversionError(f"the exported graph has opset {versions.get('ai.onnx')}, expected {OPSET}")
    outputs = [o.name for o in model.graph.output]
    if "last_hidden_state" not in outputs:
        raise ConversionError(f"the exported graph has no last_hidden_state output ({outputs})")
    return [i.name for i in model.graph.input], outputs


__all__ = ["DecisionCodesOptions", "export_decision_codes"]
