"""Which converter kind a source directory is, read from its own files: the one table of detectors.

``export SRC`` without ``--kind`` asks :func:`detect`, which tries :data:`DETECTORS` in order and
returns the first :class:`Detection`: the kind and the files and values that decided it (printed, so
the user sees why). A detector reads JSON files and file names only (nothing is imported, loaded or
executed) and answers None when the layout is not its own. The order matters where layouts nest: an
upstream package format (Vela 2.0, Decision 2.0/3.0) before the Hugging Face layouts it also is, the
ModernBERT task-head layouts (Vela 1.0 and compatible, converted by converters/task_heads/) before the
generic encoder kinds, sentence-transformers modules before a bare architecture. ``--kind`` overrides.

Adding a layout is one function here and one row in DETECTORS.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from converters import lora
from converters import sentence_transformers as st_source
from converters.decision2 import source as decision2_source
from converters.decision3 import source as decision3_source
from converters.errors import ConversionError
from converters.vela2 import source as vela2_source


@dataclass(frozen=True)
class Detection:
    """A detected kind, and what in the source's files decided it (one line, for the user)."""

    kind: str
    reason: str


@dataclass(frozen=True)
class Source:
    """A source directory's declarations, each file read once and only when a detector asks."""

    path: Path

    def json(self, rel: str) -> Any:
        """The JSON value of ``rel`` (None when absent or unreadable: a detector then says no)."""
        p = self.path / rel
        if not p.is_file():
            return None
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None

    def has(self, rel: str) -> bool:
        return (self.path / rel).is_file()

    @cached_property
    def config(self) -> dict[str, Any]:
        cfg = self.json("config.json")
        return cfg if isinstance(cfg, dict) else {}

    @property
    def model_type(self) -> str | None:
        value = self.config.get("model_type")
        return value if isinstance(value, str) else None

    @property
    def architectures(self) -> list[str]:
        archs = self.config.get("architectures")
        return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []

    def declares(self) -> str:
        """``config.json model_type X, architectures [..], problem_type Y`` for a reason line."""
        parts = [f"model_type {self.model_type}"] if self.model_type else []
        if self.architectures:
            parts.append(f"architectures [{', '.join(self.architectures)}]")
        if self.config.get("problem_type"):
            parts.append(f"problem_type {self.config['problem_type']}")
        return "config.json " + ", ".join(parts) if parts else "config.json"


Detector = Callable[[Source], Detection | None]


def _labels(src: Source) -> list[str]:
    """``id2label`` in index order (empty when absent or not indexed by integers)."""
    id2label = src.config.get("id2label")
    if not isinstance(id2label, dict):
        return []
    try:
        return [str(v) for _, v in sorted((int(k), v) for k, v in id2label.items())]
    except ValueError:
        return []


def _upstream(module: Any, files: str) -> Detector:
    """A detector over a family's own ``detect(path) -> kind | None`` (upstream package formats)."""
    def detect(src: Source) -> Detection | None:
        kind = module.detect(src.path)
        return Detection(str(kind), f"{files} name the {kind} package format") if kind else None
    return detect


# -- ModernBERT task heads (Vela 1.0 and compatible; converters/task_heads/) --------------------------------

TASK_HEADS = "task-heads"
MODERNBERT_SEQUENCE = "ModernBertForSequenceClassification"
MODERNBERT_TOKEN = "ModernBertForTokenClassification"
MODERNBERT_MODEL = "ModernBertModel"
OPERATING_POINT = "operating_point.json"
RERANKER_FILES = ("matryoshka_config.json", "classification_heads.safetensors")
ST_POOLING = ("modules.json", "1_Pooling/config.json")


def _is_bio(labels: list[str]) -> bool:
    return any(label.startswith(("B-", "I-")) for label in labels)


