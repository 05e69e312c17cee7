"""Parity of a task package with Transformers: the graph's outputs, then the head's readout as the server
reads it (the family's own numpy readouts) against the checkpoint's own head in PyTorch.

Rows of spread lengths run alone and right-padded in batches of four. The graph must match the traced
module within :data:`GRAPH_TOLERANCE` on every output at real tokens; the readout must match the
Transformers model within :data:`READOUT_TOLERANCE`: probabilities (sequence, scores, per-token and pair
scores) within 1e-5, embeddings with cosine at least 0.99999 (the final layer against
sentence-transformers itself). An export above either is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from converters.errors import ConversionError
from converters.quantize import probability_agreement, real_sentences
from converters.samples import SAMPLE_PAIRS, SAMPLE_TEXTS
from converters.task_heads.source import TaskSource
from converters.verify import create_session, pad_batch
from edge_runtime.families.task_heads.readout import classifier_logits, relevance_logit
from edge_runtime.heads.activations import sigmoid, softmax
from edge_runtime.heads.pooling import embed
from edge_runtime.packages.golden import npz_bytes

GRAPH_TOLERANCE = 1e-4
READOUT_TOLERANCE = {"probability": 1e-5, "cosine": 1e-5}
#: the longest parity row by default: past the local window and several global layers, short enough for a
#: 307M model (fixtures, whose local window is 8 tokens, check shorter rows)
LONGEST_ROW = 1024
GOLDEN_ROWS, GOLDEN_MAX_TOKENS = 3, 64
GROUNDED_SAMPLES = (
    {"context": "The Eiffel Tower is in Paris and was completed in 1889.",
     "question": "When was the Eiffel Tower completed?", "answer": "It was completed in 1889 in Rome."},
    {"context": "Hello world.", "question": "", "answer": "Hello  there."},
    {"context": "Water boils at 100 degrees Celsius at sea level.", "question": "",
     "answer": "Water boils at 90 degrees at sea level, and   freezes at 0."},
    {"context": " ".join(SAMPLE_TEXTS[:20]), "question": "What happened to the train to Lyon?",
     "answer": "Le train de 8 h 15 pour Lyon est annulé. 我的订单还没有发货 🚀"},
)
Row = dict[str, np.ndarray]

__all__ = ["GRAPH_TOLERANCE", "READOUT_TOLERANCE", "Parity", "agreement_items", "check_parity", "create_session",
           "goldens", "int8_agreement", "npz_bytes", "samples", "served_readout", "tokenized_rows"]


def samples(head: str) -> list[Any]:
    """The parity inputs of a head: texts, (query, document) pairs, or grounded items; one long."""
    if head == "relevance":
        return [*SAMPLE_PAIRS, ("Summarise the following passages.", " ".join(SAMPLE_TEXTS))]
    if head == "grounded":
        return list(GROUNDED_SAMPLES)
    return [*SAMPLE_TEXTS, " ".join(SAMPLE_TEXTS)]


def tokenized_rows(tokenizer: Any, items: Sequence[Any], head: Mapping[str, Any], max_tokens: int) -> list[Row]:
    """``items`` (texts, pairs or grounded items) tokenized as the family frames them, at most ``max_tokens``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.enable_truncation(max_tokens)
    rows = []
    for item in items:
        if isinstance(item, dict):
            prompt = head["input_pair"][0].format(question=item["question"], context=item["context"])
            enc = tok.encode(prompt, item["answer"])
        else:
            enc = tok.encode(*item) if isinstance(item, tuple) else tok.encode(item)
        rows.append({"input_ids": np.asarray(enc.ids, dtype=np.int64),
                     "attention_mask": np.ones(len(enc.ids), dtype=np.int64),
                     "sequence_ids": np.asarray([-1 if s is None else s for s in enc.sequence_ids])})
    return rows


