"""Reading a ModernBERT task source as data: which head it carries and everything the head needs.

The layouts (reference/router-catalogue.md; upstream runtime ``families/task_heads/package.py``):

- ``ModernBertForSequenceClassification``: ``problem_type`` single-label is a ``sequence`` head (softmax),
  multi-label a ``scores`` head (one sigmoid per label) whose ``operating_point.json`` gives the
  thresholds, their comparison and the windows it was calibrated with;
- ``ModernBertForTokenClassification``: BIO labels are a ``token`` head; an ``operating_point.json``
  with ``input_pair`` (Vela Halu), or two labels that are not BIO (LettuceDetect), a ``grounded`` head;
- ``ModernBertModel`` + sentence-transformers pooling (``modules.json``, ``1_Pooling``): a ``pooled``
  embedder whose ``representation_contract`` and ``onnx/model_layer_<L>.onnx`` names give its Matryoshka
  dimensions and layer exits;
- ``ModernBertModel`` + ``matryoshka_config.json`` + ``classification_heads.safetensors``: the
  ``relevance`` reranker, an MLP scorer per (layer, dimension) exit.

mmBERT's YaRN rotary comes in two spellings: Transformers 4's ``rope_scaling`` with ``global_rope_theta``
and ``local_rope_theta``, and Transformers 5's per-layer-type ``rope_parameters`` (with ``layer_types``),
which :func:`transformers4_config` rewrites into the first so the converter's Transformers reads it.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from converters.errors import ConversionError
from converters.sentence_transformers import read_sentence_transformer
from edge_runtime.packages.manifest import file_sha256

SEQUENCE = "ModernBertForSequenceClassification"
TOKEN = "ModernBertForTokenClassification"
ENCODER = "ModernBertModel"
OPERATING_POINT = "operating_point.json"
MATRYOSHKA = "matryoshka_config.json"
SCORERS = "classification_heads.safetensors"
#: the Matryoshka views of a package whose representation contract declares them (upstream's default)
MATRYOSHKA_DIMENSIONS = (768, 512, 256, 128, 64)
#: the pair template of a grounded head whose package names none (LettuceDetect's and Vela Halu's)
DEFAULT_INPUT_PAIR = "User request: {question}\n\n{context}"
EMBED_CONTRACT = {"version": 1, "final_normalization": "final_norm", "pooling": "attention_mask_mean",
                  "pooling_accumulation_dtype": "float32", "truncate_before_l2_normalize": True}
RERANK_CONTRACT = {"version": 1, "pooling": "cls", "intermediate_normalization": "final_norm",
                   "final_normalization": "final_norm", "head_dtype": "float32"}
_EXIT_GRAPH = re.compile(r"^model_layer_(\d+)\.onnx$")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: unreadable JSON ({e})") from None


@dataclass(frozen=True)
class Pooled:
    """An embedder's layout: pooling, normalization, exits, Matryoshka sizes, exit normalization."""

    model_dir: Path
    pooling: str
    normalize: bool
    layers: tuple[int, ...]
    dimensions: tuple[int, ...]
    exit_normalization: str  # "none" | "final_norm"
    max_seq_length: int | None


@dataclass(frozen=True)
class Relevance:
    """A Matryoshka reranker's layout: its scored (layer, dimension) exits and the default one."""

    exits: tuple[tuple[int, int], ...]
    default: tuple[int, int]


@dataclass(frozen=True)
class TaskSource:
    """A recognised task checkpoint, before any weights load."""

    root: Path
    config: dict[str, Any]
    head: str  # sequence | scores | token | grounded | pooled | relevance
    labels: tuple[str, ...] = ()
    operating_point: dict[str, Any] | None = None
    pooled: Pooled | None = None
    relevance: Relevance | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def model_dir(self) -> Path:
        return self.pooled.model_dir if self.pooled is not None else self.root

    @property
    def architecture(self) -> str:
        return {"sequence": SEQUENCE, "scores": SEQUENCE, "token": TOKEN, "grounded": TOKEN}.get(self.head, ENCODER)


def labels_of(config: dict[str, Any]) -> tuple[str, ...]:
    """``id2label`` in index order; its indices must be exactly 0..n-1."""
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        raise ConversionError("config.json declares no labels (id2label)")
    try:
        indexed = {int(k): str(v) for k, v in id2label.items()}
    except ValueError:
        raise ConversionError("config.json id2label keys must be integers") from None
    if sorted(indexed) != list(range(len(indexed))):
        raise ConversionError("config.json id2label must cover 0..n-1")
    return tuple(indexed[i] for i in range(len(indexed)))


