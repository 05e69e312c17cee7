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

The written package (d3-spec.md): model.onnx, embeddings.npy (float32 [vocab, H]), head.npz (readout
[255, H], rounded through readout_dtype), decision_config.json (ours), tokenizer.json (as built), card.json,
golden.npz. The vision tower is not converted yet: a vision package converts its text path (card modalities
``text``) and the card says so.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
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
from converters.errors import ConversionError
from converters.export import ExportResult, PackageIdentity, identity_card, notice_files, sanitize_name
from converters.package_writer import card_start
from converters.progress import Step, log
from edge_runtime.engine.causal import causal_row
from edge_runtime.families.decision3.prompt import D3Prompt, PromptTokens, common_prefix
from edge_runtime.heads.decisions import code_probabilities
from edge_runtime.packages.golden import npz_bytes
from edge_runtime.questions import Question, parse_question

KIND = "decision3"
CONFIG_FORMAT = "decision3-config/1"
QUESTION_TYPES = ("choice", "noul", "score")
#: the largest |p_onnx - p_transformers| over the code probabilities accepted (fp32 both)
PROBABILITY_TOLERANCE = 1e-5
DEFAULT_CHECK_REQUESTS = 50
#: rows per ORT call while checking (the server batches the same way; rows are batch-invariant)
CHECK_BATCH = 8
NONCAUSAL_STATE_ONCE = ("a full-attention layer of a noncausal_full_attention package lets the prefix's positions "
                        "attend to the question's tokens, so the prefix's states depend on the question: every "
                        "question runs its whole prompt")
_WORDS = ("route", "the", "request", "to", "a", "model", "that", "answers", "it", "best", "code", "math", "State",
          "option", "Question", "data", "not", "instructions", "Yes", "No", "écrire", "函数", "🙂", "{\"k\": 1}", "42",
          "merge", "sorted", "lists", "and", "explain", "running", "time.")


@dataclass(kw_only=True)
class Decision3Options(PackageIdentity):
    """What `export --kind decision3` takes besides the identity."""

    reference: bool = True
    check_requests: int = DEFAULT_CHECK_REQUESTS
    max_input_tokens: int | None = None


# ---- requests for the checks ------------------------------------------------------------------


def sample_requests(count: int, seed: int = 0) -> list[tuple[Any, dict[str, Any]]]:
    """``count`` deterministic (state, questions) pairs: empty, short, JSON and long states (hundreds of
    tokens, across the GDN chunk boundary), choice / noul / score questions with string and JSON texts."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n))

    out: list[tuple[Any, dict[str, Any]]] = []
    for i in range(count):
        shape = i % 5
        state: Any = ("" if shape == 0 else words(rng.randint(2, 12)) if shape in (1, 2)
                      else {"turns": [words(4), words(6)], "n": i} if shape == 3 else words(rng.randint(120, 260)))
        questions: dict[str, Any] = {}
        for j in range(rng.randint(1, 3)):
            kind = QUESTION_TYPES[(i + j) % 3]
            if kind == "choice":
                keys = [f"k{m}" for m in range(rng.randint(2, 6))]
                criteria = {k: (None if rng.random() < 0.2 else words(rng.randint(1, 4)) if rng.random() < 0.8
                                else {"label": words(2)}) for k in keys}
                questions[f"q{j}"] = {"type": "choice", "instructions": words(rng.randint(3, 9)), "criteria": criteria}
            elif kind == "noul":
                q: dict[str, Any] = {"type": "noul", "instructions": words(rng.randint(3, 9))}
                if rng.random() < 0.4:
                    q["criteria"] = {"true": words(3), "false": words(2)}
                questions[f"q{j}"] = q
            else:
                levels = [f"{words(2)} {m}" for m in range(rng.randint(2, 5))]
                questions[f"q{j}"] = {"type": "score", "instructions": words(rng.randint(3, 9)), "criteria": levels}
        out.append((state, questions))
    return out


@dataclass
class _Row:
    request: int
    question: Question
    ids: tuple[int, ...]


def _rows(prompt: D3Prompt, requests: Sequence[tuple[Any, dict[str, Any]]], limit: int) -> list[_Row]:
    rows = []
    for r, (state, questions) in enumerate(requests):
        for qid, raw in questions.items():
            q = parse_question(qid, raw)
            if not isinstance(q, Question):
                raise ConversionError(f"check request {r}: question {qid} is invalid ({q.message})")
            got = prompt.tokens(state, q, limit)
            if not isinstance(got, PromptTokens):
                raise ConversionError(f"check request {r}: question {qid} does not fit {limit} tokens")
            rows.append(_Row(r, q, got.ids))
    return rows


# ---- checks -------------------------------------------------------------------------------------


@dataclass
class _Verified:
    reference: str
    probabilities: float
    hidden: float
    cases: int
    lengths: list[int]
    transformers: bool
    bf16: dict[str, Any] = field(default_factory=dict)
    torch_core: float = 0.0
    state_once: float | None = None


def _ours(graph: Path, embeddings: np.ndarray, attention_mode: str, rows: Sequence[_Row]) -> np.ndarray:
    """Last-token hidden states of the rows from the ONNX graph through the server's Forward."""
    from edge_runtime.engine.recurrent import RecurrentForward
    from edge_runtime.engine.session import create_session

    forward = RecurrentForward(create_session(graph, "cpu", 2), embeddings, attention_mode=attention_mode)
    out: list[np.ndarray] = []
    for start in range(0, len(rows), CHECK_BATCH):
        out += forward([causal_row(r.ids) for r in rows[start:start + CHECK_BATCH]])
    return np.stack(out)


