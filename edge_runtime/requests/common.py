"""Shared request validation: options, model names, strict members. No I/O, no model access."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, cast

from edge_runtime.errors import ApiError, invalid_request

Overflow = Literal["reject", "truncate", "window"]
OVERFLOWS: tuple[Overflow, ...] = ("reject", "truncate", "window")


@dataclass(frozen=True)
class WindowOption:
    tokens: int
    overlap: int


@dataclass(frozen=True)
class Options:
    """The `options` member every surface takes."""

    return_meta: bool = False
    deadline_ms: float | None = None
    max_tokens: int | None = None
    overflow: Overflow | None = None
    window: WindowOption | None = None
    long_context: bool = False
    threshold: float | None = None


def require_object(body: Any, what: str = "request body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid_request(f"{what} must be a JSON object")
    return body


def reject_unknown(body: dict[str, Any], allowed: set[str], where: str) -> None:
    """Strict decoding: a member the surface does not define is a 400 that names it."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise invalid_request(f"{where} does not take {unknown}")


def model_name(body: dict[str, Any]) -> str | None:
    name = body.get("model")
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise invalid_request("model must be a non-empty string")
    return name


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise invalid_request(f"{where} must be an integer >= {minimum}")
    return value


def parse_options(
    raw: Any, overflows: tuple[str, ...] = OVERFLOWS, extra: frozenset[str] = frozenset()
) -> Options:
    """Validate `options`; `overflows` lists the policies this surface accepts."""
    if raw is None:
        return Options()
    opts = require_object(raw, "options")
    allowed = {"return_meta", "deadline_ms", "max_tokens"} | set(extra)
    if overflows:
        allowed |= {"overflow"}
    if "window" in overflows:
        allowed |= {"window"}
    reject_unknown(opts, allowed, "options")
    return_meta = opts.get("return_meta", False)
    if not isinstance(return_meta, bool):
        raise invalid_request("options.return_meta must be a boolean")
    deadline = opts.get("deadline_ms")
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(
            deadline
        ) or deadline <= 0:
            raise invalid_request("options.deadline_ms must be a number > 0")
        deadline = float(deadline)
    max_tokens = opts.get("max_tokens")
    if max_tokens is not None:
        max_tokens = _int(max_tokens, "options.max_tokens", 1)
    overflow = opts.get("overflow")
    if overflow is not None and overflow not in overflows:
        raise invalid_request(f"options.overflow must be one of {list(overflows)}")
    overflow = cast(Overflow | None, overflow)  # checked against the surface's overflows just above
    window = None
    if "window" in opts:
        w = require_object(opts["window"], "options.window")
        reject_unknown(w, {"tokens", "overlap"}, "options.window")
        tokens = _int(w.get("tokens"), "options.window.tokens", 2)
        overlap = _int(w.get("overlap", 0), "options.window.overlap", 0)
        if overlap >= tokens:
            raise invalid_request("options.window.overlap must be smaller than options.window.tokens")
        window = WindowOption(tokens, overlap)
    long_context = opts.get("long_context", False)
    if not isinstance(long_context, bool):
        raise invalid_request("options.long_context must be a boolean")
    threshold = opts.get("threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0.0 <= threshold <= 1.0):
        raise invalid_request("options.threshold must be a number in [0, 1]")
    return Options(return_meta, deadline, max_tokens, overflow, window, long_context,
                   None if threshold is None else float(threshold))


def check_count(count: int, where: str, max_items: int) -> None:
    """More items than the process takes in one request is 413 request_too_large, with the limit."""
    if count > max_items:
        raise ApiError(
            "request_too_large", f"{where} has {count} items, at most {max_items}", limit=max_items
        )


def text_list(
    value: Any, where: str, max_items: int, allow_single: bool = True
) -> tuple[list[str], bool]:
    """A string or a non-empty list of strings; returns the list and whether a single string came."""
    if isinstance(value, str) and allow_single:
        return [value], True
    if not isinstance(value, list) or not value:
        raise invalid_request(f"{where} must be a string or a non-empty list of strings")
    check_count(len(value), where, max_items)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise invalid_request(f"{where}[{i}] must be a string")
    return value, False
