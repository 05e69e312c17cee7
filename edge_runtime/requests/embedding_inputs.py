"""/v1/embeddings inputs in OpenAI's content-part shapes: text, image_url and input_audio.

A string is text; {"type": "text", "text"} is text; {"type": "image_url", "image_url": {"url"}}
is an image (a base64 data: URL); {"type": "input_audio", "input_audio": {"data", "format"}} is a
clip (base64, wav | mp3 | flac | ogg). A list may mix them. Only shapes are checked here: decoding
and limits belong to the model that reads them (its card holds the limits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_runtime.errors import ApiError, invalid_request
from edge_runtime.requests.common import check_count, reject_unknown, require_object

AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg")


@dataclass(frozen=True)
class ImageInput:
    """An image part: its data URL as sent."""

    url: str


@dataclass(frozen=True)
class AudioInput:
    """An input_audio part: base64 data and the declared container format."""

    data: str
    format: str


EmbeddingInput = str | ImageInput | AudioInput


def modality_of(item: EmbeddingInput) -> str:
    """text, image or audio."""
    if isinstance(item, ImageInput):
        return "image"
    if isinstance(item, AudioInput):
        return "audio"
    return "text"


def modality_unsupported(asked: frozenset[str] | set[str], has: tuple[str, ...] | list[str]) -> ApiError:
    """invalid_request (400, reason modality_unsupported) for inputs of a modality the model has no
    tower for, naming the modalities it reads: the model serves embeddings, but not of this input (as
    a decisions request with an image for a text-only model is 400)."""
    missing = sorted(set(asked) - set(has))
    return ApiError("invalid_request",
                    f"this model does not read {', '.join(missing)} inputs; it reads {', '.join(sorted(has))}",
                    reason="modality_unsupported")


def _part(value: Any, where: str) -> EmbeddingInput:
    if isinstance(value, str):
        return value
    obj = require_object(value, where)
    kind = obj.get("type")
    if kind == "text":
        reject_unknown(obj, {"type", "text"}, where)
        text = obj.get("text")
        if not isinstance(text, str):
            raise invalid_request(f"{where}.text must be a string")
        return text
    if kind == "image_url":
        reject_unknown(obj, {"type", "image_url"}, where)
        inner = require_object(obj.get("image_url"), f"{where}.image_url")
        reject_unknown(inner, {"url", "detail"}, f"{where}.image_url")
        url = inner.get("url")
        if not isinstance(url, str) or not url:
            raise invalid_request(f"{where}.image_url.url must be a non-empty string")
        return ImageInput(url)
    if kind == "input_audio":
        reject_unknown(obj, {"type", "input_audio"}, where)
        inner = require_object(obj.get("input_audio"), f"{where}.input_audio")
        reject_unknown(inner, {"data", "format"}, f"{where}.input_audio")
        data, fmt = inner.get("data"), inner.get("format")
        if not isinstance(data, str) or not data:
            raise invalid_request(f"{where}.input_audio.data must be a non-empty base64 string")
        if fmt not in AUDIO_FORMATS:
            raise invalid_request(f"{where}.input_audio.format must be one of {list(AUDIO_FORMATS)}",
                                  reason="audio_format_unsupported")
        return AudioInput(data, fmt)
    raise invalid_request(f"{where}.type must be text, image_url or input_audio", reason="input_malformed")


def embedding_inputs(raw: Any, max_inputs: int) -> tuple[EmbeddingInput, ...]:
    """The inputs of an embeddings request, in order: a string, one part, or a non-empty list of them."""
    if isinstance(raw, (str, dict)):
        return (_part(raw, "input"),)
    if isinstance(raw, list) and raw and all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
        raise invalid_request("input as token ids is not supported; send text", reason="input_malformed")
    if not isinstance(raw, list) or not raw:
        raise invalid_request("input must be a string, a content part, or a non-empty list of them")
    check_count(len(raw), "input", max_inputs)
    return tuple(_part(v, f"input[{i}]") for i, v in enumerate(raw))