def _spread(rows: Sequence[Row], n: int, max_len: int | None = None) -> list[Row]:
    """``n`` rows whose lengths spread from the shortest to the longest (at most ``max_len`` where any is)."""
    pool = sorted(rows, key=lambda r: len(r["input_ids"]))
    pool = [r for r in pool if max_len is None or len(r["input_ids"]) <= max_len] or pool[:n]
    if len(pool) <= n:
        return pool
    return [pool[i] for i in sorted({round(i * (len(pool) - 1) / (n - 1)) for i in range(n)})]


@dataclass
class Parity:
    """What the parity check measured."""

    graph_max_abs_diff: float
    metric: str  # probability | cosine
    readout: float  # the largest probability difference, or 1 - the least cosine
    cases: int
    lengths: list[int]
    golden_rows: list[Row] = field(default_factory=list)


def _torch_readout(source: TaskSource, model: Any, feeds: dict[str, np.ndarray], head: Mapping[str, Any],
                   layers: Sequence[int]) -> list[Any]:
    """The Transformers model's own answer per row: probabilities, pooled vectors per exit, or relevance."""
    import torch

    ids, mask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])
    with torch.no_grad():
        if source.head in ("sequence", "scores", "token", "grounded"):
            logits = model(input_ids=ids, attention_mask=mask).logits.double()
            probs = torch.sigmoid(logits) if source.head == "scores" else torch.softmax(logits, dim=-1)
            return list(probs.numpy())
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        total = int(model.config.num_hidden_layers)
        if source.head == "relevance":
            from safetensors.torch import load_file

            scorers = load_file(str(source.root / "classification_heads.safetensors"))
            rows = []
            for b in range(ids.shape[0]):
                values = {}
                for exit_ in head["exits"]:
                    layer, dim = exit_["layer"], exit_["dimension"]
                    cls = model.final_norm(out.hidden_states[layer][b, 0])[:dim]
                    w = {k: scorers[f"{layer}.{dim}.{k}"] for k in ("0.weight", "0.bias", "3.weight", "3.bias")}
                    h = torch.nn.functional.gelu(cls @ w["0.weight"].T + w["0.bias"])
                    values[(layer, dim)] = float(torch.sigmoid(h @ w["3.weight"].T + w["3.bias"])[0])
                rows.append(values)
            return rows
        norm = head["exit_normalization"] == "final_norm"
        vectors = []
        for b in range(ids.shape[0]):
            n = int(mask[b].sum())
            per_layer = {}
            for layer in layers:
                states = out.last_hidden_state if layer == total else out.hidden_states[layer]
                states = model.final_norm(states) if norm and layer < total else states
                per_layer[layer] = states[b, :n].float().mean(0).numpy()
            vectors.append(per_layer)
        return vectors


def served_readout(kind: str, head: Mapping[str, Any], weights: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
                   b: int, n: int, layers: Sequence[int]) -> Any:
    """Row ``b`` (``n`` real tokens) of a batch's graph outputs read as the family reads them: probabilities
    (one row, or one per token), sigmoid relevance per (layer, dimension) exit, or unit vectors per exit."""
    if kind in ("sequence", "scores"):
        logits = classifier_logits(head, weights, got["last_hidden_state"][b, :n])
        return sigmoid(logits) if kind == "scores" else softmax(logits)
    if kind in ("token", "grounded"):
        return softmax(got["logits"][b, :n])
    if kind == "relevance":
        return {(e["layer"], e["dimension"]): float(sigmoid(np.array(
            [relevance_logit(head, weights, got["exit_cls"][b], e["layer"], e["dimension"])]))[0])
            for e in head["exits"]}
    return {(layer, dim): embed(got[head["layers"][str(layer)]][b, :n], head["pooling"], True, dim)
            for layer in layers for dim in head["dimensions"]}


