"""The /v1/embeddings response body, one builder for every embedding family (text encoders and
multimodal towers), so that the vectors, their encodings, the item errors and the usage read the
same whichever family answered."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import numpy as np

from edge_runtime.errors import ApiError, ItemError
from edge_runtime.families.items import InputUsage, failed_item, request_usage


def embedding_card(dimensions: Iterable[int], layers: Iterable[int], pooling: str | None, normalized: bool,
                   modalities: Iterable[str], input_types: Iterable[str] = ()) -> dict[str, Any]:
    """The card's ``embedding`` block: the dimensions (full first) and layers a request may ask for,
    pooling, normalization, modalities, and the input types that have a prompt of their own (none:
    the model reads queries and documents alike)."""
    return {"embedding": {"dimensions": sorted(set(dimensions), reverse=True), "layers": sorted(layers),
                          "pooling": pooling, "normalized": normalized, "modalities": list(modalities),
                          "input_types": sorted(input_types)}}


#: One input's outcome: its vector and coverage, or its error.
Embedded = tuple[np.ndarray, InputUsage] | ItemError


def embeddings_body(items: list[Embedded], encoding_format: str) -> dict[str, Any]:
    """``{object, data, usage}`` in the OpenAI shape, each item with its ``input`` coverage.

    A failed input keeps its place with ``embedding: null`` and its error code and message; a
    non-finite vector fails the request (``internal_error``): the model, not the input, is wrong.
    """
    data: list[dict[str, Any]] = []
    usages: list[InputUsage] = []
    for index, item in enumerate(items):
        if isinstance(item, ItemError):
            data.append(failed_item(index, item, object="embedding", embedding=None))
            continue
        vector, usage = item
        if not np.all(np.isfinite(vector)):
            raise ApiError("internal_error", "the model produced a non-finite embedding")
        value: Any = (base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
                      if encoding_format == "base64" else np.asarray(vector).tolist())
        usages.append(usage)
        data.append({"object": "embedding", "index": index, "embedding": value, "input": usage.body()})
    return {"object": "list", "data": data, "usage": request_usage(usages, "prompt_tokens")}
