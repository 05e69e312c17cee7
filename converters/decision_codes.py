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

import argparse
import itertools
import json
import math
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
from edge_runtime.families.decision_codes.family import (
    ATTENTION_MODES,
    CONFIG_FORMAT,
    PROMPT,
    QUESTION_TYPES,
    READOUT,
    READOUT_BIAS,
    SYSTEM,
    CodesPrompt,
    check_config,
)
from edge_runtime.heads.decisions import code_probabilities, select_temperature
from edge_runtime.packages.golden import npz_bytes
from edge_runtime.packages.manifest import compute_digest, file_sha256

KIND = "decision-codes"
OPSET = 18
MAX_CODES = 255
#: The largest |onnx - torch| a code probability may show; the fixture measures far below it.
PROBABILITY_TOLERANCE = 1e-4
#: State-once against each question alone (measured bit-identical on ORT CPU fp32).
STATE_ONCE_TOLERANCE = 1e-5
GOLDEN_CASES = 3
CODE_ALPHABET = ("A..Z, then AA, AB, ..., ZZ: the first codes in that order that the tokenizer reads "
                 "as one token each; option i is listed under codes[i]")
_USER_MARK = "@@EDGE_RUNTIME_USER_TURN@@"
_PLAIN_AFTER = "\n\nAnswer:\n"
_STAMPED_SUFFIXES = (".json", ".safetensors", ".bin", ".jinja", ".model", ".txt")

# Requests the verification renders (the shared golden request, and more shapes and lengths).
_SAMPLES: list[dict[str, Any]] = [
    {"state": "Write a Python function that merges two sorted lists and explain its running time.",
     "questions": {
         "domain": {"type": "choice", "instructions": "Which domain does this request belong to?",
                    "criteria": {"code": "Programming", "math": "Mathematics", "other": "Anything else"}},
         "reasoning": {"type": "noul", "instructions": "Does answering this request need multi-step reasoning?"},
         "difficulty": {"type": "score", "instructions": "How difficult is this request?",
                        "criteria": ["Trivial", "Moderate", "Hard"]}}},
    {"state": "My card was charged twice and the parcel never arrived.",
     "questions": {
         "team": {"type": "choice", "choices": [{"key": "billing", "description": "payments and refunds"},
                                                {"key": "shipping", "description": "parcels and delivery"},
                                                {"key": "tech"}, {"key": "sales"}, {"key": "other"}]},
         "urgent": {"type": "noul", "instructions": "Is this urgent?",
                    "criteria": {"true": "the customer needs help today"}}}},
    {"state": {"user": "Où est ma commande ? Ça fait déjà 10 jours.", "order": {"id": 1182, "status": "shipped"}},
     "questions": {
         "mood": {"type": "score", "instructions": "How upset is the customer?",
                  "levels": ["calm", "a little", "upset", "angry", "furious"]}}},
    {"state": "", "questions": {"empty": {"type": "noul", "instructions": "Is the state empty?"}}},
    {"state": "Our servers in Frankfurt were unreachable for twelve minutes last night. "
              "The invoice was sent twice. The meeting has been moved to Thursday at 3 pm in room 4B. "
              "Please cancel my subscription before the next billing cycle.",
     "questions": {
         "topics": {"type": "choice", "instructions": "What is the main topic?",
                    "criteria": {"outage": None, "billing": "invoices", "meetings": None}},
         "action": {"type": "noul", "instructions": "Does the author ask for an action?"}}},
]


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


@dataclass
class _Case:
    state_ids: list[int]
    question_ids: list[int]
    count: int
    temperature: float

    @property
    def ids(self) -> list[int]:
        return [*self.state_ids, *self.question_ids]


def _sample_cases(prompt: CodesPrompt, config: dict[str, Any], cap: int) -> list[list[_Case]]:
    """Each sample request as its questions' token ids, grouped by request (one state each)."""
    from edge_runtime.requests.decisions import parse_decisions_request

    groups = []
    for body in _SAMPLES:
        entry = parse_decisions_request(body).single
        assert entry is not None
        questions = list(entry.valid)
        listed = questions if prompt.header else None
        temperature = select_temperature(config, len(questions))
        state = prompt.state_ids(entry.state, listed, cap)
        if state is None:
            continue
        cases = []
        for n, q in enumerate(questions, 1):
            ids = prompt.question_ids(q, n if prompt.header else None, cap - len(state))
            if ids is not None:
                cases.append(_Case(state, ids, len(q.options), temperature))
        if cases:
            groups.append(cases)
    if not groups:
        raise ConversionError(f"no sample request fits the model's {cap} tokens per question")
    return groups