def task_heads(src: Source) -> Detection | None:
    """A ModernBERT (or mmBERT) checkpoint with a task head, a sentence-transformers pooling, or the
    Matryoshka reranker's scorers: which head, from which files."""
    if src.model_type != "modernbert":
        return None
    archs = set(src.architectures)
    op = " + operating_point.json" if src.has(OPERATING_POINT) else ""
    if MODERNBERT_SEQUENCE in archs:
        problem = src.config.get("problem_type") or "single_label_classification"
        head = {"multi_label_classification": "scores"}.get(problem, "sequence")
        if head == "sequence" and "entailment" in {label.casefold() for label in _labels(src)}:
            head = "sequence (NLI labels: read text pairs)"
        return Detection(TASK_HEADS, f"head {head}: {src.declares()}{op}")
    if MODERNBERT_TOKEN in archs:
        point = src.json(OPERATING_POINT)
        if isinstance(point, dict) and "input_pair" in point:
            head = "grounded (operating_point.json input_pair)"
        elif _is_bio(_labels(src)):
            head = "token (BIO labels)"
        else:
            head = f"grounded (labels {_labels(src)} are not BIO: runs of the positive label)"
        return Detection(TASK_HEADS, f"head {head}: {src.declares()}{op}")
    if all(src.has(f) for f in RERANKER_FILES):
        return Detection(TASK_HEADS, f"head relevance: {src.declares()} + {' + '.join(RERANKER_FILES)}")
    if all(src.has(f) for f in ST_POOLING) and archs <= {MODERNBERT_MODEL}:
        contract = " + representation_contract" if "representation_contract" in src.config else ""
        return Detection(TASK_HEADS, f"head pooled: {src.declares()}{contract} + modules.json + 1_Pooling")
    return None


# -- Hugging Face encoders (converters/encoder/) ------------------------------------------------------------

def sentence_transformers(src: Source) -> Detection | None:
    """A sentence-transformers package that pools (Qwen3-Embedding, EmbeddingGemma, MiniLM, ...): an
    embedding, whatever backbone the encoder converter exports."""
    if st_source.detect(src.path) is None:
        return None
    return Detection("embedding", f"modules.json lists a Pooling module over {src.declares()}")


def lora_adapter(src: Source) -> Detection | None:
    """A PEFT LoRA adapter directory: the kind its task_type names (the base is read from its config)."""
    task = lora.task_type(src.path)  # adapter_config.json, read once
    kind = None if task is None else lora.TASK_KINDS.get(task)
    return Detection(kind, f"adapter_config.json: a PEFT LoRA adapter, task_type {task}") if kind else None


def encoder_head(src: Source) -> Detection | None:
    """A Transformers encoder by its architecture: its task head names the kind."""
    for arch in src.architectures:
        if arch.endswith("ForSequenceClassification"):
            if int(src.config.get("num_labels") or len(_labels(src)) or 0) == 1:
                return Detection("rerank", f"one output logit (a cross-encoder): {src.declares()}")
            if src.config.get("problem_type") == "multi_label_classification":
                return Detection("multi-label", src.declares())
            return Detection("sequence-classification", src.declares())
        if arch.endswith("ForTokenClassification"):
            return Detection("token-classification", src.declares())
    return None


def encoder_model(src: Source) -> Detection | None:
    """A bare encoder (``BertModel``, ``XLMRobertaModel``, ...): an embedding, mean-pooled unless told."""
    encoders = ("BertModel", "XLMRobertaModel", "RobertaModel", "DebertaV2Model", "DistilBertModel",
                "MPNetModel", "ModernBertModel", "NomicBertModel")
    if any(a in encoders for a in src.architectures):
        return Detection("embedding", f"a bare encoder: {src.declares()}")
    return None


def multimodal(src: Source) -> Detection | None:
    """Dual encoders and audio towers by model_type (converters/multimodal/)."""
    kind = {"siglip": "image-text-embedding", "clip": "image-text-embedding", "whisper": "audio-embedding",
            "clap": "audio-embedding"}.get(src.model_type or "")
    return Detection(kind, src.declares()) if kind else None


#: Every detector, in the order they are asked (the first answer wins): (name, detector).
DETECTORS: tuple[tuple[str, Detector], ...] = (
    ("vela2", _upstream(vela2_source, "config.json format_version and model_type")),
    ("decision2", _upstream(decision2_source, "config.json's pointer fields")),
    ("decision3", _upstream(decision3_source, "decision_config.json format_id and prompt")),
    ("lora", lora_adapter),
    ("task-heads", task_heads),
    ("sentence-transformers", sentence_transformers),
    ("encoder-head", encoder_head),
    ("encoder-model", encoder_model),
    ("multimodal", multimodal),
)


def detect(path: Path) -> Detection:
    """The kind of the source at ``path``; ConversionError when no detector recognises it."""
    src = Source(Path(path))
    for _, detector in DETECTORS:
        found = detector(src)
        if found is not None:
            return found
    declared = src.declares() if src.config else "no config.json"
    raise ConversionError(f"{path}: --kind is required ({declared}: no layout this converter detects)")
