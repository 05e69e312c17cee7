"""Request-shape validation in the System One standard's terms (a 422 with a ``detail`` list).

The System One standard answers a body whose shape is wrong as FastAPI does: 422 with
``{"detail": [{"loc": ["body", ...], "msg", "type"}]}``, types as pydantic names them (``missing``,
``dict_type``, ``too_short``, ``json_invalid``...). Under vllm-sr/5.0, /v1/systemone answers the
same way for a body that is not JSON and for a missing, wrongly typed or empty ``state`` or
``questions``; everything else keeps its own error (an unknown member stays 400 naming it, a bad
question is ``question_failed``). No Sanic, no model access.
"""

from __future__ import annotations

from typing import Any

from edge_runtime.errors import ApiError

Issue = dict[str, Any]


class JsonInvalid(ApiError):
    """invalid_request (400) for a body that is not JSON; ``pos`` is where decoding failed (a byte offset)."""

    def __init__(self, message: str, pos: int) -> None:
        super().__init__("invalid_request", message)
        self.pos = pos

    def issues(self) -> list[Issue]:
        return [{"loc": ["body", self.pos], "msg": "JSON decode error", "type": "json_invalid"}]


class ShapeInvalid(ApiError):
    """A request whose shape is wrong (422 under System One 5.0); ``issues`` is the standard's ``detail`` list."""

    def __init__(self, issues: list[Issue]) -> None:
        if not issues:
            raise ValueError("ShapeInvalid needs at least one issue")
        where = "; ".join(f"{'.'.join(str(p) for p in i['loc'][1:]) or 'body'}: {i['msg']}" for i in issues)
        super().__init__("invalid_request", f"the request is malformed: {where}", reason=issues[0]["type"])
        self.issues = issues


def _entry_issues(entry: Any, loc: list[str | int]) -> list[Issue]:
    """The shape issues of one standard request (the body, or one entry of ``states``)."""
    if not isinstance(entry, dict):
        return [{"loc": loc, "msg": "Input should be a valid dictionary", "type": "dict_type"}]
    issues: list[Issue] = []
    if "state" not in entry:
        issues.append({"loc": [*loc, "state"], "msg": "Field required", "type": "missing"})
    elif not isinstance(entry["state"], (str, dict, list)):
        issues.append({"loc": [*loc, "state"], "msg": "Input should be a valid string, object or array",
                       "type": "string_type"})
    questions = entry.get("questions")
    if "questions" not in entry:
        issues.append({"loc": [*loc, "questions"], "msg": "Field required", "type": "missing"})
    elif not isinstance(questions, dict):
        issues.append({"loc": [*loc, "questions"], "msg": "Input should be a valid dictionary", "type": "dict_type"})
    elif not questions:
        issues.append({"loc": [*loc, "questions"],
                       "msg": "Dictionary should have at least 1 item after validation, not 0", "type": "too_short"})
    return issues


def systemone_shape_issues(body: Any) -> list[Issue]:
    """The shape issues of a System One request body, standard or batch (``states``) form."""
    if not isinstance(body, dict) or "states" not in body:
        return _entry_issues(body, ["body"])
    states = body["states"]
    if not isinstance(states, dict):
        return [{"loc": ["body", "states"], "msg": "Input should be a valid dictionary", "type": "dict_type"}]
    if not states:
        return [{"loc": ["body", "states"], "msg": "Dictionary should have at least 1 item after validation, not 0",
                 "type": "too_short"}]
    issues: list[Issue] = []
    for name, entry in states.items():
        issues.extend(_entry_issues(entry, ["body", "states", name]))
    return issues


def check_systemone_shape(body: Any) -> None:
    """Raise ShapeInvalid (422) when a System One request's shape is wrong."""
    issues = systemone_shape_issues(body)
    if issues:
        raise ShapeInvalid(issues)
