"""Validation of the encoder surfaces: /v1/classify, /v1/embeddings and /v1/rerank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_runtime.errors import invalid_request
from edge_runtime.requests.common import (
    Options,
    check_count,
    model_name,
    parse_options,
    reject_unknown,
    require_object,
    text_list,
)
from edge_runtime.requests.embedding_inputs import EmbeddingInput, embedding_inputs, modality_of


@dataclass(frozen=True)
class TextItem:
    """One classify input: a text, an optional pair, and whether it is a grounded answer.

    A grounded item {context, question, answer} reads as the pair (context + question, answer), so
    its spans fall on the answer and their offsets count from the answer's start; ``context`` and
    ``question`` keep its parts for a model that frames them its own way (a grounding template).
    """

    text: str
    pair: str | None = None
    grounded: bool = False
    context: str = ""
    question: str = ""


@dataclass(frozen=True)
class ClassifyRequest:
    model: str | None
    items: tuple[TextItem, ...]
    options: Options
    head: str | None = None

    #: Classify inputs are text: no media to decode.
    has_media = False


@dataclass(frozen=True)
class EmbeddingsRequest:
    """inputs holds the texts when every input is text; parts holds every input (text, image, audio)."""

    model: str | None
    inputs: tuple[str, ...]
    encoding_format: str
    dimensions: int | None
    layer: int | None
    options: Options
    parts: tuple[EmbeddingInput, ...] = ()
    input_type: str | None = None

    @property
    def modalities(self) -> frozenset[str]:
        """The modalities the inputs use."""
        return frozenset(modality_of(p) for p in self.parts) if self.parts else frozenset({"text"})

    @property
    def has_media(self) -> bool:
        """Whether an input is an image or audio: media to decode."""
        return self.modalities != {"text"}


@dataclass(frozen=True)
class RerankRequest:
    model: str | None
    query: str
    documents: tuple[str, ...]
    top_n: int | None
    return_documents: bool
    options: Options
    layer: int | None = None
    dimensions: int | None = None

    #: Rerank inputs are text: no media to decode.
    has_media = False


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise invalid_request(f"{where} must be a string")
    return value


def _classify_item(value: Any, where: str) -> TextItem:
    if isinstance(value, str):
        return TextItem(value)
    obj = require_object(value, where)
    if "context" in obj or "answer" in obj:
        reject_unknown(obj, {"context", "question", "answer"}, where)
        context = _string(obj.get("context"), f"{where}.context")
        question = _string(obj.get("question", ""), f"{where}.question")
        answer = _string(obj.get("answer"), f"{where}.answer")
        return TextItem(f"{context}\n{question}" if question else context, answer, grounded=True,
                        context=context, question=question)
    reject_unknown(obj, {"text", "text_pair"}, where)
    text = _string(obj.get("text"), f"{where}.text")
    pair = obj.get("text_pair")
    return TextItem(text, None if pair is None else _string(pair, f"{where}.text_pair"))


def parse_classify(body: Any, max_inputs: int) -> ClassifyRequest:
    """Validate a /v1/classify body."""
    body = require_object(body)
    reject_unknown(body, {"model", "head", "input", "options"}, "classify requests")
    head = body.get("head")
    if head is not None and (not isinstance(head, str) or not head):
        raise invalid_request("head must be a non-empty string")
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise invalid_request("input must be a string or a non-empty list")
    check_count(len(raw), "input", max_inputs)
    items = tuple(_classify_item(v, f"input[{i}]") for i, v in enumerate(raw))
    options = parse_options(body.get("options"), extra=frozenset({"threshold"}))
    return ClassifyRequest(model_name(body), items, options, head)


def _optional_positive(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid_request(f"{key} must be a positive integer")
    return value


def _optional_layer(body: dict[str, Any]) -> int | None:
    layer = body.get("layer")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)):
        raise invalid_request("layer must be an integer")
    return layer


#: What an input is for: a model whose card lists no input_types reads both alike (it has no prompts).
INPUT_TYPES = ("query", "document")


def parse_embeddings(body: Any, max_inputs: int) -> EmbeddingsRequest:
    """Validate an OpenAI-compatible /v1/embeddings body (text, image_url and input_audio inputs)."""
    body = require_object(body)
    reject_unknown(
        body,
        {"model", "input", "encoding_format", "dimensions", "layer", "input_type", "user", "options"},
        "embeddings requests",
    )
    parts = embedding_inputs(body.get("input"), max_inputs)
    inputs = tuple(p for p in parts if isinstance(p, str))
    if len(inputs) != len(parts):
        inputs = ()  # media inputs: only a model with those towers reads them (EmbeddingsRequest.parts)
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise invalid_request("encoding_format must be float or base64")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid_request("user must be a string")
    layer = _optional_layer(body)
    input_type = body.get("input_type")
    if input_type is not None and input_type not in INPUT_TYPES:
        raise invalid_request(f"input_type must be one of {list(INPUT_TYPES)}")
    return EmbeddingsRequest(
        model_name(body),
        inputs,
        encoding,
        _optional_positive(body, "dimensions"),
        layer,
        parse_options(body.get("options"), overflows=("reject", "truncate")),
        parts,
        input_type,
    )


def parse_rerank(body: Any, max_inputs: int) -> RerankRequest:
    """Validate a /v1/rerank body."""
    body = require_object(body)
    reject_unknown(
        body,
        {"model", "query", "documents", "top_n", "return_documents", "layer", "dimensions", "options"},
        "rerank requests",
    )
    query = _string(body.get("query"), "query")
    raw = body.get("documents")
    if isinstance(raw, list):
        raw = [
            require_object(d, f"documents[{i}]").get("text") if isinstance(d, dict) else d
            for i, d in enumerate(raw)
        ]
    documents, _ = text_list(raw, "documents", max_inputs, allow_single=False)
    return_documents = body.get("return_documents", False)
    if not isinstance(return_documents, bool):
        raise invalid_request("return_documents must be a boolean")
    return RerankRequest(
        model_name(body),
        query,
        tuple(documents),
        _optional_positive(body, "top_n"),
        return_documents,
        parse_options(body.get("options"), overflows=("reject", "truncate")),
        _optional_layer(body),
        _optional_positive(body, "dimensions"),
    )
