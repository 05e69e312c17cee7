"""`export --kind decision-codes`: any causal LM Optimum exports becomes a decision model.

The backbone is exported without its LM head (``last_hidden_state``; attention_mode
``prefix_causal`` adds past key/values so that the server can run a state once and branch every
question from its cache). The readout goes to head.npz as ``readout`` (float32 [codes, hidden]):

- a trained readout when the source has one: ``readout.safetensors`` holding ``weight``
  [codes, hidden], with the codes in the source's ``decision_config.json`` (default: the alphabet);
- else the LM-head rows of the code tokens (and their bias, and the model's final logit
  soft-capping when it has them), so that the readout is exactly the LM's next-token logits.

Codes: ``A``..``Z``, then ``AA``, ``AB``, ... ``ZZ``; the first 255 that the tokenizer reads as one
token each (a trained readout's codes must all be single tokens: checked here and at load).
The chat markup around the user turn is rendered once, here, from the source's own chat template
(the server never runs a template); a model without one reads a plain prompt.

Verification: sample requests are rendered by the server's own prompt code and their code
probabilities compared with Transformers' (``softmax`` of the LM's logits at the code tokens, or
of the hidden state times the trained readout); state-once is compared with running each question
alone. An export above the tolerance is refused. Golden cases record the graph's
``last_hidden_state`` for prompts (empty past) and, for state-once graphs, a continuation.
"""

from __future__ import annotations

import itertools
import json
import string
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.decision_codes.verify import PROBABILITY_TOLERANCE, Case, int8_agreement, sample_cases, verify_graph
from converters.errors import ConversionError
from converters.export import (
    ExportResult,
    PackageIdentity,
    identity_card,
    notice_files,
    package_tokenizer,
    sanitize_name,
)
from converters.package_writer import card_start
from converters.progress import Step, log
from converters.source import resolve_source
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
from edge_runtime.packages.manifest import compute_digest, file_sha256

KIND = "decision-codes"
OPSET = 18
MAX_CODES = 255
GOLDEN_CASES = 3
CODE_ALPHABET = ("A..Z, then AA, AB, ..., ZZ: the first codes in that order that the tokenizer reads "
                 "as one token each; option i is listed under codes[i]")
_USER_MARK = "@@EDGE_RUNTIME_USER_TURN@@"
_PLAIN_AFTER = "\n\nAnswer:\n"
_STAMPED_SUFFIXES = (".json", ".safetensors", ".bin", ".jinja", ".model", ".txt")


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


# ---- codes, chat markup, readout -----------------------------------------------------------


def code_candidates() -> list[str]:
    """A..Z, then AA, AB, ..., ZZ."""
    letters = string.ascii_uppercase
    return [*letters, *("".join(p) for p in itertools.product(letters, repeat=2))]


def choose_codes(prompt_tokenizer: Any, given: Sequence[str] | None = None) -> tuple[list[str], list[int]]:
    """The codes and their token ids; ``given`` codes must each be one token, else the alphabet's first 255 that are."""
    def single(code: str) -> int | None:
        ids = prompt_tokenizer.encode(code, add_special_tokens=False).ids
        return ids[0] if len(ids) == 1 else None

    if given is not None:
        found = {c: single(c) for c in given}
        bad = [c for c, i in found.items() if i is None]
        if bad:
            raise ConversionError(f"codes {bad[:5]} are not single tokens of the tokenizer; every code must be one")
        given_ids = [i for i in found.values() if i is not None]
        if len(set(given_ids)) != len(given_ids) or len(found) != len(given):
            raise ConversionError("two codes read as the same token")
        return list(given), given_ids
    codes: list[str] = []
    ids: list[int] = []
    for code in code_candidates():
        tid = single(code)
        if tid is not None and tid not in ids:
            codes.append(code)
            ids.append(tid)
        if len(codes) == MAX_CODES:
            break
    if len(codes) < 26:
        raise ConversionError(f"only {len(codes)} of the codes A..Z, AA..ZZ are single tokens of this tokenizer")
    return codes, ids


