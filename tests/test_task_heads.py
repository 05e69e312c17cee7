"""The task-heads family against Transformers, layout by layout (issue 37 items 3, 4 and 9).

Every catalogue layout (converters/task_heads/fixture.py: Vela 1.0 Domain, Hazard, PII, Halu, Embedding and
Reranker, an mmBERT merged classifier in Transformers 5's config spelling, LettuceDetect and a ModernBERT
NLI classifier) is converted without ``--kind`` and served by the family; each answer is compared with
Transformers (or sentence-transformers) reading the source itself, in fp32: probabilities within 1e-5,
vectors with cosine >= 0.99999. Where the Router's runtime has a rule (window placement, operating-point
thresholds, BIO and grounded span rules), the reference here applies that rule to Transformers' outputs.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.detect import detect
from converters.errors import ConversionError
from edge_runtime.engine.session import create_session
from edge_runtime.families.registry import read_package
from edge_runtime.families.task_heads.family import TaskHeadsFamily
from edge_runtime.heads.tokens import WHITESPACE, decode_bio, positive_runs
from edge_runtime.requests.encoder import parse_classify, parse_embeddings, parse_rerank
from edge_runtime.text.windows import window_starts
from tests.support.d3_models import needs_reference, reference_environment

PROBABILITY = 1e-5
COSINE = 0.99999
TEXTS = ["My name is Tom Baker and my email is tom.baker@example.com.", "Hello world.",
         "Meine Telefonnummer ist 030 1234567 und ich wohne in Berlin. 中文 🚀",
         "The contract ends on 31 December 2025 unless either party renews it."]
#: about 300 content tokens with the fixtures' tokenizer: several of Hazard's 64-token windows
LONG = " ".join(["The patient reported mild headaches and occasional dizziness after the trip to Lyon."] * 12)
GROUNDED = [{"context": "The Eiffel Tower is in Paris and was completed in 1889.",
             "question": "When was the Eiffel Tower completed?", "answer": "It was completed in 1889 in Rome."},
            {"context": "Water boils at 100 degrees Celsius at sea level.",
             "answer": "Water boils at 90 degrees,   and freezes at 0. 中文 🚀"}]


def served(path: Path) -> TaskHeadsFamily:
    package = read_package(path)
    return TaskHeadsFamily(package, create_session(package.graph("fp32"), "cpu", 1))


def answer(family: TaskHeadsFamily, surface: str, body: dict[str, Any]) -> dict[str, Any]:
    parse = {"classify": parse_classify, "embeddings": parse_embeddings, "rerank": parse_rerank}[surface]
    plan = family.plan(surface, parse(body, 2048))
    return plan.finish(family.forward(plan.rows) if plan.rows else [])


def hf(src: Path, cls_name: str) -> Any:
    """Transformers reading the source on its own (SDPA, fp32)."""
    import transformers

    return getattr(transformers, cls_name).from_pretrained(src, attn_implementation="sdpa").eval()


def tokenizer(src: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(src / "tokenizer.json"))


def logits(model: Any, ids: list[int], **extra: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), **extra)


@pytest.fixture(scope="module")
def layout(fixture_package: Callable[..., Path]) -> Callable[[str], tuple[Path, TaskHeadsFamily]]:
    """``layout(name)`` -> (its source, the family serving its package)."""
    cache: dict[str, tuple[Path, TaskHeadsFamily]] = {}

    def get(name: str) -> tuple[Path, TaskHeadsFamily]:
        if name not in cache:
            cache[name] = fixture_package(f"task-{name}-source"), served(fixture_package(f"task-{name}"))
        return cache[name]

    return get


# -- detection and conversion ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, head", [
    ("domain", "head sequence"), ("hazard", "head scores"), ("pii", "head token (BIO"),
    ("halu", "head grounded (operating_point.json input_pair)"), ("embedding", "head pooled"),
    ("reranker", "head relevance"), ("mmbert-merged", "head sequence"), ("lettucedetect", "head grounded (labels"),
    ("nli", "head sequence (NLI"),
])
def test_every_layout_is_detected(fixture_package: Callable[..., Path], name: str, head: str) -> None:
    found = detect(fixture_package(f"task-{name}-source"))
    assert found.kind == "task-heads" and found.reason.startswith(head), found


def test_export_without_kind_prints_the_choice(fixture_package: Callable[..., Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from converters.__main__ import main

    assert main(["export", str(fixture_package("task-hazard-source")), "--out", str(tmp_path / "pkg")]) == 0
    err = capsys.readouterr().err
    assert "detected --kind task-heads: head scores: config.json model_type modernbert" in err
    card = read_package(tmp_path / "pkg").card
    assert card.kind == "task-scores" and card.head["window"] == {"tokens": 64, "overlap": 16, "placement": "stride"}


def test_the_reranker_as_a_classifier_is_refused(fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    """The catalogue's case: converted as sequence-classification, its classifier would be random."""
    from converters.encoder.export import ExportOptions, export_model

    with pytest.raises(ConversionError, match=r"classifier\.bias, classifier\.weight, head\.dense\.weight"):
        export_model(fixture_package("task-reranker-source"), tmp_path / "out",
                     ExportOptions(kind="sequence-classification"))