def _state_once(graph: Path, embeddings: np.ndarray, rows: Sequence[_Row], whole: np.ndarray) -> float:
    """max |h_branch - h_whole| over the requests with two or more questions (prefix run once)."""
    from edge_runtime.engine.causal import branch_row
    from edge_runtime.engine.recurrent import RecurrentForward
    from edge_runtime.engine.session import create_session

    forward = RecurrentForward(create_session(graph, "cpu", 2), embeddings, attention_mode="causal")
    worst = 0.0
    for r in sorted({row.request for row in rows}):
        index = [i for i, row in enumerate(rows) if row.request == r]
        if len(index) < 2:
            continue
        ids = [rows[i].ids for i in index]
        k = common_prefix(ids)
        got = forward([branch_row(ids[0][:k], [s[k:] for s in ids])])[0]
        worst = max(worst, float(np.abs(got - whole[index]).max()))
    return worst


def _padded_ids(rows: Sequence[_Row], pad_id: int) -> dict[str, np.ndarray]:
    width = max(len(r.ids) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for b, r in enumerate(rows):
        ids[b, :len(r.ids)] = r.ids
        mask[b, :len(r.ids)] = 1
    positions = np.broadcast_to(np.arange(width, dtype=np.int64), (len(rows), 3, width)).copy()
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def _torch_core(weights: dict[str, Any], text_config: dict[str, Any], attention_mode: str, embeddings: np.ndarray,
                rows: Sequence[_Row]) -> np.ndarray:
    """Our torch forward (the module the graph was exported from), right-padded, last real tokens."""
    import torch

    from converters.decision3.backbone import build_text_core

    core = build_text_core(weights, text_config, attention_mode)
    out = []
    with torch.no_grad():
        for start in range(0, len(rows), CHECK_BATCH):
            chunk = rows[start:start + CHECK_BATCH]
            feeds = _padded_ids(chunk, 0)
            embeds = torch.from_numpy(embeddings[feeds["input_ids"]] * feeds["attention_mask"][..., None])
            result = core(embeds.float(), torch.from_numpy(feeds["attention_mask"]),
                          torch.from_numpy(feeds["position_ids"]), *core.empty_pasts(len(chunk)))
            hidden = result[0].numpy()
            out.append(hidden[np.arange(len(chunk)), [len(r.ids) - 1 for r in chunk]])
    return np.concatenate(out)


def _probabilities(hidden: np.ndarray, rows: Sequence[_Row], readout: np.ndarray, temperature: float
                   ) -> list[np.ndarray]:
    return [code_probabilities(h, readout, len(r.question.options), temperature) for h, r in zip(hidden, rows)]


def _max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def _verify(source: src.Decision3Source, weights: dict[str, Any], graph: Path, embeddings: np.ndarray,
            readout: np.ndarray, rows: list[_Row], pad_id: int, reference: bool) -> _Verified:
    mode, temperature = source.attention_mode, source.temperature
    ours = _ours(graph, embeddings, mode, rows)
    p_ours = _probabilities(ours, rows, readout, temperature)
    core = _torch_core(weights, source.text_config, mode, embeddings, rows)
    core_diff = _max_diff(p_ours, _probabilities(core, rows, readout, temperature))
    lengths = sorted(len(r.ids) for r in rows)
    verified = _Verified(reference="", probabilities=core_diff, hidden=float(np.abs(ours - core).max()),
                         cases=len(rows), lengths=[lengths[0], lengths[len(lengths) // 2], lengths[-1]],
                         transformers=False, torch_core=core_diff)
    if reference:
        from converters.decision3.export import reference_hidden

        files = [source.root / w for w in source.weights if w.endswith(".safetensors")]
        feeds = _padded_ids(rows, pad_id)
        ref = reference_hidden(files, source.config, feeds, mode, ("float32", "bfloat16"))
        last = np.array([len(r.ids) - 1 for r in rows])
        h32 = ref["float32"][np.arange(len(rows)), last]
        h16 = ref["bfloat16"][np.arange(len(rows)), last]
        p32 = _probabilities(h32, rows, readout, temperature)
        p16 = _probabilities(h16, rows, readout, temperature)
        agree = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(p_ours, p16))
        verified.probabilities = _max_diff(p_ours, p32)
        verified.hidden = float(np.abs(ours - h32).max())
        verified.transformers = True
        verified.bf16 = {"argmax_agreement": round(agree / len(rows), 4), "cases": len(rows),
                         "max_abs_diff_probabilities": float(f"{_max_diff(p_ours, p16):.3g}")}
    if mode == "causal":
        verified.state_once = _state_once(graph, embeddings, rows, ours)
    return verified


def _goldens(graph: Path, embeddings: np.ndarray, rows: Sequence[_Row]
             ) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Batch-1 golden cases (the shortest, a middle and the longest check row) over empty states."""
    from edge_runtime.engine.recurrent import RecurrentForward, text_positions
    from edge_runtime.engine.session import create_session

    session = create_session(graph, "cpu", 1)
    forward = RecurrentForward(session, embeddings)
    ordered = sorted(rows, key=lambda r: len(r.ids))
    cases = []
    for row in (ordered[0], ordered[len(ordered) // 2], ordered[-1]):
        n = len(row.ids)
        feeds: dict[str, np.ndarray] = {"inputs_embeds": np.asarray(embeddings[list(row.ids)], dtype=np.float32)[None],
                 "attention_mask": np.ones((1, n), dtype=np.int64), "position_ids": text_positions(0, n)[None],
                 **forward.empty_states(1)}
        cases.append((feeds, session.run(feeds, ["last_hidden_state"])))
    return cases


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


def export_decision3(src_path: str | Path, out: Path, opts: Decision3Options) -> ExportResult:
    """Convert the upstream package ``src_path`` into the package ``out`` (see the module docstring)."""
    import torch

    from converters.decision3.export import OPSET, export_text_core

    timings: dict[str, float] = {}
    if opts.check_requests < 1:
        raise ConversionError("the parity check needs at least one request")
    with Step("verifying the upstream Decision 3.0 package") as s:
        source = src.read_source(src_path)
        template = check_chat_template(source.root)
        built = build_tokenizer(source.root)
        check_codes(built.tokenizer, source.codes, source.token_ids)
        check_config_tokens(built, source.config, source.vision_prefix is not None)
    timings["verify"] = s.seconds
    limit = source.max_input_tokens
    if opts.max_input_tokens is not None:
        if not src.MIN_INPUT_TOKENS <= opts.max_input_tokens <= limit:
            raise ConversionError(f"--max-input-tokens must be in [{src.MIN_INPUT_TOKENS}, {limit}]")
        limit = opts.max_input_tokens
    name = sanitize_name(opts.name or source.manifest.get("model_name") or source.root.name)
    with Step("reading the BF16 text weights (exact fp32 upcast)") as s:
        weights = src.text_weights(source)
        if "embed_tokens.weight" not in weights:
            raise ConversionError("the checkpoint has no language_model embed_tokens.weight")
        embeddings = np.ascontiguousarray(weights["embed_tokens.weight"].numpy(), dtype=np.float32)
        readout = src.readout_matrix(source)
    timings["read"] = s.seconds
    vocab = built.tokenizer.get_vocab_size()
    if embeddings.shape[0] < vocab:
        raise ConversionError(f"the embedding table has {embeddings.shape[0]} rows; the tokenizer has {vocab} ids")
    prompt = D3Prompt(built.tokenizer, source.codes)
    rows = _rows(prompt, sample_requests(opts.check_requests), limit)
    with tempfile.TemporaryDirectory(prefix="er-decision3-") as tmp:
        work = Path(tmp)
        with Step(f"exporting the text core to ONNX (opset {OPSET}, {source.attention_mode})") as s:
            report = export_text_core(weights, source.text_config, source.attention_mode, work / "model.onnx")
        timings["export"] = s.seconds
        graph = report.files[0]
        what = "Transformers 5 (fp32 and bf16)" if opts.reference else "our torch forward (--no-reference)"
        with Step(f"checking code probabilities over {len(rows)} questions against {what}") as s:
            verified = _verify(source, weights, graph, embeddings, readout, rows, built.pad_id, opts.reference)
        timings["parity"] = s.seconds
        if verified.probabilities > PROBABILITY_TOLERANCE:
            raise ConversionError(f"the graph's code probabilities differ from the reference by "
                                  f"{verified.probabilities:.3g} (> {PROBABILITY_TOLERANCE})")
        if verified.state_once is not None and verified.state_once > PROBABILITY_TOLERANCE:
            raise ConversionError(f"state-once hidden states differ from whole rows by {verified.state_once:.3g}")
        log(f"parity: max |dp| = {verified.probabilities:.3g}, hidden {verified.hidden:.3g}"
            + (f", bf16 argmax agreement {verified.bf16['argmax_agreement']}" if verified.bf16 else "")
            + (f", state-once vs whole {verified.state_once:.3g}" if verified.state_once is not None else ""))
        goldens = {"fp32": _goldens(graph, embeddings, rows)}
        config = decision_config(source, built, limit)
        files: dict[str, Path | bytes] = {
            **{p.name: p for p in report.files},
            "embeddings.npy": _npy_bytes(embeddings),
            "head.npz": npz_bytes({"readout": readout}),
            "tokenizer.json": built.to_json(),
            "decision_config.json": (json.dumps(config, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode(),
        }
        files.update(notice_files(source.root, opts))
        vision = source.vision_prefix is not None
        if opts.reference:
            reference = (f"Transformers 5 Qwen3_5TextModel fp32 ({source.attention_mode}, upstream's noncausal hook "
                         "where set), code probabilities at the last real token")
        else:
            reference = ("not verified against Transformers (--no-reference): the graph against edge-runtime's torch "
                         "Qwen3.5 forward it was exported from")
        outputs = {"probabilities": float(f"{verified.probabilities:.3g}"),
                   "last_hidden_state": float(f"{verified.hidden:.3g}"),
                   "torch_core_probabilities": float(f"{verified.torch_core:.3g}")}
        if verified.state_once is not None:
            outputs["state_once_vs_whole"] = float(f"{verified.state_once:.3g}")
        architecture = "Qwen3_5Model"
        card = {
            **card_start(name, KIND, KIND, identity_card(
                opts, source.root, source_name=opts.source_name or str(source.decision.get("base_model")
                                                                        or source.root.name),
                architecture=architecture, stamp=source.model_sha256,
                description=f"Decision 3.0 code-readout model ({source.attention_mode}) from {source.root.name}")),
            "head": {"output": "last_hidden_state", "pooling": "last", "readout": "head.npz:readout",
                     "codes": src.MAX_OPTIONS, "readout_dtype": source.readout_dtype,
                     "temperature": source.temperature},
            "limits": {"max_input_tokens": limit},
            "graph": {"inputs": report.input_names, "outputs": report.output_names, "opset": OPSET,
                      "attention_mode": source.attention_mode, "layer_types": config["layer_types"],
                      "embeddings": "embeddings.npy"},
            "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
            "verification": {"reference": reference, "max_abs_diff": outputs["probabilities"],
                             "tolerance": PROBABILITY_TOLERANCE, "cases": verified.cases, "outputs": outputs,
                             "lengths": verified.lengths, "transformers": verified.transformers,
                             **({"bf16": verified.bf16} if verified.bf16 else {})},
            "build": {"converter_version": CONVERTER_VERSION, "source_stamp": source.model_sha256,
                      "torch": torch.__version__.split("+")[0],
                      "options": {"reference": opts.reference, "check_requests": opts.check_requests,
                                  "max_input_tokens": opts.max_input_tokens}},
            "attention_mode": source.attention_mode,
            "question_types": list(QUESTION_TYPES),
            "usage": "state_once" if source.attention_mode == "causal" else "per_question",
            "state_once": ("the longest common token prefix of a request's question prompts runs once; each "
                           "question continues from its GDN and attention states" if source.attention_mode == "causal"
                           else NONCAUSAL_STATE_ONCE),
            "upstream": {"format_id": src.FORMAT_ID, "model_sha256": source.model_sha256,
                         "manifest_sha256": source.manifest_sha256, "chat_template_sha256": template,
                         "vision_tower": "present, not converted yet: images are refused" if vision else "absent"},
        }
        with Step(f"writing package {out}") as s:
            from converters.package_writer import write_package

            digest = write_package(Path(out), card, files, goldens)
        timings["write"] = s.seconds
    from edge_runtime.packages import read_package

    log(f"package {name} written to {out} (digest {digest[:16]}...)")
    return ExportResult(path=Path(out), digest=digest, card=read_package(Path(out)).card.raw, timings=timings)


# ---- command line -------------------------------------------------------------------------------


def add_cli_arguments(parser: argparse.ArgumentParser, fixture: bool = False) -> None:
    """The decision3 options of ``export`` (``--no-reference``) and ``fixture`` (``--variant``,
    ``--upstream-attention``)."""
    g = parser.add_argument_group("decision3")
    g.add_argument("--no-reference", action="store_true",
                   help="decision3: skip the Transformers 5 parity check (the card says unverified)")
    if fixture:
        from converters.decision3.fixture import VARIANTS

        g.add_argument("--variant", choices=VARIANTS, default=None,
                       help="decision3: the upstream fixture's variant (default vision)")
        g.add_argument("--upstream-attention", choices=src.ATTENTION_MODES, default=None,
                       help="decision3: the fixture's attention_mode (default noncausal_full_attention)")


def reject_cli_arguments(args: argparse.Namespace) -> None:
    """ConversionError when decision3 options were given for another kind."""
    given = [flag for flag, value in (("--no-reference", getattr(args, "no_reference", False)),
                                      ("--variant", getattr(args, "variant", None)),
                                      ("--upstream-attention", getattr(args, "upstream_attention", None)))
             if value]
    if given:
        raise ConversionError(f"{', '.join(given)} apply to kind decision3 only")


def export_from_args(args: argparse.Namespace) -> ExportResult:
    """``export SRC --kind decision3`` from parsed arguments."""
    from converters.decision_codes import reject_cli_arguments as reject_codes

    reject_codes(args)
    if args.quantize or args.layers or args.dimensions or args.pooling or args.normalize is not None \
            or args.thresholds:
        raise ConversionError("kind decision3 takes only --out, --name, --max-input-tokens, --no-reference and the "
                              "identity options")
    return export_decision3(args.src, args.out, Decision3Options(
        name=args.name, description=args.description, version=args.version, release_date=args.release_date,
        revision=args.revision, license=args.license, source_name=args.source_name,
        reference=not args.no_reference, max_input_tokens=args.max_input_tokens))


def fixture_from_args(args: argparse.Namespace) -> ExportResult | None:
    """``fixture --kind decision3-source`` (the upstream format) or ``--kind decision3`` (converted)."""
    from converters.decision3.fixture import write_source_fixture
    from converters.decision_codes import reject_cli_arguments as reject_codes

    reject_codes(args)
    if args.quantize:
        raise ConversionError("--quantize is not available for decision3")
    variant = args.variant or "vision"
    attention = args.upstream_attention or "noncausal_full_attention"
    if args.kind == "decision3-source":
        path = write_source_fixture(args.out, variant, seed=args.seed, attention_mode=attention)
        print(json.dumps({"path": str(path), "format": src.MANIFEST_SCHEMA, "variant": variant,
                          "attention_mode": attention}))
        return None
    return build_fixture(args.out, variant=variant, attention_mode=attention, seed=args.seed,
                         reference=not args.no_reference)


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


__all__ = ["DEFAULT_CHECK_REQUESTS", "PROBABILITY_TOLERANCE", "Decision3Options", "add_cli_arguments",
           "build_fixture", "decision_config", "export_decision3", "export_from_args",
           "fixture_from_args", "reject_cli_arguments", "sample_requests"]