def _torch_probabilities(lm: Any, case: _Case, token_ids: Sequence[int], trained: np.ndarray | None,
                         softcap: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Transformers' code probabilities and last hidden state for one prompt (batch 1, no padding)."""
    import torch

    ids = torch.tensor([case.ids], dtype=torch.long)
    with torch.no_grad():
        hidden = lm.base_model(input_ids=ids).last_hidden_state[0, -1].float().numpy()
        if trained is None:
            logits = lm(input_ids=ids).logits[0, -1].float().numpy().astype(np.float64)
            z = logits[list(token_ids[: case.count])]  # the LM's own logits, soft-capping included
        else:
            z = (trained[: case.count] @ hidden).astype(np.float64)
            if softcap:
                z = softcap * np.tanh(z / softcap)
    z = z / case.temperature
    e = np.exp(z - z.max())
    return e / e.sum(), hidden


@dataclass
class _Verified:
    probabilities: float
    hidden: float
    state_once: float | None
    cases: int
    lengths: list[int]
    spread: float


def _verify(lm: Any, graph: Path, groups: list[list[_Case]], token_ids: Sequence[int], readout: np.ndarray,
            bias: np.ndarray | None, trained: bool, softcap: float | None, pad_id: int, state_once: bool) -> _Verified:
    from edge_runtime.engine.causal import CausalForward, branch_row, causal_row
    from edge_runtime.engine.session import create_session

    forward = CausalForward(create_session(graph, "cpu", 1), pad_id=pad_id)
    worst_p = worst_h = spread = 0.0
    worst_branch: float | None = 0.0 if state_once else None
    cases = [c for g in groups for c in g]
    alone = []
    for case in cases:
        (h,) = forward([causal_row(case.ids)])
        alone.append(h)
        p = code_probabilities(h, readout, case.count, case.temperature, bias, softcap)
        ref, ref_h = _torch_probabilities(lm, case, token_ids, readout if trained else None, softcap)
        if not np.all(np.isfinite(p)):
            raise ConversionError("verification: the graph's code probabilities are not finite")
        worst_p = max(worst_p, float(np.max(np.abs(p - ref))))
        worst_h = max(worst_h, float(np.max(np.abs(h - ref_h))))
        spread = max(spread, float(p.max() - p.min()))
    if worst_p > PROBABILITY_TOLERANCE or math.isnan(worst_p):
        raise ConversionError(f"verification failed: code probabilities differ from Transformers' by {worst_p:.3g}, "
                              f"above {PROBABILITY_TOLERANCE:g}; no package written")
    if state_once:
        i = 0
        for group in groups:
            (branched,) = forward([branch_row(group[0].state_ids, [c.question_ids for c in group])])
            for j, case in enumerate(group):
                p_b = code_probabilities(branched[j], readout, case.count, case.temperature, bias, softcap)
                p_a = code_probabilities(alone[i], readout, case.count, case.temperature, bias, softcap)
                worst_branch = max(worst_branch or 0.0, float(np.max(np.abs(p_b - p_a))))
                i += 1
        if worst_branch is not None and worst_branch > STATE_ONCE_TOLERANCE:
            raise ConversionError(f"verification failed: state-once differs from each question alone by "
                                  f"{worst_branch:.3g}, above {STATE_ONCE_TOLERANCE:g}; no package written")
    return _Verified(worst_p, worst_h, worst_branch, len(cases), sorted({len(c.ids) for c in cases}), spread)


def _agreement(fp32: Path, int8: Path, groups: list[list[_Case]], readout: np.ndarray, bias: np.ndarray | None,
               softcap: float | None, pad_id: int) -> dict[str, Any]:
    """Code probabilities of the int8 backbone against fp32, every sample question alone:
    max and mean |dp|, and how often the top code agrees."""
    from edge_runtime.engine.causal import CausalForward, causal_row
    from edge_runtime.engine.session import create_session

    a = CausalForward(create_session(fp32, "cpu", 1), pad_id=pad_id)
    b = CausalForward(create_session(int8, "cpu", 1), pad_id=pad_id)
    dps, tops = [], []
    for case in (c for g in groups for c in g):
        (ha,) = a([causal_row(case.ids)])
        (hb,) = b([causal_row(case.ids)])
        pa = code_probabilities(ha, readout, case.count, case.temperature, bias, softcap)
        pb = code_probabilities(hb, readout, case.count, case.temperature, bias, softcap)
        if not np.all(np.isfinite(pb)):
            raise ConversionError("int8: the quantized graph's code probabilities are not finite")
        dps.append(float(np.max(np.abs(pa - pb))))
        tops.append(int(np.argmax(pa)) == int(np.argmax(pb)))
    return {"metric": "code_probability", "max_abs_dp": round(max(dps), 6),
            "mean_abs_dp": round(float(np.mean(dps)), 6), "top_label_agreement": round(float(np.mean(tops)), 6),
            "cases": len(dps)}


def _goldens(
    graph: Path, groups: list[list[_Case]], pad_id: int
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
        groups = _sample_cases(prompt, config, cap)
        with Step("checking code probabilities against Transformers") as s:
            verified = _verify(lm, graph, groups, token_ids, readout, bias, trained is not None,
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
                agreement = _agreement(graph, q_path, groups, readout, bias, config["logit_softcap"], int(pad_id))
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


# ---- fixture -------------------------------------------------------------------------------

FIXTURE_RELEASE_DATE = "2025-01-01"
FIXTURE_VOCAB = 800
FIXTURE_MAX_POSITIONS = 1024
FIXTURE_LIMITS = {"validated_input_tokens": 768, "max_request_tokens": 1536}
FIXTURE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
#: ChatML as Qwen3 renders it with thinking off.
FIXTURE_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def train_fixture_tokenizer() -> Any:
    """A byte-level BPE trained with `tokenizers` on the fixture corpus and the prompt's words,
    plus merges that make every code (A..Z, AA.., 255 in all) one token."""
    from converters.fixture_tokenizers import byte_level_bpe
    from converters.samples import fixture_corpus
    from edge_runtime.families.decision_codes.family import DEFAULT_INSTRUCTIONS, REPLY

    corpus = [*fixture_corpus(), SYSTEM, REPLY, DEFAULT_INSTRUCTIONS, "State:\nQuestion:\nOptions:\nQuestions:\n"]
    corpus += [json.dumps(b, ensure_ascii=False) for b in _SAMPLES]
    return byte_level_bpe(corpus, FIXTURE_SPECIALS, vocab_size=FIXTURE_VOCAB, nfc=True, min_frequency=2,
                          extra_tokens=code_candidates()[:MAX_CODES])


def build_fixture_source(d: Path, seed: int = 0, readout: str = "lm_head") -> Path:
    """A tiny random Qwen3ForCausalLM directory (hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16, tied)."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tok = train_fixture_tokenizer()
    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        max_position_embeddings=FIXTURE_MAX_POSITIONS, pad_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"), bos_token_id=None,
        initializer_range=0.2,  # wider than Qwen's 0.02 so that random codes get distinct probabilities
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"],  # toolchain P4: no token_type_ids for a decoder
        model_max_length=FIXTURE_MAX_POSITIONS, chat_template=FIXTURE_CHAT_TEMPLATE)
    hf_tok.save_pretrained(d)
    if readout == "trained":
        from safetensors.numpy import save_file

        rng = np.random.default_rng(seed + 2)
        save_file({"weight": (rng.standard_normal((MAX_CODES, 64)) * 0.5).astype(np.float32)},
                  str(d / "readout.safetensors"))
        (d / "decision_config.json").write_text(json.dumps({"codes": code_candidates()[:MAX_CODES]}))
    elif readout != "lm_head":
        raise ConversionError(f"fixture readout must be lm_head or trained, not {readout!r}")
    return d


def build_decision_codes_fixture_result(
    out: Path, seed: int = 0, attention_mode: str = "causal", prompt_layout: str | None = None,
    temperature_by_questions: dict[str, list] | None = None, readout: str = "lm_head",
    source_dir: Path | None = None, **options: Any,
) -> ExportResult:
    """Build the fixture package at ``out``; ``source_dir`` keeps the Hugging Face source there."""
    fields = {
        "attention_mode": attention_mode,
        "prompt_layout": prompt_layout,
        "temperature_by_questions": temperature_by_questions,
        "name": f"fixture-{KIND}" + ("-state-once" if attention_mode == "prefix_causal" else ""),
        "description": (f"Tiny random-weight Qwen3 {KIND} fixture (seed {seed}, {attention_mode}); "
                        "for tests, not a real model"),
        "version": "0.0.1",
        "release_date": FIXTURE_RELEASE_DATE,
        "license": "Apache-2.0",
        "source_name": f"edge-runtime fixture qwen3-tiny (seed {seed})",
        "validated_input_tokens": FIXTURE_LIMITS["validated_input_tokens"],
        "max_request_tokens": FIXTURE_LIMITS["max_request_tokens"] if attention_mode == "prefix_causal" else None,
        **options,
    }
    try:
        opts = DecisionCodesOptions(**fields)
    except TypeError as e:
        raise ConversionError(f"fixture option: {e}") from None
    if source_dir is not None:
        return export_decision_codes(build_fixture_source(Path(source_dir), seed, readout), Path(out), opts)
    with tempfile.TemporaryDirectory(prefix="er-fixture-") as tmp:
        src = build_fixture_source(Path(tmp) / f"fixture-{KIND}", seed, readout)
        return export_decision_codes(src, Path(out), opts)


def build_decision_codes_fixture(out: Path, seed: int = 0, attention_mode: str = "causal",
                                 prompt_layout: str | None = None,
                                 temperature_by_questions: dict[str, list] | None = None, **options: Any) -> Path:
    """The decision-codes fixture package at ``out`` (see build_decision_codes_fixture_result)."""
    return build_decision_codes_fixture_result(out, seed, attention_mode, prompt_layout, temperature_by_questions,
                                               **options).path


# ---- command line --------------------------------------------------------------------------

_CLI_FLAGS = ("attention_mode", "prompt_layout", "temperature", "temperature_by_questions",
              "validated_input_tokens", "max_request_tokens")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_cli_arguments(parser: argparse.ArgumentParser, fixture: bool = False) -> None:
    """The decision-codes options of ``export`` (and a few of ``fixture``)."""
    g = parser.add_argument_group("decision-codes")
    g.add_argument("--attention-mode", choices=ATTENTION_MODES, default=None,
                   help="causal: a row per question; prefix_causal: the state once, questions branched (state-once)")
    g.add_argument("--prompt-layout", choices=("header-v1",), default=None,
                   help="header-v1: list the request's questions in front of the state")
    if fixture:
        return
    g.add_argument("--temperature", type=float, help="readout temperature (default 1.0, or the source's)")
    g.add_argument("--temperature-by-questions", type=_json_object,
                   help='e.g. \'{"max_questions": [1], "temperature": [1.046, 1.0]}\'')
    g.add_argument("--validated-input-tokens", type=int, help="per-question cap without options.long_context")
    g.add_argument("--max-request-tokens", type=int,
                   help="state-once: the state once and every question (default max_input_tokens)")


def reject_cli_arguments(args: argparse.Namespace) -> None:
    """ConversionError when decision-codes options were given for another kind."""
    given = [f"--{k.replace('_', '-')}" for k in _CLI_FLAGS if getattr(args, k, None) is not None]
    if given:
        raise ConversionError(f"{', '.join(given)} apply to kind decision-codes only")


def export_from_args(args: argparse.Namespace) -> ExportResult:
    """``export SRC --kind decision-codes`` from parsed arguments."""
    opts = DecisionCodesOptions(
        quantize=args.quantize,
        attention_mode=args.attention_mode or "causal", prompt_layout=args.prompt_layout,
        temperature=args.temperature, temperature_by_questions=args.temperature_by_questions,
        max_input_tokens=args.max_input_tokens, validated_input_tokens=args.validated_input_tokens,
        max_request_tokens=args.max_request_tokens, name=args.name, description=args.description,
        version=args.version, release_date=args.release_date, revision=args.revision,
        license=args.license, source_name=args.source_name)
    return export_decision_codes(args.src, args.out, opts)


def fixture_from_args(args: argparse.Namespace) -> ExportResult:
    """``fixture --kind decision-codes`` from parsed arguments."""
    return build_decision_codes_fixture_result(args.out, seed=args.seed, attention_mode=args.attention_mode or "causal",
                                               prompt_layout=args.prompt_layout, quantize=args.quantize)


__all__ = ["DecisionCodesOptions", "add_cli_arguments", "build_decision_codes_fixture",
           "build_decision_codes_fixture_result", "build_fixture_source", "choose_codes", "code_candidates",
           "export_decision_codes", "export_from_args", "fixture_from_args", "reject_cli_arguments",
           "train_fixture_tokenizer"]