def test_graphs_are_batch_invariant(layout: Callable[[str], tuple[Path, TaskHeadsFamily]]) -> None:
    """What the family reads from the graph is the same alone and right-padded (pooling runs in numpy)."""
    from edge_runtime.engine.probe import probe

    for name in ("domain", "reranker"):
        family = layout(name)[1]
        assert probe(family.forward, family.probe_row).grouping == "padded", name


def test_the_graph_ships_with_its_static_shapes_folded(fixture_package: Callable[..., Path]) -> None:
    """ModernBERT's shape arithmetic (rotary halves, attention scale, MLP chunk, QKV reshape) is constants in
    the shipped graph, proven bit-identical to the export at conversion (converters.static_dims)."""
    import onnx

    path = fixture_package("task-domain")
    folding = json.loads((path / "card.json").read_text())["verification"]["shape_folding"]
    assert folding["static_dims"] > 0 and folding["bit_identical_forwards"] > 0 and folding["threads"] == [1, 2]
    ops = [n.op_type for n in onnx.load(str(path / "model.onnx")).graph.node]
    assert ops.count("Shape") < ops.count("LayerNormalization")  # the export has three a LayerNormalization
    # and its rotary embedding runs as one kernel for Q and one for K a layer (converters.rotary)
    rotary = json.loads((path / "card.json").read_text())["verification"]["rotary_fusion"]
    assert rotary["rotations"] == ops.count("RotaryEmbedding") == 2 * ops.count("Softmax") > 0
    assert rotary["max_abs_diff"] <= 1e-4 and "Neg" not in ops


# -- classifiers ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["domain", "nli"])
def test_sequence_head_matches_transformers(layout: Callable[[str], tuple[Path, TaskHeadsFamily]], name: str) -> None:
    import torch

    src, family = layout(name)
    model, tok = hf(src, "AutoModelForSequenceClassification"), tokenizer(src)
    items: list[Any] = TEXTS if name == "domain" else [{"text": a, "text_pair": b} for a, b in zip(TEXTS, TEXTS[1:])]
    body = answer(family, "classify", {"input": items})
    assert body["kind"] == "sequence" and body["labels"] == list(model.config.id2label.values())
    for item, result in zip(items, body["results"]):
        ids = tok.encode(item["text"], item["text_pair"]).ids if isinstance(item, dict) else tok.encode(item).ids
        want = torch.softmax(logits(model, ids).logits[0].double(), -1).numpy()
        assert np.abs(np.array(result["probabilities"]) - want).max() < PROBABILITY
        assert result["label"] == body["labels"][int(want.argmax())]


