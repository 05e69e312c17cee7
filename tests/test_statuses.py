"""The one error model: every code raised anywhere has its status in api/statuses.py, and engine errors map there."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import edge_runtime
from edge_runtime.api.statuses import STATUS_OF, as_api_error, retry_headers, status_of
from edge_runtime.engine.errors import EngineError, ExecutorClosed, ForwardError, Overloaded, RequestTooLarge
from edge_runtime.errors import ApiError, FailedQuestion, QuestionFailed

PACKAGE = Path(edge_runtime.__file__).parent


def _raised_codes() -> set[str]:
    """The first argument of every ApiError(...) call in the server's source."""
    codes = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ApiError"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                codes.add(node.args[0].value)
    return codes


def test_every_code_raised_has_a_status() -> None:
    codes = _raised_codes()
    assert {"invalid_request", "model_not_found", "unsupported_surface"} <= codes  # the scan sees the calls
    assert codes <= set(STATUS_OF), codes - set(STATUS_OF)


def test_no_module_outside_api_chooses_a_status() -> None:
    for path in PACKAGE.rglob("*.py"):
        if "api" in path.relative_to(PACKAGE).parts:
            continue
        text = path.read_text()
        for word in ("status_code", "STATUS_OF", "Retry-After", "status_of"):
            assert word not in text, f"{path} mentions {word}"


@pytest.mark.parametrize(("error", "code", "status"), [
    (Overloaded("model m has 3 jobs waiting"), "overloaded", 429),
    (RequestTooLarge("model m: the request's forward ran out of memory"), "request_too_large", 413),
    (ExecutorClosed("model m is shut down"), "not_ready", 503),
    (ForwardError("model m: the forward failed"), "internal_error", 500),
    (EngineError("something new"), "internal_error", 500),
])
def test_engine_errors_map_in_one_place(error: EngineError, code: str, status: int) -> None:
    api = as_api_error(error)
    assert (api.code, status_of(api)) == (code, status)
    assert retry_headers(api) == ({"Retry-After": "1"} if code == "overloaded"
                                  else {"Retry-After": "5"} if code == "not_ready" else {})


def test_question_failed_takes_its_first_question_status() -> None:
    failed = [FailedQuestion(None, "a", "choice", "deadline_exceeded", "deadline_exceeded", "late"),
              FailedQuestion(None, "b", "noul", "invalid_question", "question_malformed", "bad")]
    assert status_of(QuestionFailed(failed)) == 504
    assert status_of(QuestionFailed(failed[1:])) == 422
    assert status_of(QuestionFailed([FailedQuestion(None, "c", None, "new_error", "x", "?")])) == 500


def test_route_reasons_and_unknown_codes() -> None:
    assert status_of(ApiError("invalid_request", "no route GET /x", "route_not_found")) == 404
    assert status_of(ApiError("invalid_request", "no route PUT /health", "method_not_allowed")) == 405
    with pytest.raises(KeyError):
        status_of(ApiError("made_up", "a code nobody listed"))