def _compare(source: TaskSource, head: Mapping[str, Any], weights: Mapping[str, np.ndarray], batch: list[Row],
             got: dict[str, np.ndarray], ref: list[Any], layers: Sequence[int]) -> float:
    """The readout's distance for one batch: the largest probability difference, or 1 - the least cosine."""
    worst = 0.0
    for b, row in enumerate(batch):
        n = len(row["input_ids"])
        ours = served_readout(source.head, head, weights, got, b, n, layers)
        if source.head in ("sequence", "scores", "token", "grounded"):
            worst = max(worst, float(np.abs(ours - ref[b][:n] if ours.ndim == 2 else ours - ref[b]).max()))
        elif source.head == "relevance":
            worst = max(worst, *(abs(ours[key] - expected) for key, expected in ref[b].items()))
        else:
            for (layer, dim), vector in ours.items():
                theirs = ref[b][layer][:dim].astype(np.float64)
                worst = max(worst, 1.0 - float(vector @ theirs / np.linalg.norm(theirs)))
    return worst


def _sentence_transformers_check(source: TaskSource, head: Mapping[str, Any], session: Any, tokenizer: Any,
                                 texts: Sequence[str]) -> float:
    """1 - the least cosine between our final-layer embedding and sentence-transformers' own ``encode``."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(source.root), device="cpu", model_kwargs={"attn_implementation": "sdpa"})
    theirs = st.encode(list(texts), convert_to_numpy=True, normalize_embeddings=False)
    worst = 0.0
    for text, vector in zip(texts, theirs):
        ids = np.asarray([tokenizer.encode(text).ids], dtype=np.int64)
        hidden = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]
        ours = embed(hidden, head["pooling"], True, None)
        worst = max(worst, 1.0 - float(ours @ vector / np.linalg.norm(vector)))
    return worst


def check_parity(source: TaskSource, model: Any, module: Any, session: Any, tokenizer: Any, head: Mapping[str, Any],
                 weights: Mapping[str, np.ndarray], items: Sequence[Any], max_tokens: int,
                 outputs: Sequence[str]) -> Parity:
    """Graph against the traced module and readout against Transformers, alone and in padded batches, rows
    of up to ``max_tokens``; ConversionError above tolerance (nothing is written)."""
    import torch

    rows = tokenized_rows(tokenizer, items, head, max_tokens)
    chosen = _spread(rows, 6)
    batches = [[r] for r in chosen] + [[chosen[i % len(chosen)] for i in order] for order in ((0, 3, 1, 5),
                                                                                           (4, 2, 5, 0))]
    layers = [int(k) for k in head.get("layers", {})] if source.head == "pooled" else list(head.get("layers", []))
    graph_worst, readout_worst = 0.0, 0.0
    for batch in batches:
        feeds = pad_batch(batch, ["input_ids", "attention_mask"], 0)
        got = dict(zip(outputs, session.run(list(outputs), feeds)))
        with torch.no_grad():
            traced = module(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
        traced = traced if isinstance(traced, tuple) else (traced,)
        mask = feeds["attention_mask"].astype(bool)
        for name, value in zip(outputs, traced):
            if not np.all(np.isfinite(got[name])):
                raise ConversionError(f"parity: output {name} is not finite")
            diff = np.abs(got[name].astype(np.float64) - value.numpy())
            graph_worst = max(graph_worst, float((diff[mask] if diff.shape[:2] == mask.shape else diff).max()))
        readout_worst = max(readout_worst, _compare(source, head, weights, batch, got,
                                                    _torch_readout(source, model, feeds, head, layers), layers))
    if source.head == "pooled" and (source.root / "modules.json").is_file():
        texts = [t for t in items if isinstance(t, str)][:12]
        readout_worst = max(readout_worst, _sentence_transformers_check(source, head, session, tokenizer, texts))
    metric = "cosine" if source.head == "pooled" else "probability"
    parity = Parity(graph_worst, metric, readout_worst, len(batches), sorted({len(r["input_ids"]) for r in chosen}),
                    _spread(rows, GOLDEN_ROWS, GOLDEN_MAX_TOKENS))
    if math.isnan(graph_worst) or graph_worst > GRAPH_TOLERANCE:
        raise ConversionError(f"parity check failed: max |onnx - torch| = {graph_worst:.3g} exceeds "
                              f"{GRAPH_TOLERANCE:g}; no package written")
    if math.isnan(readout_worst) or readout_worst > READOUT_TOLERANCE[metric]:
        what = "1 - cosine" if metric == "cosine" else "max |probability difference|"
        raise ConversionError(f"parity check failed: readout {what} = {readout_worst:.3g} against Transformers "
                              f"exceeds {READOUT_TOLERANCE[metric]:g}; no package written")
    return parity


#: every 25th of converters/data's 2,500 real sentences: the inputs int8's agreement with fp32 is stated on
AGREEMENT_STRIDE = 25


def agreement_items(kind: str) -> list[Any]:
    """Real sentences (converters/data; none of them the calibration samples), as (query, document) pairs
    for relevance heads and (context, answer) items for grounded ones."""
    texts = real_sentences()[::AGREEMENT_STRIDE]
    if kind == "relevance":
        return list(zip(texts, texts[1:]))
    if kind == "grounded":
        return [{"context": a, "question": "", "answer": b} for a, b in zip(texts, texts[1:])]
    return texts


def _decisions(kind: str, head: Mapping[str, Any], p: np.ndarray) -> np.ndarray | None:
    """What a thresholded head selects from probabilities ``p`` (a row per text or token); None for others."""
    if kind == "scores":
        t, column = np.asarray(head["thresholds"], np.float64), p
    elif kind == "grounded":
        t, column = np.asarray(head["threshold"], np.float64), p[:, head["positive"]]
    else:
        return None
    return np.asarray(column > t if head["comparison"] == ">" else column >= t)


def int8_agreement(kind: str, head: Mapping[str, Any], weights: Mapping[str, np.ndarray], fp32: Any, int8: Any,
                   rows: Sequence[Row], outputs: Sequence[str], layers: Sequence[int]) -> dict[str, Any]:
    """Agreement of the int8 graph with the fp32 one on ``rows``, each alone, read as the family reads them.

    Probability heads: the largest |dp|, the share of top labels that agree (per token for token heads) and,
    for thresholded heads (scores, grounded), the share of decisions that agree; relevance: the largest and
    mean |dp| over every scored exit; pooled: the least and mean cosine over every exit and dimension.
    """
    def read(session: Any, row: Row) -> Any:
        feeds = {"input_ids": row["input_ids"][None, :], "attention_mask": row["attention_mask"][None, :]}
        got = dict(zip(outputs, session.run(list(outputs), feeds)))
        return served_readout(kind, head, weights, got, 0, len(row["input_ids"]), layers)

    a, b = [read(fp32, r) for r in rows], [read(int8, r) for r in rows]
    if kind == "pooled":
        cos = np.array([float(x[k] @ y[k]) for x, y in zip(a, b) for k in x])
        return {"metric": "cosine", "min_cosine": round(float(cos.min()), 6),
                "mean_cosine": round(float(cos.mean()), 6), "exits": len(a[0]), "cases": len(rows)}
    if kind == "relevance":
        dp = np.array([abs(x[k] - y[k]) for x, y in zip(a, b) for k in x])
        return {"metric": "relevance", "max_abs_dp": round(float(dp.max()), 6),
                "mean_abs_dp": round(float(dp.mean()), 6), "exits": len(a[0]), "cases": len(rows)}
    pa, pb = np.concatenate([np.atleast_2d(x) for x in a]), np.concatenate([np.atleast_2d(y) for y in b])
    result = probability_agreement(pa, pb, len(rows))
    if kind in ("token", "grounded"):
        result["tokens"] = int(pa.shape[0])
    chosen_a, chosen_b = _decisions(kind, head, pa), _decisions(kind, head, pb)
    if chosen_a is not None and chosen_b is not None:
        result["selection_agreement"] = round(float(np.mean(chosen_a == chosen_b)), 6)
    return result


def goldens(session: Any, rows: Sequence[Row]) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Golden cases: each row alone with the outputs this session gives for it."""
    names = [o.name for o in session.get_outputs()]
    cases = []
    for row in rows:
        feeds = {"input_ids": row["input_ids"][None, :], "attention_mask": row["attention_mask"][None, :]}
        cases.append((feeds, dict(zip(names, session.run(names, feeds)))))
    return cases