def _reference_windows(n: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """The Router's runtime's windows (text/windows.py plan_windows): stride steps, the last one short."""
    width, out, start = size - 2, [], 0
    while True:
        end = min(start + width, n)
        out.append((start, end))
        if end == n:
            return out
        start += width - overlap


def test_scores_head_reads_its_operating_point(layout: Callable[[str], tuple[Path, TaskHeadsFamily]]) -> None:
    """Hazard: every input in the operating point's windows (placed as upstream places them), per-label
    maximum, labels selected at its thresholds with its comparison."""
    import torch

    src, family = layout("hazard")
    point = json.loads((src / "operating_point.json").read_text())
    model, tok = hf(src, "AutoModelForSequenceClassification"), tokenizer(src)
    body = answer(family, "classify", {"input": [LONG, TEXTS[1]]})
    assert body["thresholds"] == point["thresholds"]
    bos, eos = tok.token_to_id("<bos>"), tok.token_to_id("<eos>")
    for text, result in zip([LONG, TEXTS[1]], body["results"]):
        content = tok.encode(text, add_special_tokens=False).ids
        windows = _reference_windows(len(content), 64, 16)
        assert [(w["start"], w["end"]) for w in result["windows"]] == windows
        per_window = [torch.sigmoid(logits(model, [bos, *content[a:b], eos]).logits[0].double()).numpy()
                      for a, b in windows]
        for got, want in zip(result["windows"], per_window):
            assert np.abs(np.array(got["scores"]) - want).max() < PROBABILITY
        reduced = np.max(per_window, axis=0)
        assert np.abs(np.array(result["scores"]) - reduced).max() < PROBABILITY
        assert result["selected"] == [lab for lab, s, t in zip(body["labels"], reduced, point["thresholds"]) if s >= t]
        assert result["input"] == {"tokens": len(content) + 2, "processed_tokens": len(content) + 2,
                                   "truncated": False, "windows": len(windows)}
    assert len(body["results"][0]["windows"]) > 3


def _bio_reference(text: str, offsets: list[tuple[int, int]], probs: np.ndarray, labels: list[str]) -> list[tuple]:
    """The Router's BIO rule: first argmax; B- opens, I- continues its own entity or opens; mean probability;
    trimmed of Unicode whitespace unless all whitespace."""
    entities: list[list[Any]] = []
    current: list[Any] | None = None
    for (start, end), row in zip(offsets, probs):
        if (start, end) == (0, 0):
            continue
        tag = labels[int(row.argmax())]
        kind = tag[2:] if tag[:2] in ("B-", "I-") else None
        if tag.startswith("I-") and current is not None and current[0] == kind:
            current[2], current[3] = end, current[3] + [float(row.max())]
            continue
        if current is not None:
            entities.append(current)
        current = [kind, start, end, [float(row.max())]] if kind else None
    if current is not None:
        entities.append(current)
    spans = []
    for kind, start, end, ps in entities:
        piece = text[start:end]
        if piece.strip(WHITESPACE):
            lead, trail = len(piece) - len(piece.lstrip(WHITESPACE)), len(piece) - len(piece.rstrip(WHITESPACE))
            start, end = start + lead, end - trail
        spans.append((kind, start, end, float(np.mean(ps))))
    return spans


def test_token_head_spans_match_transformers(layout: Callable[[str], tuple[Path, TaskHeadsFamily]]) -> None:
    import torch

    src, family = layout("pii")
    model, tok = hf(src, "AutoModelForTokenClassification"), tokenizer(src)
    labels = list(model.config.id2label.values())
    body = answer(family, "classify", {"input": TEXTS})
    assert sum(len(r["spans"]) for r in body["results"]) > 5  # random weights label much of the text
    for text, result in zip(TEXTS, body["results"]):
        enc = tok.encode(text)
        probs = torch.softmax(logits(model, enc.ids).logits[0].double(), -1).numpy()
        content = [i for i, s in enumerate(enc.sequence_ids) if s == 0]
        want = _bio_reference(text, [enc.offsets[i] for i in content], probs[content], labels)
        got = [(s["label"], s["start"], s["end"], s["probability"]) for s in result["spans"]]
        assert [g[:3] for g in got] == [w[:3] for w in want]
        assert all(abs(g[3] - w[3]) < PROBABILITY for g, w in zip(got, want))
        assert all(s["text"] == text[s["start"]:s["end"]] for s in result["spans"])


def test_token_windows_merge_per_token(layout: Callable[[str], tuple[Path, TaskHeadsFamily]]) -> None:
    """A windowed token read takes each token from the window giving it the most context (earlier on ties)."""
    family = layout("pii")[1]
    whole = answer(family, "classify", {"input": [LONG]})["results"][0]
    windowed = answer(family, "classify", {"input": [LONG], "options": {"overflow": "window",
                                                                        "window": {"tokens": 64, "overlap": 24}}})
    result = windowed["results"][0]
    assert result["input"]["windows"] > 3 and [w["start"] for w in result["windows"]][:3] == [0, 38, 76]
    # with 12 tokens of context either side the merged spans are close to the whole read's, not equal
    agree = {(s["start"], s["label"]) for s in result["spans"]} & {(s["start"], s["label"]) for s in whole["spans"]}
    assert len(agree) > 0.5 * len(whole["spans"])


def _runs_reference(offsets: list[tuple[int, int]], positive: np.ndarray, threshold: float) -> list[tuple]:
    spans, run = [], None
    for (start, end), p in zip(offsets, positive):
        if end <= start:
            continue
        if p > threshold:
            run = [start, end, p] if run is None else [run[0], max(run[1], end), max(run[2], p)]
        elif run is not None:
            spans.append(tuple(run))
            run = None
    return spans + ([tuple(run)] if run is not None else [])


@pytest.mark.parametrize("name, template", [
    ("halu", "User request: {question}\n\n{context}"),  # the operating point's input_pair
    ("lettucedetect", "User request: {question}\n\n{context}"),  # the default for a package without one
])
def test_grounded_head_matches_transformers(layout: Callable[[str], tuple[Path, TaskHeadsFamily]], name: str,
                                           template: str) -> None:
    import torch

    src, family = layout(name)
    model, tok = hf(src, "AutoModelForTokenClassification"), tokenizer(src)
    labels = list(model.config.id2label.values())
    assert family.describe()["heads"][0]["inputs"] == ["grounded"]
    body = answer(family, "classify", {"input": GROUNDED})
    assert body["kind"] == "token"
    found = 0
    for item, result in zip(GROUNDED, body["results"]):
        prompt = template.format(question=item.get("question", ""), context=item["context"])
        enc = tok.encode(prompt, item["answer"])
        probs = torch.softmax(logits(model, enc.ids).logits[0].double(), -1).numpy()
        answer_tokens = [i for i, s in enumerate(enc.sequence_ids) if s == 1]
        want = _runs_reference([enc.offsets[i] for i in answer_tokens], probs[answer_tokens, 1], 0.5)
        got = [(s["start"], s["end"], s["probability"]) for s in result["spans"]]
        assert [g[:2] for g in got] == [w[:2] for w in want]
        assert all(abs(g[2] - w[2]) < PROBABILITY for g, w in zip(got, want))
        assert all(s["label"] == labels[1] and s["text"] == item["answer"][s["start"]:s["end"]]
                   for s in result["spans"])
        found += len(got)
    assert found > 0
    stricter = answer(family, "classify", {"input": GROUNDED, "options": {"threshold": 0.9}})
    assert sum(len(r["spans"]) for r in stricter["results"]) <= found


def test_grounded_inputs_only_and_no_windows(layout: Callable[[str], tuple[Path, TaskHeadsFamily]]) -> None:
    from edge_runtime.errors import ApiError

    family = layout("halu")[1]
    with pytest.raises(ApiError, match="reads grounded inputs"):
        answer(family, "classify", {"input": ["plain text"]})
    with pytest.raises(ApiError, match="not read in windows"):
        answer(family, "classify", {"input": GROUNDED, "options": {"overflow": "window"}})
    # truncate cuts the prompt, never the answer (the tokenizers library's only_first)
    long = {**GROUNDED[0], "context": LONG * 3}
    cut = answer(family, "classify", {"input": [long], "options": {"overflow": "truncate", "max_tokens": 64}})
    assert cut["results"][0]["input"]["truncated"] and cut["results"][0]["input"]["processed_tokens"] == 64
    refused = answer(family, "classify", {"input": [long], "options": {"max_tokens": 64}})
    assert refused["results"][0]["error"] == "max_length_exceeded"


# -- mmBERT's YaRN in Transformers 5's spelling ----------------------------------------------------------------

_TRANSFORMERS5 = """
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1], attn_implementation="sdpa").eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
out = []
for text in json.loads(sys.argv[2]):
    with torch.no_grad():
        out.append(torch.softmax(model(**tok(text, return_tensors="pt")).logits[0].double(), -1).tolist())
print(json.dumps(out))
"""


@needs_reference
def test_rope_parameters_match_transformers5(layout: Callable[[str], tuple[Path, TaskHeadsFamily]]) -> None:
    """The merged classifier's config is spelled as Transformers 5 writes it (rope_parameters, layer_types):
    the package answers as Transformers 5 reads that config, YaRN included."""
    src, family = layout("mmbert-merged")
    assert "rope_parameters" in json.loads((src / "config.json").read_text())
    out = subprocess.run([str(reference_environment()), "-c", _TRANSFORMERS5, str(src), json.dumps(TEXTS)],
                         capture_output=True, text=True, timeout=300, check=True)
    want = np.array(json.loads(out.stdout.strip().splitlines()[-1]))
    got = np.array([r["probabilities"] for r in answer(family, "classify", {"input": TEXTS})["results"]])
    assert np.abs(got - want).max() < PROBABILITY


def test_yarn_is_applied(layout: Callable[[str], tuple[Path, TaskHeadsFamily]], tmp_path: Path) -> None:
    """Dropping YaRN changes the answers, so the parity above would catch a loader that ignored it; the
    converter loads with SDPA (FlashAttention 2 drops rope_scaling)."""
    import shutil

    import torch

    from converters.task_heads.export import _load
    from converters.task_heads.source import read_source

    src, family = layout("domain")
    plain = tmp_path / "plain"
    shutil.copytree(src, plain)
    config = json.loads((plain / "config.json").read_text())
    config.pop("rope_scaling")
    (plain / "config.json").write_text(json.dumps(config))
    model = _load(read_source(plain))
    assert model.config._attn_implementation == "sdpa"
    ids = tokenizer(src).encode(TEXTS[0]).ids
    without = torch.softmax(logits(model, ids).logits[0].double(), -1).numpy()
    got = np.array(answer(family, "classify", {"input": TEXTS[:1]})["results"][0]["probabilities"])
    assert np.abs(got - without).max() > 1e-4


# -- embedder and reranker -------------------------------------------------------------------------------------

def test_pooled_head_matches_sentence_transformers(layout: Callable[[str], tuple[Path, TaskHeadsFamily]]) -> None:
    """Vela Embedding: the last layer against sentence-transformers' own encode; the raw exits (its contract)
    against Transformers' hidden states, mean-pooled, each Matryoshka size truncated before L2."""
    from sentence_transformers import SentenceTransformer

    src, family = layout("embedding")
    card = family.describe()["embedding"]
    assert card["layers"] == [1, 2, 4] and card["dimensions"] == [64] and card["pooling"] == "mean"
    st = SentenceTransformer(str(src), device="cpu")
    want = st.encode(TEXTS, normalize_embeddings=True)
    got = np.array([d["embedding"] for d in answer(family, "embeddings", {"input": TEXTS})["data"]])
    assert (got * want).sum(axis=1).min() >= COSINE
    model, tok = hf(src, "AutoModel"), tokenizer(src)
    for layer in (1, 2):
        body = answer(family, "embeddings", {"input": TEXTS, "layer": layer})
        for text, item in zip(TEXTS, body["data"]):
            states = logits(model, tok.encode(text).ids, output_hidden_states=True).hidden_states[layer][0]
            ref = states.mean(0).numpy()
            assert float(np.dot(item["embedding"], ref / np.linalg.norm(ref))) >= COSINE


def test_relevance_head_scores_every_exit_from_one_forward(
        layout: Callable[[str], tuple[Path, TaskHeadsFamily]]) -> None:
    import torch
    from safetensors.torch import load_file

    src, family = layout("reranker")
    card = family.describe()["rerank"]
    assert card["default"] == {"layer": 4, "dimension": 64} and len(card["exits"]) == 4
    model, tok = hf(src, "AutoModel"), tokenizer(src)
    scorers = load_file(str(src / "classification_heads.safetensors"))
    query, docs = "How do I reset my password?", ["Open Settings, then Security.", "Closed on Sunday.", "東京 🚀"]
    for exit_ in card["exits"]:
        layer, dim = exit_["layer"], exit_["dimension"]
        body = answer(family, "rerank", {"query": query, "documents": docs, "layer": layer, "dimensions": dim})
        want = {}
        for i, doc in enumerate(docs):
            states = logits(model, tok.encode(query, doc).ids, output_hidden_states=True).hidden_states[layer]
            cls = model.final_norm(states)[0, 0, :dim]
            w = {k: scorers[f"{layer}.{dim}.{k}"] for k in ("0.weight", "0.bias", "3.weight", "3.bias")}
            with torch.no_grad():
                want[i] = float(torch.sigmoid(torch.nn.functional.gelu(cls @ w["0.weight"].T + w["0.bias"])
                                              @ w["3.weight"].T + w["3.bias"])[0])
        assert [r["index"] for r in body["results"]] == sorted(want, key=lambda i: (-want[i], i))
        assert all(abs(r["relevance_score"] - want[r["index"]]) < PROBABILITY for r in body["results"])


# -- the span rules themselves ---------------------------------------------------------------------------------

def test_whitespace_spans_are_kept_as_the_router_keeps_them() -> None:
    text = "a \u2003 b\x1cc"
    labels = ["O", "B-X", "I-X"]
    offsets = np.array([[0, 1], [1, 4], [4, 5], [5, 7]])
    # a, then a span of whitespace only, then O, then U+001C plus c
    probs = np.array([[0.1, 0.8, 0.1], [0.1, 0.7, 0.2], [0.9, 0.05, 0.05], [0.1, 0.8, 0.1]])
    spans = decode_bio(probs, offsets, labels, text)
    # the whitespace span is kept untrimmed (the Router's decoders keep it); U+001C is no whitespace to the
    # Router (Rust's char::is_whitespace) though Python's isspace says it is, so it stays in the last span
    assert [(s.start, s.end, s.text) for s in spans] == [(0, 1, "a"), (1, 4, " \u2003 "), (5, 7, "\x1cc")]
    # a span with text in it is trimmed of its whitespace
    probs[2] = [0.1, 0.2, 0.7]
    assert [(s.start, s.end) for s in decode_bio(probs, offsets, labels, text)] == [(0, 1), (4, 5), (5, 7)]


def test_positive_runs() -> None:
    offsets = np.array([[0, 2], [2, 2], [3, 5], [5, 8], [9, 10]])
    p = np.array([0.6, 0.01, 0.9, 0.4, 0.5])
    spans = positive_runs(p, offsets, "ab cdefg h", "hallucinated", lambda x: x > 0.5)
    assert [(s.start, s.end, s.probability) for s in spans] == [(0, 5, 0.9)]
    spans = positive_runs(p, offsets, "ab cdefg h", "hallucinated", lambda x: x >= 0.5)
    assert [(s.start, s.end) for s in spans] == [(0, 5), (9, 10)]


def test_window_placements() -> None:
    assert window_starts(30, 10, 2, "stride") == [0, 8, 16, 24]
    assert window_starts(30, 10, 2) == [0, 8, 16, 20]
    for n in range(1, 80):
        starts = window_starts(n, 10, 3, "stride")
        assert [(s, min(s + 10, n)) for s in starts] == [(a, b) for a, b in _reference_windows(n, 12, 3)]


# -- the exact int8 (issue 37 item 8) ---------------------------------------------------------------------------

def served_int8(path: Path) -> TaskHeadsFamily:
    package = read_package(path)
    return TaskHeadsFamily(package, create_session(package.graph("int8"), "cpu", 1))


@pytest.mark.parametrize("name, metric", [("domain", "probability"), ("hazard", "probability"),
                                          ("pii", "probability"), ("halu", "probability"), ("embedding", "cosine"),
                                          ("reranker", "relevance")])
def test_every_head_gets_the_exact_int8_with_its_agreement_and_products(fixture_package: Callable[..., Path],
                                                                      name: str, metric: str) -> None:
    card = read_package(fixture_package(f"task-{name}")).card.raw
    int8 = card["variants"]["int8"]
    assert int8["quantization"] == "per-token" and int8["numerics"] == "exact"
    assert int8["recipe"]["smooth_alpha"] > 0 and int8["recipe"]["fp32_outlier_channels"] > 0
    agreement = int8["agreement"]
    assert agreement["metric"] == metric and agreement["cases"] >= 99 and "STS Benchmark" in agreement["corpus"]
    if name in ("hazard", "halu"):  # thresholded heads also state how often their decisions agree
        assert 0 <= agreement["selection_agreement"] <= 1
    products = card["verification"]["integer_products"]
    assert products["gemms"] > 0 and products["rows"] >= 4 and products["max_relative_error"] < 1e-6
    assert int8["measured_on"]["model"]


def test_the_int8_graph_is_batch_invariant_and_its_products_exact_on_mixed_lengths(
        fixture_package: Callable[..., Path]) -> None:
    from converters.quantize import Int8Recipe, check_integer_products_on
    from converters.verify import pad_batch
    from edge_runtime.engine.probe import probe

    for name in ("domain", "pii", "reranker"):
        family = served_int8(fixture_package(f"task-{name}"))
        assert probe(family.forward, family.probe_row).grouping == "padded", name
    path = fixture_package("task-domain")
    card = read_package(path).card.raw
    tok = tokenizer(path)
    rows = [{"input_ids": np.asarray(tok.encode(t).ids, np.int64)} for t in [*TEXTS, LONG]]
    for row in rows:
        row["attention_mask"] = np.ones_like(row["input_ids"])
    checked = check_integer_products_on(path / "model.int8.onnx", pad_batch(rows, ["input_ids", "attention_mask"], 0),
                                        Int8Recipe.from_card(card["variants"]["int8"]["recipe"]))
    assert checked["rows"] == len(rows) and checked["max_relative_error"] < 1e-6


def test_the_cards_int8_agreement_is_what_the_family_serves(fixture_package: Callable[..., Path]) -> None:
    """The card's max |dp| on the real sentences, recomputed through the family as the server reads both."""
    from converters.quantize import real_sentences
    from converters.task_heads.verify import AGREEMENT_STRIDE

    path = fixture_package("task-domain")
    card = read_package(path).card.raw
    texts = real_sentences()[::AGREEMENT_STRIDE]
    got = {}
    for variant, family in (("fp32", served(path)), ("int8", served_int8(path))):
        got[variant] = np.array([answer(family, "classify", {"input": [t]})["results"][0]["probabilities"]
                                 for t in texts])
    stated = card["variants"]["int8"]["agreement"]
    assert abs(float(np.abs(got["fp32"] - got["int8"]).max()) - stated["max_abs_dp"]) < 2e-6
    top = float(np.mean(got["fp32"].argmax(1) == got["int8"].argmax(1)))
    assert abs(top - stated["top_label_agreement"]) < 1e-6


def test_quantize_none_writes_fp32_only(fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    from converters.__main__ import main

    assert main(["export", str(fixture_package("task-guard-source")), "--out", str(tmp_path / "pkg"),
                 "--quantize", "none"]) == 0
    card = read_package(tmp_path / "pkg").card.raw
    assert list(card["variants"]) == ["fp32"] and "integer_products" not in card["verification"]