def chat_markup(model_dir: Path) -> tuple[str, str, str]:
    """(before, after, how): the chat markup around the user turn, from the source's chat template."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(model_dir)
    except Exception:  # noqa: BLE001 - a model without a loadable tokenizer config reads the plain prompt
        hf = None
    template = getattr(hf, "chat_template", None) if hf is not None else None
    if template:
        attempts = ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": _USER_MARK}],
                    [{"role": "user", "content": f"{SYSTEM}\n\n{_USER_MARK}"}])  # templates without a system role
        for messages in attempts:
            try:
                text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                              enable_thinking=False)
            except Exception:  # noqa: BLE001 - the template refused this shape; try the next
                continue
            if isinstance(text, str) and text.count(_USER_MARK) == 1:
                before, after = text.split(_USER_MARK)
                return before, after, "chat_template"
        raise ConversionError(f"{model_dir}: the chat template renders no single user turn")
    bos = getattr(hf, "bos_token", None) if hf is not None and getattr(hf, "add_bos_token", False) else None
    return f"{bos or ''}{SYSTEM}\n\n", _PLAIN_AFTER, "plain"


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


def _text_tokenizer(tok: Any) -> Any:
    """A copy of ``tok`` that reads special tokens as text, as the server reads request text."""
    from tokenizers import Tokenizer

    text = Tokenizer.from_str(tok.to_str())
    text.encode_special_tokens = True
    return text


def _trained_readout(src: Path) -> np.ndarray | None:
    path = src / "readout.safetensors"
    if not path.is_file():
        return None
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    if set(tensors) != {"weight"} or tensors["weight"].ndim != 2:
        raise ConversionError(f"{path}: expected exactly one tensor 'weight' [codes, hidden]")
    return np.ascontiguousarray(tensors["weight"].astype(np.float32))


def _lm_head(lm: Any, token_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
    head = lm.get_output_embeddings()
    if head is None:
        raise ConversionError("the model has no LM head to take the code rows from, and the source no readout")
    weight = head.weight.detach().float().numpy()[list(token_ids)]
    bias = getattr(head, "bias", None)
    return np.ascontiguousarray(weight), None if bias is None else bias.detach().float().numpy()[list(token_ids)]


def _stamp(src: Path) -> str:
    files = {p.name: file_sha256(p) for p in sorted(src.iterdir())
             if p.is_file() and p.suffix in _STAMPED_SUFFIXES and not p.name.startswith(".")}
    if not any(n.endswith((".safetensors", ".bin")) for n in files):
        raise ConversionError(f"{src}: no *.safetensors or *.bin weights")
    return compute_digest(files)


# ---- ONNX export ---------------------------------------------------------------------------


def export_graph(base: Any, attention_mode: str, work: Path) -> Path:
    """Export the backbone (no LM head): ``last_hidden_state``, with past key/values for prefix_causal."""
    import optimum.exporters.onnx.model_configs  # noqa: F401 - fills the task registry (docs/reference/feasibility-notes.md B.3.1)
    from optimum.exporters.onnx import onnx_export_from_model
    from optimum.exporters.tasks import TasksManager

    custom = None
    task = "feature-extraction"
    if attention_mode == "prefix_causal":
        task = "text-generation-with-past"
        try:
            ctor = TasksManager.get_exporter_config_constructor(
                exporter="onnx", model=base, task=task, library_name="transformers")
        except Exception as e:  # noqa: BLE001
            raise ConversionError(f"Optimum has no {task} export for {base.config.model_type}: {e}") from None
        base_cls = type(ctor(base.config, int_dtype="int64", float_dtype="fp32"))

        def outputs(self: Any) -> dict[str, dict[int, str]]:
            named: dict[str, dict[int, str]] = OrderedDict(last_hidden_state={0: "batch_size", 1: "sequence_length"})
            self.add_past_key_values(named, direction="outputs")
            return named

        cls = type(f"{base_cls.__name__}HiddenWithPast", (base_cls,), {"outputs": property(outputs)})
        # task text-generation inside the config: traced with a past and a past+seq mask (notes B.1)
        custom = {"model": cls(base.config, task="text-generation", use_past=True, use_past_in_inputs=True,
                               int_dtype="int64", float_dtype="fp32")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings: noise, the verification below is the judge
        try:
            onnx_export_from_model(base, output=work, task=task, opset=OPSET, do_validation=False,
                                   custom_onnx_configs=custom, preprocessors=[])
        except Exception as e:  # noqa: BLE001
            raise ConversionError(f"Optimum could not export {base.config.model_type} ({task}): "
                                  f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    path = work / "model.onnx"
    if not path.is_file():
        raise ConversionError(f"Optimum wrote no model.onnx into {work}")
    return path


# ---- verification --------------------------------------------------------------------------


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
    timings: dict[str, float] = {}
    src_dir = resolve_source(str(src))
    if not (src_dir / "config.json").is_file():
        raise ConversionError(f"{src_dir}: no config.json (not a Hugging Face model directory)")
    declared = _read_source_decision(src_dir)

    with Step("loading PyTorch and transformers") as s:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    timings["imports"] = s.seconds

    with Step(f"loading {src_dir}") as s:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lm = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32).eval()
        except Exception as e:  # noqa: BLE001
            raise ConversionError(f"{src_dir}: cannot load as a causal LM: {str(e).strip().splitlines()[0]}") from None
        base = lm.base_model
        if base is lm:
            raise ConversionError(f"{src_dir}: the causal LM has no separate backbone to export")
        tok = package_tokenizer(src_dir)
        before, after, markup = chat_markup(src_dir)
        trained = _trained_readout(src_dir)
        given = declared.get("codes")
        if trained is not None and given is None:
            given = code_candidates()[: trained.shape[0]]
        codes, token_ids = choose_codes(_text_tokenizer(tok), given)
        if trained is not None:
            if trained.shape != (len(codes), int(lm.config.get_text_config().hidden_size)):
                raise ConversionError(f"readout.safetensors has shape {trained.shape}, expected "
                                      f"[{len(codes)} codes, hidden {lm.config.get_text_config().hidden_size}]")
            readout, bias = trained, None
        else:
            readout, bias = _lm_head(lm, token_ids)
        limits = _limits(opts, src_dir, lm.config.get_text_config())
        stamp = _stamp(src_dir)
    timings["load"] = s.seconds
    softcap = getattr(lm.config.get_text_config(), "final_logit_softcapping", None)
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
    prompt = CodesPrompt(tok, config)
    try:
        prompt.check_codes(token_ids)
    except ValueError as e:
        raise ConversionError(str(e)) from None
    architecture = (getattr(lm.config, "architectures", None) or [type(lm).__name__])[0]
    name = sanitize_name(opts.name or src_dir.name)

    with tempfile.TemporaryDirectory(prefix="er-decision-codes-") as tmp:
        work = Path(tmp)
        with Step(f"exporting the backbone to ONNX (opset {OPSET}, attention {opts.attention_mode})") as s:
            graph = export_graph(base, opts.attention_mode, work / "onnx")
            inputs, outputs = _graph_names(graph)
        timings["export"] = s.seconds
        cap = limits.get("validated_input_tokens", limits["max_input_tokens"])
        groups = sample_cases(prompt, config, cap)
        with Step("checking code probabilities against Transformers") as s:
            verified = verify_graph(lm, graph, groups, token_ids, readout, bias, trained is not None,
                               config["logit_softcap"], int(pad_id), opts.attention_mode == "prefix_causal")
        timings["parity"] = s.seconds
        log(f"parity: max |p_onnx - p_torch| = {verified.probabilities:.3g}, hidden {verified.hidden:.3g}"
            + (f", state-once vs alone {verified.state_once:.3g}" if verified.state_once is not None else "")
            + f" over {verified.cases} questions")
        goldens = {"fp32": _goldens(graph, groups, int(pad_id))}
        variants: dict[str, dict[str, Any]] = {"fp32": {"file": "model.onnx", "dtype": "fp32"}}
        q_files: dict[str, Path | bytes] = {}
        if opts.quantize is not None:
            from converters import quantize

            with Step("quantizing the backbone to int8 (per-token activation scales, per-channel weights)") as s:
                q_path = quantize.quantize_variant(opts.quantize, graph, work / quantize.variant_file(opts.quantize))
                agreement = int8_agreement(graph, q_path, groups, readout, bias, config["logit_softcap"], int(pad_id))
            timings["quantize"] = s.seconds
            log(f"{opts.quantize} agreement with fp32: {agreement}")
            variants[opts.quantize] = quantize.variant_entry(opts.quantize, agreement, quantize.DEFAULT_RECIPE)
            goldens[opts.quantize] = _goldens(q_path, groups, int(pad_id))
            q_files[quantize.variant_file(opts.quantize)] = q_path
            if q_path.with_name(q_path.name + ".data").is_file():
                q_files[q_path.name + ".data"] = q_path.with_name(q_path.name + ".data")
        head = {READOUT: readout}
        if bias is not None:
            head[READOUT_BIAS] = np.ascontiguousarray(bias, dtype=np.float32)
        files: dict[str, Path | bytes] = {
            "model.onnx": graph,
            "tokenizer.json": tok.to_str().encode("utf-8"),
            "head.npz": npz_bytes(head),
            "decision_config.json": (json.dumps(config, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode(),
        }
        files.update(q_files)
        files.update(notice_files(src_dir, opts))
        outputs_diff = {"probabilities": float(f"{verified.probabilities:.3g}"),
                        "last_hidden_state": float(f"{verified.hidden:.3g}")}
        if verified.state_once is not None:
            outputs_diff["state_once_vs_alone"] = float(f"{verified.state_once:.3g}")
        reference_target = ("fp32 LM logits at the code tokens" if trained is None
                            else "fp32 hidden state x trained readout")
        reference = (f"PyTorch {torch.__version__.split('+')[0]} / transformers {transformers.__version__} "
                     f"{architecture} " + reference_target)
        card = {
            **card_start(name, KIND, KIND, identity_card(
                opts, src_dir, source_name=opts.source_name or src_dir.name, architecture=architecture, stamp=stamp,
                description=f"{architecture} decision model (codes readout) from {src_dir.name}")),
            "head": {"output": "last_hidden_state", "pooling": "last", "readout": f"head.npz:{READOUT}",
                     "codes": len(codes), "source": config["readout"]},
            "limits": limits,
            "graph": {"inputs": inputs, "outputs": outputs, "opset": OPSET},
            "variants": variants,
            "verification": {"reference": reference, "max_abs_diff": outputs_diff["probabilities"],
                             "tolerance": PROBABILITY_TOLERANCE, "cases": verified.cases,
                             "outputs": outputs_diff, "lengths": verified.lengths},
            "build": {"converter_version": CONVERTER_VERSION, "source_stamp": stamp,
                      "options": {"attention_mode": opts.attention_mode, "prompt_layout": opts.prompt_layout,
                                  "max_input_tokens": opts.max_input_tokens,
                                  "validated_input_tokens": opts.validated_input_tokens,
                                  "max_request_tokens": opts.max_request_tokens,
                                  **({"quantize": opts.quantize} if opts.quantize else {})}},
            "question_types": list(QUESTION_TYPES),
            "usage": "state_once" if opts.attention_mode == "prefix_causal" else "per_question",
        }
        with Step(f"writing package {out}") as s:
            from converters.package_writer import write_package

            digest = write_package(Path(out), card, files, goldens)
        timings["write"] = s.seconds
    from edge_runtime.families.registry import read_package

    log(f"package {name} written to {out} (digest {digest[:16]}...)")
    return ExportResult(path=Path(out), digest=digest, card=read_package(Path(out)).card.raw, timings=timings)


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


__all__ = ["DecisionCodesOptions", "choose_codes", "code_candidates", "export_decision_codes"]