def _is_bio(labels: tuple[str, ...]) -> bool:
    return any(label.startswith(("B-", "I-")) for label in labels)


def read_source(root: Path) -> TaskSource:
    """The head ``root`` carries and what it needs; ConversionError for a layout this family cannot serve."""
    config = read_json(root / "config.json") if (root / "config.json").is_file() else None
    if not isinstance(config, dict) or config.get("model_type") != "modernbert":
        raise ConversionError(f"{root}: not a ModernBERT checkpoint (config.json model_type must be modernbert)")
    archs = [a for a in config.get("architectures") or [] if a in (SEQUENCE, TOKEN)]
    point = read_json(root / OPERATING_POINT) if (root / OPERATING_POINT).is_file() else None
    if point is not None and not isinstance(point, dict):
        raise ConversionError(f"{root / OPERATING_POINT}: expected a JSON object")
    if len(archs) > 1:
        raise ConversionError("config.json must name exactly one ModernBERT task architecture")
    if not archs:
        if (root / MATRYOSHKA).is_file() and (root / SCORERS).is_file():
            return TaskSource(root, config, "relevance", relevance=_relevance(root, config))
        if (root / "modules.json").is_file():
            return TaskSource(root, config, "pooled", pooled=_pooled(root, config))
        raise ConversionError(f"{root}: a ModernBertModel with neither sentence-transformers pooling nor "
                              f"{MATRYOSHKA} + {SCORERS}: no head to serve")
    labels = labels_of(config)
    if archs[0] == SEQUENCE:
        problem = config.get("problem_type") or "single_label_classification"
        head = {"single_label_classification": "sequence", "multi_label_classification": "scores"}.get(problem)
        if head is None:
            raise ConversionError(f"config.json problem_type {problem!r} is not served (single- or multi-label)")
        if head == "sequence" and point is not None:
            raise ConversionError(f"a softmax sequence head has no operating point ({OPERATING_POINT})")
        if head == "scores" and point is not None:
            check_operating_point(point, labels)
        return TaskSource(root, config, head, labels, point)
    if point is not None and "input_pair" in point:
        check_grounding(point, labels)
        return TaskSource(root, config, "grounded", labels, point)
    if _is_bio(labels):
        if "O" not in labels:
            raise ConversionError(f"BIO labels need an 'O' label: {list(labels)}")
        return TaskSource(root, config, "token", labels)
    if len(labels) == 2:
        return TaskSource(root, config, "grounded", labels, None, notes=[
            f"labels {list(labels)} are not BIO: read as a grounded head (runs of the positive label "
            f"{labels[positive_label(labels)]!r} over an answer, pair template {DEFAULT_INPUT_PAIR!r})"])
    raise ConversionError(f"a token classifier needs BIO labels, two labels (runs of the positive one) or a "
                          f"grounding policy; labels {list(labels)}")


def check_operating_point(point: dict[str, Any], labels: tuple[str, ...]) -> None:
    """An independent-sigmoid operating point whose labels are the classifier's, in order."""
    if point.get("score_type") != "independent_sigmoid":
        raise ConversionError(f"{OPERATING_POINT}: score_type must be independent_sigmoid")
    if point.get("comparison") not in ("score >= threshold", "score > threshold"):
        raise ConversionError(f"{OPERATING_POINT}: unsupported comparison {point.get('comparison')!r}")
    if tuple(point.get("labels") or ()) != labels:
        raise ConversionError(f"{OPERATING_POINT}: its labels differ from the classifier's")
    if len(point.get("thresholds") or ()) != len(labels):
        raise ConversionError(f"{OPERATING_POINT}: needs one threshold per label")
    policy = point.get("input_policy") or {}
    if policy and policy.get("strategy") not in (None, "overlapping_content_windows"):
        raise ConversionError(f"{OPERATING_POINT}: input_policy strategy {policy.get('strategy')!r} is not served")


def operating_window(point: dict[str, Any] | None) -> tuple[int, int] | None:
    """The operating point's windows: tokens per window (specials included) and content overlap."""
    policy = (point or {}).get("input_policy") or {}
    if policy.get("strategy") != "overlapping_content_windows":
        return None
    return int(policy["window_tokens_including_special_tokens"]), int(policy["overlap_content_tokens"])


def max_document_tokens(point: dict[str, Any] | None) -> int | None:
    value = ((point or {}).get("input_policy") or {}).get("max_document_tokens_including_special_tokens")
    return int(value) if value else None


