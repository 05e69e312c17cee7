"""Encoder family: classify (sequence, multi-label, token spans), embeddings and rerank over one graph.

Plans turn validated requests into token rows (edge_runtime.text), the engine runs the rows, and
the finish step reads outputs with the pure heads in edge_runtime.heads.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_runtime.engine.encoder import EncoderForward
from edge_runtime.errors import ApiError, ItemError, invalid_request
from edge_runtime.families.base import Plan
from edge_runtime.heads.activations import sigmoid, softmax
from edge_runtime.heads.pooling import embed
from edge_runtime.heads.tokens import decode_bio
from edge_runtime.heads.windows import max_over_windows, pick_token_rows
from edge_runtime.packages import Package
from edge_runtime.requests.common import Options, Overflow
from edge_runtime.requests.embedding_inputs import modality_unsupported
from edge_runtime.requests.encoder import ClassifyRequest, EmbeddingsRequest, RerankRequest, TextItem
from edge_runtime.text import Encoded, InputError, TextEncoder, Window


@dataclass(frozen=True)
class ProbeRow:
    ids: np.ndarray
    type_ids: np.ndarray


def _failed(encoded: Encoded | ItemError, outputs: list[Any] | ItemError) -> Encoded | ItemError:
    """An item keeps its own error; otherwise a failure of the whole forward (a deadline) becomes its error."""
    return outputs if isinstance(outputs, ItemError) and not isinstance(encoded, ItemError) else encoded


def _ran(outputs: list[Any] | ItemError) -> list[Any]:
    """The forward's outputs; none when the job failed as a whole (then _failed fails every item)."""
    return [] if isinstance(outputs, ItemError) else outputs


