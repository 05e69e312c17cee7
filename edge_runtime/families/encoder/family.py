"""Encoder family: classify (sequence, multi-label, token spans), embeddings and rerank over one graph.

Plans turn validated requests into token rows (edge_runtime.text), the engine runs the rows, and
the finish step reads outputs with the pure heads in edge_runtime.heads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_runtime.engine.encoder import EncoderForward
from edge_runtime.errors import ItemError, invalid_request
from edge_runtime.families.base import Plan, token_budget
from edge_runtime.families.embeddings import Embedded, embedding_card, embeddings_body
from edge_runtime.families.items import InputUsage, failed_item, outcome, ran, request_usage
from edge_runtime.families.text_model import TextEncoderModel
from edge_runtime.heads.activations import sigmoid, softmax
from edge_runtime.heads.pooling import Dense, embed
from edge_runtime.heads.tokens import bio_answer
from edge_runtime.heads.windows import max_over_windows, pick_token_rows
from edge_runtime.packages import Package
from edge_runtime.requests.common import Options, Overflow
from edge_runtime.requests.embedding_inputs import modality_unsupported
from edge_runtime.requests.encoder import ClassifyRequest, EmbeddingsRequest, RerankRequest, TextItem
from edge_runtime.text import Encoded, InputError, Window


def _dense_layers(spec: list[dict[str, Any]], weights: dict[str, np.ndarray], dimension: int | None) -> list[Dense]:
    """The card's dense projections with their head.npz weights; ValueError when a weight is missing or
    the widths do not chain into the head's dimension."""
    layers: list[Dense] = []
    for i, layer in enumerate(spec):
        weight, bias = weights.get(f"dense.{i}.weight"), weights.get(f"dense.{i}.bias")
        if weight is None or weight.ndim != 2 or (bias is None) == bool(layer["bias"]):
            raise ValueError(f"head.npz: dense.{i} does not match the card's head.dense[{i}]")
        if layers and layers[-1][0].shape[0] != weight.shape[1]:
            raise ValueError(f"head.npz: dense.{i} takes {weight.shape[1]} inputs after {layers[-1][0].shape[0]}")
        # float64 once here: project() reads them for every vector
        layers.append((weight.astype(np.float64), None if bias is None else bias.astype(np.float64),
                       str(layer["activation"])))
    if layers and layers[-1][0].shape[0] != dimension:
        raise ValueError(f"head.npz: the dense projections end at {layers[-1][0].shape[0]}, the head's dimension "
                         f"is {dimension}")
    return layers


#: The card kind of each classify head, as the Router's cards name them.
HEAD_KINDS = {"sequence-classification": "sequence", "multi-label": "scores", "token-classification": "token"}
#: The input forms each classify head reads.
HEAD_INPUTS = {"sequence-classification": ["text", "pair"], "multi-label": ["text", "pair"],
               "token-classification": ["text", "grounded"]}