def check_grounding(point: dict[str, Any], labels: tuple[str, ...]) -> None:
    """A grounding policy: ``[template, "answer"]`` with {question} and {context}, the classifier's labels."""
    pair = point.get("input_pair")
    if not (isinstance(pair, list) and len(pair) == 2 and pair[1] == "answer" and isinstance(pair[0], str)):
        raise ConversionError(f"{OPERATING_POINT}: input_pair must pair a prompt template with the answer")
    fields = {name for _, name, _, _ in string.Formatter().parse(pair[0]) if name}
    if fields != {"question", "context"}:
        raise ConversionError(f"{OPERATING_POINT}: the input_pair template must name exactly {{question}} and "
                              f"{{context}}")
    if (point.get("label2id") or {}) != {label: i for i, label in enumerate(labels)}:
        raise ConversionError(f"{OPERATING_POINT}: label2id differs from the classifier's labels")
    if point.get("answer_offsets") not in (None, "Unicode code points"):
        raise ConversionError(f"{OPERATING_POINT}: unsupported answer_offsets {point.get('answer_offsets')!r}")
    if point.get("threshold_comparison", "strictly_greater") not in ("strictly_greater", "greater_or_equal"):
        raise ConversionError(f"{OPERATING_POINT}: unsupported threshold_comparison")
    if len(labels) != 2 or "supported" not in labels:
        raise ConversionError(f"{OPERATING_POINT}: a grounded head has 'supported' and one positive label")


def positive_label(labels: tuple[str, ...]) -> int:
    """The index of a grounded head's positive label: the one that is not ``supported``, else index 1
    (LettuceDetect's hallucinated class)."""
    others = [i for i, label in enumerate(labels) if label != "supported"]
    return others[0] if len(others) == 1 else 1


def _pooled(root: Path, config: dict[str, Any]) -> Pooled:
    st = read_sentence_transformer(root)
    if st is None or st.pooling is None:
        raise ConversionError(f"{root}: modules.json declares no pooling")
    if st.dense or st.prompts:
        raise ConversionError(f"{root}: a pooled task-heads package reads no Dense modules or prompts "
                              "(convert it with --kind embedding)")
    model_config = read_json(st.transformer_dir / "config.json") if st.transformer_dir != root else config
    if set(model_config.get("architectures") or [ENCODER]) != {ENCODER}:
        raise ConversionError(f"{root}: a sentence-transformers package over {model_config.get('architectures')}, "
                              f"not {ENCODER}")
    hidden, total = int(model_config["hidden_size"]), int(model_config["num_hidden_layers"])
    contract = model_config.get("representation_contract")
    dims: tuple[int, ...] = (hidden,)
    exit_norm = "none"
    if contract is not None:
        if {k: contract.get(k) for k in EMBED_CONTRACT} != EMBED_CONTRACT or st.pooling != "mean":
            raise ConversionError(f"config.json: unsupported embedding representation_contract {contract}")
        exit_norm = str(contract.get("intermediate_normalization"))
        if exit_norm not in ("none", "final_norm"):
            raise ConversionError(f"config.json: unsupported intermediate_normalization {exit_norm!r}")
        dims = (hidden, *(d for d in MATRYOSHKA_DIMENSIONS if d < hidden))
    # the exits a package serves are the ones it ships exit graphs for (upstream reads them by name)
    exits = {int(m.group(1)) for p in (root / "onnx").glob("model_layer_*.onnx") if (m := _EXIT_GRAPH.match(p.name))}
    if any(not 1 <= layer <= total for layer in exits):
        raise ConversionError(f"{root}/onnx: an exit graph lies outside the backbone's {total} layers")
    return Pooled(st.transformer_dir, st.pooling, st.normalize, tuple(sorted({*exits, total})), dims, exit_norm,
                  st.max_seq_length)


