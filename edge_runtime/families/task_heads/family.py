"""The task-heads family: ModernBERT (and mmBERT) task packages read as the Router's runtime reads them.

One package holds one head over one graph (docs/packages.md "task-heads packages"):

- ``task-sequence`` / ``task-scores``: the graph gives the hidden states; the head pools them (CLS or
  mean), runs the checkpoint's prediction head and classifier in numpy (heads/mlp.py: a masked mean
  inside the graph is not batch-invariant) and reads a softmax or one sigmoid per label; a scores head
  selects labels at its operating point's thresholds and comparison. Long inputs are read in windows
  placed as upstream places them (``stride``: each a stride after the last, the last one short) and
  reduced with the per-label maximum.
- ``task-token``: BIO spans from per-token logits (heads/tokens.decode_bio), windows merged per token.
- ``task-grounded``: an answer read against its context through the package's pair template; spans are
  runs of answer tokens whose positive-label probability passes the threshold (heads/tokens.positive_runs).
- ``task-pooled``: sentence embeddings at layer exits (raw or final-normed, as the package's
  representation contract says), Matryoshka dimensions truncated before L2.
- ``task-relevance``: a cross-encoder whose graph gives the final-normed CLS state of every scored exit;
  each (layer, dimension) exit's MLP scorer runs in numpy, so every exit comes from one forward.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_runtime.engine.encoder import EncoderForward
from edge_runtime.errors import ItemError, invalid_request
from edge_runtime.families.base import Plan, token_budget
from edge_runtime.families.embeddings import Embedded, embedding_card, embeddings_body
from edge_runtime.families.items import InputUsage, failed_item, outcome, ran, request_usage
from edge_runtime.families.task_heads.card import HEAD_KINDS, NUMPY_HEADS
from edge_runtime.families.task_heads.readout import classifier_logits, relevance_logit
from edge_runtime.families.text_model import TextEncoderModel
from edge_runtime.heads.activations import sigmoid, softmax
from edge_runtime.heads.mlp import float64_weights
from edge_runtime.heads.pooling import embed
from edge_runtime.heads.tokens import bio_answer, positive_runs
from edge_runtime.heads.windows import max_over_windows, pick_token_rows
from edge_runtime.packages import Package
from edge_runtime.requests.common import Options, Overflow
from edge_runtime.requests.embedding_inputs import modality_unsupported
from edge_runtime.requests.encoder import ClassifyRequest, EmbeddingsRequest, RerankRequest, TextItem
from edge_runtime.text import Encoded, InputError, Window

#: The one head a package holds, as the Router names a single-head model's head.
HEAD_NAME = "default"
#: /v1/classify input forms each head reads
INPUTS = {"task-sequence": ["text", "pair"], "task-scores": ["text", "pair"], "task-token": ["text"],
          "task-grounded": ["grounded"]}
COMPARISONS = {">=": lambda p, t: p >= t, ">": lambda p, t: p > t}


class TaskHeadsFamily(TextEncoderModel):
    """One task package: its tokenizer, its head and the forward over its graph."""

    def __init__(self, package: Package, session: Any, max_input_tokens: int | None = None,
                 max_scan_tokens: int | None = None) -> None:
        super().__init__(package, max_input_tokens, max_scan_tokens)
        self.weights = float64_weights(package.head_weights()) if self.kind in NUMPY_HEADS else {}
        self.layers: dict[int, str] = {int(k): v for k, v in (self.head.get("layers") or {}).items()} \
            if self.kind == "task-pooled" else {}
        outputs = sorted(set(self.layers.values())) if self.layers else [self.head["output"]]
        self.forward = EncoderForward(session, outputs=outputs)

    def describe(self) -> dict[str, Any]:
        """The card's per-surface block: ``heads`` (classify), ``embedding`` or ``rerank``."""
        head = self.head
        if self.kind == "task-pooled":
            return embedding_card(head["dimensions"], self.layers, head["pooling"], bool(head["normalize"]),
                                  ["text"])
        if self.kind == "task-relevance":
            return {"rerank": {"default": dict(head["default"]), "exits": [dict(e) for e in head["exits"]]}}
        card: dict[str, Any] = {"name": HEAD_NAME, "kind": HEAD_KINDS[self.kind], "labels": self.labels,
                                "inputs": INPUTS[self.kind], "overflow": head.get("overflow", "reject")}
        if "window" in head:  # as a windowed read takes it: within the served max_input_tokens
            card["window"] = {**head["window"], "tokens": min(int(head["window"]["tokens"]), self.max_input_tokens)}
            card["reduction"] = "span_union" if self.kind == "task-token" else "max"
        if self.kind == "task-scores":
            card["thresholds"] = [float(t) for t in head["thresholds"]]
        if self.kind == "task-grounded":
            card["default_threshold"] = float(head["threshold"])
        if "operating_point" in head:
            card["operating_point_sha256"] = head["operating_point"]["sha256"]
        return {"heads": [card]}

    def plan(self, surface: str, request: Any) -> Plan:
        if surface == "classify":
            return self._plan_classify(request)
        if surface == "embeddings":
            return self._plan_embeddings(request)
        if surface == "rerank":
            return self._plan_rerank(request)
        raise ValueError(surface)

    # classify --------------------------------------------------------------------------------

    def _window(self, options: Options) -> tuple[Window, int]:
        """The windows of a windowed read (the request's, else the head's) and the tokens it may scan."""
        spec, default = options.window, self.head.get("window") or {"tokens": self.max_input_tokens, "overlap": 0}
        tokens = spec.tokens if spec else min(int(default["tokens"]), self.max_input_tokens)
        if tokens > self.max_input_tokens:
            raise invalid_request(f"options.window.tokens {tokens} exceeds the model's max_input_tokens "
                                  f"{self.max_input_tokens}")
        point = self.head.get("operating_point") or {}
        scan_limit = max(self.max_input_tokens, self.max_scan_tokens or 0, int(point.get("max_document_tokens", 0)))
        if options.max_tokens is not None and options.max_tokens > scan_limit:
            raise invalid_request(f"options.max_tokens {options.max_tokens} exceeds the model's scan limit "
                                  f"{scan_limit}")
        scan = options.max_tokens or self.max_scan_tokens or point.get("max_document_tokens") or self.max_input_tokens
        overlap = spec.overlap if spec else int(default["overlap"])
        return Window(tokens, overlap, "stride"), int(scan)

    def _check_forms(self, req: ClassifyRequest) -> None:
        if req.head is not None and req.head != HEAD_NAME:
            raise invalid_request(f"head must be {HEAD_NAME!r} for this model, not {req.head!r}")
        if req.options.threshold is not None and self.kind == "task-sequence":
            raise invalid_request("options.threshold applies to heads of kind scores and token, not sequence")
        forms = INPUTS[self.kind]
        for item in req.items:
            form = "grounded" if item.grounded else "pair" if item.pair is not None else "text"
            if form not in forms:
                raise invalid_request(f"this {HEAD_KINDS[self.kind]} head reads {' or '.join(forms)} inputs, "
                                      f"not {form} inputs")

    def _encode(self, item: TextItem, overflow: Overflow, budget: int, window: tuple[Window, int] | None
                ) -> Encoded | ItemError:
        if self.kind == "task-grounded":
            prompt = self.head["input_pair"][0].format(question=item.question, context=item.context)
            result = self.text.encode(prompt, item.pair, max_tokens=budget, overflow=overflow, only_first=True)
        elif window is not None:
            result = self.text.encode(item.text, item.pair, max_tokens=window[1], overflow="window",
                                      window=window[0], scan_tokens=window[1])
        else:
            result = self.text.encode(item.text, item.pair, max_tokens=budget, overflow=overflow)
        return ItemError(result.code, result.message) if isinstance(result, InputError) else result

    def _plan_classify(self, req: ClassifyRequest) -> Plan:
        self._check_forms(req)
        options = req.options
        overflow: Overflow = options.overflow or self.head.get("overflow", "reject")
        if overflow == "window" and self.kind == "task-grounded":
            raise invalid_request("grounded inputs are not read in windows (overflow reject or truncate)")
        window = self._window(options) if overflow == "window" else None
        budget = self.max_input_tokens if window else token_budget(options.max_tokens, self.max_input_tokens)
        encoded = [self._encode(item, overflow, budget, window) for item in req.items]
        rows: list[Any] = []
        owners: list[list[int]] = []
        for enc in encoded:
            own = [] if isinstance(enc, ItemError) else enc.rows
            owners.append(list(range(len(rows), len(rows) + len(own))))
            rows.extend(own)
        thresholds = self._thresholds(options.threshold)

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            results, usages = [], []
            for index, (item, enc, own) in enumerate(zip(req.items, encoded, owners)):
                enc = outcome(enc, outputs)
                if isinstance(enc, ItemError):
                    results.append(failed_item(index, enc))
                    continue
                usage = InputUsage.of(enc)
                usages.append(usage)
                read = self._read(item, enc, [ran(outputs)[r] for r in own], thresholds, options.threshold)
                results.append({"index": index, **read, "input": usage.body()})
            body: dict[str, Any] = {"head": HEAD_NAME, "kind": HEAD_KINDS[self.kind], "labels": self.labels}
            if self.kind == "task-scores":
                body["thresholds"] = thresholds
            return {**body, "results": results, "usage": request_usage(usages, "input_tokens")}

        return Plan(rows, finish, sum(e.tokens for e in encoded if isinstance(e, Encoded)))

    def _thresholds(self, override: float | None) -> list[float]:
        """A scores head's threshold per label, in label order: the request's, else the operating point's."""
        return [float(t) if override is None else override for t in self.head.get("thresholds", [])]

    def _read(self, item: TextItem, enc: Encoded, outs: list[dict[str, np.ndarray]], thresholds: list[float],
              span_threshold: float | None) -> dict[str, Any]:
        if self.kind in ("task-sequence", "task-scores"):
            scores = self.kind == "task-scores"
            key = "scores" if scores else "probabilities"
            read = sigmoid if scores else softmax
            per_window = [read(classifier_logits(self.head, self.weights, o["last_hidden_state"])) for o in outs]
            values = max_over_windows(per_window)
            result: dict[str, Any] = {key: [float(v) for v in values]}
            if scores:
                passes = COMPARISONS[self.head["comparison"]]
                result["selected"] = [lab for lab, v, t in zip(self.labels, values, thresholds) if passes(v, t)]
            else:
                result["label"] = self.labels[int(np.argmax(values))]
            if enc.windows is not None:
                result["windows"] = [{"start": a, "end": b, key: [float(v) for v in w]}
                                     for (a, b), w in zip(enc.windows, per_window)]
            return result
        if self.kind == "task-grounded":
            row, logits = enc.rows[0], outs[0]["logits"]
            answer = [p for p, s in enumerate(row.sequence_ids) if s == 1]
            positive = softmax(logits[answer])[:, int(self.head["positive"])]
            threshold = float(self.head["threshold"]) if span_threshold is None else span_threshold
            passes = COMPARISONS[self.head["comparison"]]
            spans = positive_runs(positive, row.offsets[answer], item.pair or "", self.labels[self.head["positive"]],
                                  lambda p: passes(p, threshold))
            return {"spans": [s.body() for s in spans]}
        probs, offsets = pick_token_rows([(softmax(o["logits"]), row) for o, row in zip(outs, enc.rows)], 0)
        return bio_answer(probs, offsets, self.labels, item.text, span_threshold, enc.windows)

    # embeddings --------------------------------------------------------------------------------

    def _plan_embeddings(self, req: EmbeddingsRequest) -> Plan:
        if req.modalities != {"text"}:
            raise modality_unsupported(req.modalities, ("text",))
        full = int(self.head["dimension"])
        dims = req.dimensions or full
        if dims not in self.head["dimensions"]:
            raise invalid_request(f"dimensions must be one of {sorted(self.head['dimensions'])} for this model, "
                                  f"not {dims}")
        layer = req.layer if req.layer is not None else max(self.layers)
        if layer not in self.layers:
            raise invalid_request(f"layer must be one of {sorted(self.layers)} for this model, not {layer}")
        if req.options.overflow == "window":
            raise invalid_request("embeddings take overflow reject or truncate")
        output, pooling, normalized = self.layers[layer], self.head["pooling"], bool(self.head["normalize"])
        budget = token_budget(req.options.max_tokens, self.max_input_tokens)
        encoded: list[Encoded | ItemError] = []
        for text in req.inputs:
            result = self.text.encode(text, max_tokens=budget, overflow=req.options.overflow or "reject")
            encoded.append(ItemError(result.code, result.message) if isinstance(result, InputError) else result)
        rows = [e.rows[0] for e in encoded if isinstance(e, Encoded)]

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            items: list[Embedded] = []
            rows_out = iter(ran(outputs))
            for enc in encoded:
                enc = outcome(enc, outputs)
                if isinstance(enc, ItemError):
                    items.append(enc)
                    continue
                vector = embed(next(rows_out)[output], pooling, normalized, None if dims == full else dims)
                items.append((vector, InputUsage.of(enc)))
            return embeddings_body(items, req.encoding_format)

        representation = {"model_sha256": self.digest, "layer": layer, "dimension": dims, "normalized": normalized,
                          "modality": "text"}
        return Plan(rows, finish, sum(e.tokens for e in encoded if isinstance(e, Encoded)),
                    extras={"representation": representation})

    # rerank --------------------------------------------------------------------------------

    def _plan_rerank(self, req: RerankRequest) -> Plan:
        default = self.head["default"]
        layer = req.layer if req.layer is not None else int(default["layer"])
        dimension = req.dimensions if req.dimensions is not None else int(default["dimension"])
        if {"layer": layer, "dimension": dimension} not in self.head["exits"]:
            served = ", ".join(f"{e['layer']}/{e['dimension']}" for e in self.head["exits"])
            raise invalid_request(f"layer {layer} and dimensions {dimension} are not a pair-scorer exit of this "
                                  f"model ({served})")
        budget = token_budget(req.options.max_tokens, self.max_input_tokens)
        encoded: list[Encoded | ItemError] = []
        for document in req.documents:
            if not document.strip():
                encoded.append(ItemError("invalid_input", "the document is blank"))
                continue
            result = self.text.encode(req.query, document, max_tokens=budget,
                                      overflow=req.options.overflow or "reject")
            encoded.append(ItemError(result.code, result.message) if isinstance(result, InputError) else result)
        rows = [e.rows[0] for e in encoded if isinstance(e, Encoded)]
        output = self.head["output"]

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            scored: list[dict[str, Any]] = []
            failed: list[dict[str, Any]] = []
            usages = []
            rows_out = iter(ran(outputs))
            for index, enc in enumerate(encoded):
                document = {"document": {"text": req.documents[index]}} if req.return_documents else {}
                enc = outcome(enc, outputs)
                if isinstance(enc, ItemError):
                    failed.append(failed_item(index, enc, relevance_score=None, **document))
                    continue
                logit = relevance_logit(self.head, self.weights, next(rows_out)[output], layer, dimension)
                usage = InputUsage.of(enc)
                usages.append(usage)
                scored.append({"index": index, "relevance_score": float(sigmoid(np.array([logit]))[0]),
                               "logit": logit, **document, "input": usage.body()})
            scored.sort(key=lambda e: (-e["relevance_score"], e["index"]))
            if req.top_n is not None:
                scored = scored[: req.top_n]
            return {"results": scored + failed, "usage": request_usage(usages, "input_tokens")}

        return Plan(rows, finish, sum(e.tokens for e in encoded if isinstance(e, Encoded)))