class EncoderFamily(TextEncoderModel):
    """One encoder package: its tokenizer, head settings and the forward over its graph."""

    def __init__(self, package: Package, session: Any, max_input_tokens: int | None = None,
                 max_scan_tokens: int | None = None) -> None:
        super().__init__(package, max_input_tokens, max_scan_tokens)
        self.layers: dict[int, str] = {int(k): v for k, v in (self.head.get("layers") or {}).items()}
        self.dimension: int | None = self.head.get("dimension")
        self.dimensions: list[int] = sorted(set(self.head.get("dimensions") or []), reverse=True)
        # sentence-transformers prompts by input_type, and dense projections after pooling
        self.prompts: dict[str, str] = dict(self.head.get("prompts") or {})
        self.dense = _dense_layers(self.head.get("dense") or [], package.head_weights(), self.dimension)
        outputs = sorted(set(self.layers.values())) if self.kind == "embedding" else [
            self.head.get("output", "logits")
        ]
        if self.kind == "embedding" and not outputs:
            outputs = ["last_hidden_state"]
        self.forward = EncoderForward(session, outputs=outputs)
        # A package holds one head; its name is the card's, else the name every single-head card shares.
        self.head_name: str = str(self.head.get("name") or "default")
        # A cross-encoder reads one exit: its last layer at the hidden width (0 where the converter
        # did not record them, in packages written before it did).
        self.rerank_exit = {"layer": int(self.head.get("layer") or 0),
                            "dimension": int(self.head.get("dimension") or 0)}

    def describe(self) -> dict[str, Any]:
        """The card's per-surface blocks: ``heads`` (classify), ``embedding`` or ``rerank``."""
        if self.kind in HEAD_KINDS:
            head: dict[str, Any] = {"name": self.head_name, "kind": HEAD_KINDS[self.kind], "labels": self.labels,
                                    "inputs": HEAD_INPUTS[self.kind], "overflow": "reject",
                                    "window": {"tokens": self.max_input_tokens, "overlap": 0}}
            if self.kind == "multi-label":
                head["thresholds"] = self._thresholds(None)
            return {"heads": [head]}
        if self.kind == "embedding":
            return embedding_card([*self.dimensions, *([self.dimension] if self.dimension else [])], self.layers,
                                  self.head.get("pooling"), bool(self.head.get("normalize")), ["text"], self.prompts)
        return {"rerank": {"default": dict(self.rerank_exit), "exits": [dict(self.rerank_exit)]}}

    # -- planning ---------------------------------------------------------------------------

    def plan(self, surface: str, request: Any) -> Plan:
        if surface == "classify":
            return self._plan_classify(request)
        if surface == "embeddings":
            return self._plan_embeddings(request)
        if surface == "rerank":
            return self._plan_rerank(request)
        raise ValueError(surface)

    def _scan_budget(self, options: Options, budget: int) -> int:
        """Tokens a windowed input may have: options.max_tokens, else the models file's max_scan_tokens."""
        if options.max_tokens is None and self.max_scan_tokens is not None:
            return self.max_scan_tokens
        return budget

    def _encode_all(
        self, items: list[tuple[str, str | None]], options: Options, default_overflow: Overflow
    ) -> tuple[list[Encoded | ItemError], list[Any], list[list[int]]]:
        """Tokenize every item: per item its Encoded (or ItemError) and the row indices it owns."""
        budget = token_budget(options.max_tokens, self.max_input_tokens)
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
        return encoded, rows, owners

    @staticmethod
    def _tokens(encoded: list[Encoded | ItemError]) -> int:
        """The tokens the request's inputs hold, for the engine's accounting."""
        return sum(e.tokens for e in encoded if isinstance(e, Encoded))

    # classify --------------------------------------------------------------------------------

    def _plan_classify(self, req: ClassifyRequest) -> Plan:
        if req.head is not None and req.head != self.head_name:
            raise invalid_request(f"head must be {self.head_name!r} for this model, not {req.head!r}")
        if req.options.threshold is not None and self.kind == "sequence-classification":
            raise invalid_request("options.threshold applies to heads of kind scores and token, not sequence")
        if self.kind == "token-classification" and any(i.pair is not None and not i.grounded for i in req.items):
            raise invalid_request("token classification reads single texts or grounded items, not text pairs")
        encoded, rows, owners = self._encode_all([(i.text, i.pair) for i in req.items], req.options, "reject")
        thresholds = self._thresholds(req.options.threshold)

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            results = []
            usages = []
            for index, (item, enc, own) in enumerate(zip(req.items, encoded, owners)):
                enc = outcome(enc, outputs)
                if isinstance(enc, ItemError):
                    results.append(failed_item(index, enc))
                    continue
                usage = InputUsage.of(enc)
                usages.append(usage)
                result = {"index": index,
                          **self._classify_one(item, enc, [ran(outputs)[r] for r in own], thresholds,
                                               req.options.threshold),
                          "input": usage.body()}
                results.append(result)
            body: dict[str, Any] = {"head": self.head_name, "kind": HEAD_KINDS[self.kind], "labels": self.labels}
            if self.kind == "multi-label":
                body["thresholds"] = thresholds
            return {**body, "results": results, "usage": request_usage(usages, "input_tokens")}

        return Plan(rows, finish, self._tokens(encoded))

    def _thresholds(self, override: float | None) -> list[float]:
        """A scores head's threshold per label, in label order: the request's, else the card's."""
        card = self.head.get("thresholds") or {}
        return [override if override is not None else float(card.get(lab, 0.5)) for lab in self.labels]

    def _classify_one(self, item: TextItem, enc: Encoded, outs: list[dict[str, np.ndarray]],
                      thresholds: list[float], span_threshold: float | None) -> dict[str, Any]:
        name = self.head.get("output", "logits")
        if self.kind in ("sequence-classification", "multi-label"):
            read = softmax if self.kind == "sequence-classification" else sigmoid
            key = "probabilities" if self.kind == "sequence-classification" else "scores"
            per_window = [read(o[name]) for o in outs]
            values = max_over_windows(per_window)
            result: dict[str, Any] = {key: [float(v) for v in values]}
            if self.kind == "sequence-classification":
                result["label"] = self.labels[int(np.argmax(values))]
            else:
                result["selected"] = [lab for lab, v, t in zip(self.labels, values, thresholds) if v >= t]
            if enc.windows is not None:
                result["windows"] = [{"start": a, "end": b, key: [float(v) for v in w]}
                                     for (a, b), w in zip(enc.windows, per_window)]
            return result
        # token classification: spans on the text, or on the answer of a grounded item
        sequence = 1 if item.grounded else 0
        target = item.pair if item.grounded else item.text
        probs, offsets = pick_token_rows(
            [(softmax(o[name]), row) for o, row in zip(outs, enc.rows)], sequence
        )
        return bio_answer(probs, offsets, self.labels, target or "", span_threshold, enc.windows)

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
        # the input_type's prompt leads each text, as sentence-transformers reads it; none without input_type
        prompt = self.prompts.get(req.input_type, "") if req.input_type is not None else ""
        encoded, rows, owners = self._encode_all([(prompt + t, None) for t in req.inputs], req.options, "reject")
        pooling = self.head.get("pooling", "mean")
        normalized = bool(self.head.get("normalize", False))
        dims = req.dimensions if req.dimensions != full else None

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            items: list[Embedded] = []
            for enc, own in zip(encoded, owners):
                enc = outcome(enc, outputs)
                if isinstance(enc, ItemError):
                    items.append(enc)
                    continue
                vector = embed(ran(outputs)[own[0]][output], pooling, normalized, dims, self.dense)
                items.append((vector, InputUsage.of(enc)))
            return embeddings_body(items, req.encoding_format)

        return Plan(
            rows,
            finish,
            self._tokens(encoded),
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
        exit_ = self.rerank_exit
        for asked, has, what in ((req.layer, exit_["layer"], "layer"),
                                 (req.dimensions, exit_["dimension"], "dimensions")):
            if asked is not None and asked != has:
                raise invalid_request(f"{what} must be {has} for this model (its one exit), not {asked}")
        encoded, rows, owners = self._encode_all([(req.query, d) for d in req.documents], req.options, "truncate")
        name = self.head.get("output", "logits")

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            scored: list[dict[str, Any]] = []
            failed: list[dict[str, Any]] = []
            usages = []
            for index, (enc, own) in enumerate(zip(encoded, owners)):
                document = {"document": {"text": req.documents[index]}} if req.return_documents else {}
                enc = outcome(enc, outputs)
                if isinstance(enc, ItemError):
                    failed.append(failed_item(index, enc, relevance_score=None, **document))
                    continue
                logits = np.asarray(ran(outputs)[own[0]][name], dtype=np.float64).reshape(-1)
                # one logit: a relevance logit read through a sigmoid; two: the "relevant" class's log-odds
                logit = float(logits[0]) if logits.size == 1 else float(logits[-1] - logits[0])
                score = float(sigmoid(logits[:1])[0]) if logits.size == 1 else float(softmax(logits)[-1])
                usage = InputUsage.of(enc)
                usages.append(usage)
                scored.append({"index": index, "relevance_score": score, "logit": logit, **document,
                               "input": usage.body()})
            scored.sort(key=lambda e: (-e["relevance_score"], e["index"]))
            if req.top_n is not None:
                scored = scored[: req.top_n]
            return {"results": scored + failed, "usage": request_usage(usages, "input_tokens")}

        return Plan(rows, finish, self._tokens(encoded))