def _relevance(root: Path, config: dict[str, Any]) -> Relevance:
    if config.get("architectures") != [ENCODER] or config.get("representation_contract") != RERANK_CONTRACT:
        raise ConversionError("config.json: unsupported reranker representation contract "
                              f"{config.get('representation_contract')}")
    layout = read_json(root / MATRYOSHKA)
    hidden, total = int(config["hidden_size"]), int(config["num_hidden_layers"])
    layers, dims = layout.get("layer_indices") or [], layout.get("dim_indices") or []
    if (layout.get("hidden_size") != hidden or layout.get("num_layers") != total
            or layout.get("pooling_strategy") != "cls" or layout.get("has_final_norm") is False
            or layout.get("representation_contract", RERANK_CONTRACT) != RERANK_CONTRACT
            or not layers or not dims or len(set(layers)) != len(layers) or len(set(dims)) != len(dims)
            or not all(1 <= layer <= total for layer in layers) or not all(2 <= d <= hidden for d in dims)):
        raise ConversionError(f"{MATRYOSHKA}: not a trained reranker exit layout this family serves")
    shapes = scorer_shapes(root / SCORERS)
    exits = tuple((layer, dim) for layer in sorted(layers) for dim in sorted(dims, reverse=True)
                  if _has_scorer(shapes, layer, dim))
    if not exits:
        raise ConversionError(f"{SCORERS}: no complete pair scorer")
    if (total, hidden) not in exits:
        raise ConversionError(f"{SCORERS}: no scorer at the full exit (layer {total}, dimension {hidden})")
    return Relevance(exits, (total, hidden))


def scorer_shapes(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Each tensor's dtype and shape from a safetensors header (read as data)."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="numpy") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            tensor = f.get_slice(name)
            out[name] = (str(tensor.get_dtype()), list(tensor.get_shape()))
    return out


def _has_scorer(shapes: dict[str, tuple[str, list[int]]], layer: int, dim: int) -> bool:
    expected = {"0.weight": [dim // 2, dim], "0.bias": [dim // 2], "3.weight": [1, dim // 2], "3.bias": [1]}
    found = {suffix: shapes.get(f"{layer}.{dim}.{suffix}") for suffix in expected}
    if all(v is None for v in found.values()):
        return False
    for suffix, shape in expected.items():
        got = found[suffix]
        if got is None or got[0] != "F32" or got[1] != shape:
            raise ConversionError(f"{SCORERS}: scorer {layer}.{dim}.{suffix} must be F32 {shape}, is {got}")
    return True


def transformers4_config(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``config`` as Transformers 4.57's ModernBertConfig reads it, and notes on what was rewritten.

    Transformers 5 writes ``rope_parameters`` per layer type (theta, and YaRN's settings, under
    ``full_attention`` and ``sliding_attention``) and ``layer_types``; 4.57 reads ``global_rope_theta``,
    ``local_rope_theta``, one ``rope_scaling`` for both types and ``global_attn_every_n_layers``, and would
    silently run a ``rope_parameters`` checkpoint without YaRN. Transformers 5 reads YaRN's ``truncate``
    from the per-type mapping's parent, where it never is, so its correction range is always truncated:
    the rewrite says ``truncate: true`` whatever the mapping holds.
    """
    params = config.get("rope_parameters")
    if params is None:
        return dict(config), []
    if not (isinstance(params, dict) and set(params) <= {"full_attention", "sliding_attention"}):
        raise ConversionError(f"config.json rope_parameters {params}: expected full_attention and "
                              "sliding_attention entries")
    full = dict(params.get("full_attention") or {"rope_type": "default"})
    local = dict(params.get("sliding_attention") or full)
    out = {k: v for k, v in config.items() if k not in ("rope_parameters", "layer_types")}
    out["global_rope_theta"] = float(full.pop("rope_theta", config.get("global_rope_theta", 160000.0)))
    out["local_rope_theta"] = float(local.pop("rope_theta", config.get("local_rope_theta", 10000.0)))
    if full != local:
        raise ConversionError(f"config.json rope_parameters scale global ({full}) and sliding ({local}) layers "
                              "differently, which Transformers 4's ModernBERT cannot express")
    notes = [f"rope_parameters rewritten as global_rope_theta {out['global_rope_theta']:g}, local_rope_theta "
             f"{out['local_rope_theta']:g}"]
    if full.get("rope_type", "default") != "default":
        out["rope_scaling"] = {**full, "truncate": True}
        notes[0] += f", rope_scaling {out['rope_scaling']}"
    types = config.get("layer_types")
    if types:
        every = next((n for n in range(1, len(types) + 1)
                      if types == ["full_attention" if i % n == 0 else "sliding_attention"
                                   for i in range(len(types))]), None)
        if every is None:
            raise ConversionError(f"config.json layer_types {types} are not one global layer every n")
        out["global_attn_every_n_layers"] = every
    return out, notes


def stamp_files(source: TaskSource) -> dict[str, str]:
    """The layout files beyond the weights and tokenizer whose bytes the package's stamp covers."""
    root = source.root
    names = [OPERATING_POINT, MATRYOSHKA, SCORERS, "config_sentence_transformers.json"]
    return {name: file_sha256(root / name) for name in names if (root / name).is_file()}
