"""Build the ``sparrow-nano`` package from the sparrow-decider wheel's bundled nano-general model.

The ``.sparrow`` file is a zip of config.json, tokenizer.json (a WordPiece vocabulary) and
model.npz (int8 weights, one fp32 scale per row). Nothing in it is executed: the zip is read as
data, the graph is written with ``onnx.helper`` at opset 18, and the tokenizer is rebuilt as a
Hugging Face ``tokenizers`` file. The graph keeps the int8 embedding table (Gather -> Cast -> Mul by
the row's scale), and dequantises the small MLP once, as the package's own loader does.

Graph (batch axis 1; one question per run; model.question.onnx and model.answer{n}.onnx are it in
two halves, see build_question_graph and build_answer_graph):
    state_ids int64[1,S], question_ids int64[1,Q], option_ids int64[1,K,L] (0-padded),
    option_mask f32[1,K,L], kind int64[1] (0 noul, 1 choice, 2 score)
    -> logits f32[1,K], probs f32[1,K] = softmax(logits / T[kind])

Golden cases record the package's own numpy ``Decider`` (the reference), and the build checks the
graph against it through ONNX Runtime before the package is written.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

from converters import CONVERTER_VERSION
from converters.package_writer import card_start, write_package
from converters.progress import log
from converters.sparrow.graphs import (
    MAX_QUESTIONS_PER_RUN,
    MAX_SEGMENT_TOKENS,
    OPSET,
    QUESTION_GRAPH,
    answer_file,
    build_answer_graph,
    build_graph,
    build_question_graph,
)
from converters.sparrow.source import (
    SOURCE_DIST,
    build_tokenizer,
    licenses,
    read_source,
    release_date,
    source_file,
)
from converters.sparrow.verify import (
    GOLDEN,
    TOLERANCE,
    golden_question,
    reference_outputs,
    verify_graph,
    verify_split_graphs,
)
from edge_runtime.families.sparrow.family import (
    INPUTS,
    KINDS,
    OUTPUTS,
    SPLIT_LAYOUT,
    SparrowText,
    content,
)

PACKAGE_NAME = "sparrow-nano"

CARD_DESCRIPTION = (
    "sparrow-nano-general v1.1 from sparrow-decider: a 2.2M-parameter bag-of-words decision model "
    "(WordPiece static embeddings and a small MLP) for Choice, Noul and Score questions. Fast and "
    "weak: it cannot see word order or negation; the embedded default and a parity reference."
)


# ---- package -----------------------------------------------------------------------------


def build_sparrow_package(out_dir: Path, src: Path | None = None) -> Path:
    """Write the ``sparrow-nano`` package into ``out_dir/sparrow-nano`` and return that path; ``src`` is the
    ``.sparrow`` file to convert (default: the installed wheel's)."""
    src = src or source_file()
    source_bytes = src.read_bytes()
    cfg, vocab, weights = read_source(src)
    version = metadata.version(SOURCE_DIST)
    log(f"sparrow: converting {src.name} from {SOURCE_DIST} {version}")

    model = build_graph(cfg, weights)
    model_bytes = model.SerializeToString()
    tokenizer = build_tokenizer(vocab)
    config = {
        "format": "sparrow-decision-config/1",
        "source_model": cfg["name"],
        "kinds": dict(KINDS),
        "temperatures": {k: float(v) for k, v in cfg["temperature_by_kind"].items()},
        "noul_defaults": _noul_defaults(),
        "option_text": "{name} {description}",
        "max_segment_tokens": int(cfg.get("max_len", MAX_SEGMENT_TOKENS)),
        "empty_segment_id": 0,
    }
    text = SparrowText(tokenizer, config)

    from sparrow_decider import Decider

    decider = Decider.load(str(src))
    cases = []
    for state, raw in GOLDEN:
        q = golden_question(state, raw)
        row = text.row(text.ids(content(state), text.max_tokens), q)
        cases.append((row.feeds, reference_outputs(decider, state, raw)))
    worst = verify_graph(model_bytes, cases)
    split = {QUESTION_GRAPH: build_question_graph(cfg, weights).SerializeToString()}
    split.update((answer_file(n), build_answer_graph(cfg, weights, n).SerializeToString())
                 for n in range(1, MAX_QUESTIONS_PER_RUN + 1))
    checked = verify_split_graphs(model_bytes, split, text, len(vocab))
    log(f"sparrow: the split graphs answer {checked} questions as model.onnx does, bit for bit")
    config["split_graphs"] = {"layout": SPLIT_LAYOUT, "question": QUESTION_GRAPH,
                              "answers": {str(n): answer_file(n) for n in range(1, MAX_QUESTIONS_PER_RUN + 1)}}

    source_stamp = hashlib.sha256(source_bytes).hexdigest()
    card = {
        **card_start(PACKAGE_NAME, "sparrow", "sparrow", {
            "description": CARD_DESCRIPTION,
            "version": "1.1.0",
            "release_date": release_date(src),
            "revision": f"{SOURCE_DIST}-{version}/{cfg['name']}@{source_stamp[:12]}",
            "source": {
                "name": f"{SOURCE_DIST}=={version}:{cfg['name']}",
                "architecture": "static WordPiece embeddings (int8 table, potion-base-8M) + 768-128-128-1 GELU MLP",
                "license": "Apache-2.0 (code); MIT (potion-base-8M weights)",
            },
        }),
        "head": {"output": "probs", "activation": "softmax", "temperature": "per question kind"},
        "limits": {"max_input_tokens": MAX_SEGMENT_TOKENS},
        "graph": {"inputs": list(INPUTS), "outputs": list(OUTPUTS), "opset": OPSET},
        "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
        "verification": {
            "reference": f"{SOURCE_DIST} {version} Decider.probs (numpy)",
            "max_abs_diff": worst,
            "tolerance": max(TOLERANCE.values()),
            "cases": len(cases),
            "split_graphs": {"questions": checked, "equal_to": "model.onnx alone, bit for bit"},
        },
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": source_stamp},
        "question_types": ["choice", "noul", "score"],
        "usage": "per_question",
    }
    files: dict[str, Path | bytes] = {
        "model.onnx": model_bytes,
        **split,
        "tokenizer.json": tokenizer.to_str().encode("utf-8"),
        "decision_config.json": (
            json.dumps(config, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
        ).encode("utf-8"),
        **licenses(),
    }
    out = Path(out_dir) / PACKAGE_NAME
    digest = write_package(out, card, files, {"fp32": cases})
    log(f"sparrow: wrote {out} (digest {digest[:12]}, max |diff| vs reference {worst:.2g})")
    return out


def _noul_defaults() -> dict[str, str]:
    from sparrow_decider import NOUL_DEFAULT

    return {"false": NOUL_DEFAULT["false"], "true": NOUL_DEFAULT["true"]}