class EncoderFamily:
    """One encoder package: its tokenizer, head settings and the forward over its graph."""

    batchable = True  # the load-time probe decides how rows may share a forward

    def __init__(self, package: Package, session: Any, max_input_tokens: int | None = None,
                 max_scan_tokens: int | None = None) -> None:
        card = package.card
        self.kind = card.kind
        self.surfaces = frozenset(card.surfaces)
        self.labels: list[str] = list(card.labels or [])
        self.head: dict[str, Any] = dict(card.head or {})
        self.max_input_tokens = min(
            int(card.limits["max_input_tokens"]), max_input_tokens or int(card.limits["max_input_tokens"])
        )
        self.text = TextEncoder(package.file("tokenizer.json"), self.max_input_tokens)
        # The models file's scan budget for overflow: window when options.max_tokens sets none.
        self.max_scan_tokens = max_scan_tokens
        self.layers: dict[int, str] = {int(k): v for k, v in (self.head.get("layers") or {}).items()}
        self.dimension: int | None = self.head.get("dimension")
        self.dimensions: list[int] = sorted(set(self.head.get("dimensions") or []), reverse=True)
        self.digest = package.digest
        outputs = sorted(set(self.layers.values())) if self.kind == "embedding" else [
            self.head.get("output", "logits")
        ]
        if self.kind == "embedding" and not outputs:
            outputs = ["last_hidden_state"]
        self.forward = EncoderForward(session, outputs=outputs)
        self._vocab_size = self.text.tokenizer.get_vocab_size()
        self._probe_rng = np.random.default_rng(0)

    # -- engine hooks -------------------------------------------------------------------------

    def probe_row(self, length: int) -> Any:
        """A fresh row of random token ids for the batch-invariance probe (equal rows would prove nothing)."""
        ids = self._probe_rng.integers(1, self._vocab_size, size=length, dtype=np.int64)
        return ProbeRow(ids, np.zeros_like(ids))

    def warm(self) -> None:
        """Probe the tokenizer's cut classes now, so the first long input does not pay for it."""
        self.text.cut_report()

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self.labels:
            info["labels"] = self.labels
        if self.kind == "multi-label":
            info["thresholds"] = dict(self.head.get("thresholds") or {})
        if self.kind == "embedding":
            info["dimension"] = self.dimension
            info["dimensions"] = self.dimensions or ([self.dimension] if self.dimension else [])
            info["layers"] = sorted(self.layers)
            info["pooling"] = self.head.get("pooling")
            info["normalized"] = bool(self.head.get("normalize"))
        return info

    # -- planning ---------------------------------------------------------------------------

    def plan(self, surface: str, request: Any) -> Plan:
        if surface == "classify":
            return self._plan_classify(request)
        if surface == "embeddings":
            return self._plan_embeddings(request)
        if surface == "rerank":
            return self._plan_rerank(request)
        raise ValueError(surface)

    def _budget(self, options: Options) -> int:
        if options.max_tokens is None:
            return self.max_input_tokens
        if options.max_tokens > self.max_input_tokens:
            raise invalid_request(
                f"options.max_tokens {options.max_tokens} exceeds the model's max_input_tokens "
                f"{self.max_input_tokens}"
            )
        return options.max_tokens

    def _scan_budget(self, options: Options, budget: int) -> int:
        """Tokens a windowed input may have: options.max_tokens, else the models file's max_scan_tokens."""
        if options.max_tokens is None and self.max_scan_tokens is not None:
            return self.max_scan_tokens
        return budget

    def _encode_all(
        self, items: list[tuple[str, str | None]], options: Options, default_overflow: Overflow
    ) -> tuple[list[Encoded | ItemError], list[Any], list[list[int]], int, bool]:
        """Tokenize every item: per item its Encoded (or ItemError) and the row indices it owns."""
        budget = self._budget(options)
        overflow = options.overflow or default_overflow
        window = None
        if overflow == "window":
            spec = options.window
            tokens = spec.tokens if spec else budget
            if tokens > self.max_input_tokens:
                raise invalid_request(
                    f"options.window.tokens {tokens} exceeds the model's max_input_tokens {self.max_input_tokens}"
                )
            window = Window(tokens, spec.overlap if spec else 0)
        encoded: list[Encoded | ItemError] = []
        rows: list[Any] = []
        owners: list[list[int]] = []
        tokens = 0
        lower_bound = False
        for text, pair in items:
            result = self.text.encode(
                text, pair, max_tokens=budget, overflow=overflow, window=window,
                scan_tokens=self._scan_budget(options, budget) if overflow == "window" else None,
            )
            if isinstance(result, InputError):
                encoded.append(ItemError(result.code, result.message))
                owners.append([])
                continue
            encoded.append(result)
            owners.append(list(range(len(rows), len(rows) + len(result.rows))))
            rows.extend(result.rows)
            tokens += result.tokens
            lower_bound = lower_bound or result.tokens_lower_bound
        return encoded, rows, owners, tokens, lower_bound

    @staticmethod
    def _usage(key: str, tokens: int, lower_bound: bool) -> dict[str, Any]:
        usage: dict[str, Any] = {key: tokens}
        if key == "prompt_tokens":
            usage["total_tokens"] = tokens
        if lower_bound:
            usage["tokens_lower_bound"] = True
        return usage

    # classify --------------------------------------------------------------------------------

    def _plan_classify(self, req: ClassifyRequest) -> Plan:
        if self.kind == "token-classification" and any(i.pair is not None and not i.grounded for i in req.items):
            raise invalid_request("token classification reads single texts or grounded items, not text pairs")
        encoded, rows, owners, tokens, lower = self._encode_all(
            [(i.text, i.pair) for i in req.items], req.options, "reject"
        )

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            results = []
            for index, (item, enc, own) in enumerate(zip(req.items, encoded, owners)):
                enc = _failed(enc, outputs)
                if isinstance(enc, ItemError):
                    results.append({"index": index, "error": enc.body()})
                    continue
                result = self._classify_one(item, enc, [_ran(outputs)[r] for r in own])
                result["index"] = index
                if len(own) > 1:
                    result["windows"] = len(own)
                results.append(result)
            body: dict[str, Any] = {"results": results, "usage": self._usage("input_tokens", tokens, lower)}
            return body

        return Plan(rows, finish, tokens)

    def _classify_one(self, item: TextItem, enc: Encoded, outs: list[dict[str, np.ndarray]]) -> dict[str, Any]:
        name = self.head.get("output", "logits")
        if self.kind == "sequence-classification":
            probs = max_over_windows([softmax(o[name]) for o in outs])
            best = int(np.argmax(probs))
            return {
                "label": self.labels[best],
                "probabilities": {lab: float(p) for lab, p in zip(self.labels, probs)},
            }
        if self.kind == "multi-label":
            scores = max_over_windows([sigmoid(o[name]) for o in outs])
            thresholds = self.head.get("thresholds") or {}
            return {
                "scores": {lab: float(s) for lab, s in zip(self.labels, scores)},
                "selected": [lab for lab, s in zip(self.labels, scores) if s >= thresholds.get(lab, 0.5)],
                "thresholds": {lab: float(thresholds.get(lab, 0.5)) for lab in self.labels},
            }
        # token classification: spans on the text, or on the answer of a grounded item
        sequence = 1 if item.grounded else 0
        target = item.pair if item.grounded else item.text
        probs, offsets = pick_token_rows(
            [(softmax(o[name]), row) for o, row in zip(outs, enc.rows)], sequence
        )
        spans = decode_bio(probs, offsets, self.labels, target or "")
        return {"spans": [s.body() for s in spans]}

    # embeddings --------------------------------------------------------------------------------

    def _plan_embeddings(self, req: EmbeddingsRequest) -> Plan:
        if req.modalities != {"text"}:
            raise modality_unsupported(req.modalities, ("text",))
        full = self.dimension
        if req.dimensions is not None and req.dimensions != full and req.dimensions not in self.dimensions:
            offered = sorted(set(self.dimensions) | ({full} if full else set()))
            raise invalid_request(f"dimensions must be one of {offered} for this model, not {req.dimensions}")
        last = max(self.layers) if self.layers else None
        layer = req.layer if req.layer is not None else last
        if req.layer is not None and req.layer not in self.layers:
            raise invalid_request(f"layer must be one of {sorted(self.layers)} for this model, not {req.layer}")
        output = self.layers.get(layer, "last_hidden_state") if layer is not None else "last_hidden_state"
        if req.options.overflow == "window":
            raise invalid_request("embeddings take overflow reject or truncate")
        encoded, rows, owners, tokens, lower = self._encode_all(
            [(t, None) for t in req.inputs], req.options, "reject"
        )
        pooling = self.head.get("pooling", "mean")
        normalized = bool(self.head.get("normalize", False))
        dims = req.dimensions if req.dimensions != full else None

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            data = []
            for index, (enc, own) in enumerate(zip(encoded, owners)):
                enc = _failed(enc, outputs)
                if isinstance(enc, ItemError):
                    data.append({"object": "embedding", "index": index, "embedding": None, "error": enc.body()})
                    continue
                vector = embed(_ran(outputs)[own[0]][output], pooling, normalized, dims)
                if not np.all(np.isfinite(vector)):
                    raise ApiError("internal_error", "the model produced a non-finite embedding")
                value: Any = (
                    base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                    if req.encoding_format == "base64"
                    else vector.tolist()
                )
                data.append({"object": "embedding", "index": index, "embedding": value})
            return {"object": "list", "data": data, "usage": self._usage("prompt_tokens", tokens, lower)}

        return Plan(
            rows,
            finish,
            tokens,
            extras={
                "representation": {
                    "model_sha256": self.digest,
                    "layer": layer,
                    "dimension": req.dimensions or full,
                    "normalized": normalized,
                    "modality": "text",
                }
            },
        )

    # rerank --------------------------------------------------------------------------------

    def _plan_rerank(self, req: RerankRequest) -> Plan:
        encoded, rows, owners, tokens, lower = self._encode_all(
            [(req.query, d) for d in req.documents], req.options, "truncate"
        )
        name = self.head.get("output", "logits")

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            scored: list[dict[str, Any]] = []
            failed: list[dict[str, Any]] = []
            for index, (enc, own) in enumerate(zip(encoded, owners)):
                enc = _failed(enc, outputs)
                if isinstance(enc, ItemError):
                    failed.append({"index": index, "relevance_score": None, "error": enc.body()})
                    continue
                logits = np.asarray(_ran(outputs)[own[0]][name], dtype=np.float64).reshape(-1)
                score = float(sigmoid(logits[:1])[0]) if logits.size == 1 else float(softmax(logits)[-1])
                entry: dict[str, Any] = {"index": index, "relevance_score": score}
                if req.return_documents:
                    entry["document"] = {"text": req.documents[index]}
                scored.append(entry)
            scored.sort(key=lambda e: (-e["relevance_score"], e["index"]))
            if req.top_n is not None:
                scored = scored[: req.top_n]
            for entry in failed:
                if req.return_documents:
                    entry["document"] = {"text": req.documents[entry["index"]]}
            return {"results": scored + failed, "usage": self._usage("input_tokens", tokens, lower)}

        return Plan(rows, finish, tokens)
