"""Answering POST /v1/systemone and /v1/systemone/batch as System One answers them.

A System One request takes the decisions path (:func:`edge_runtime.service.serve`), and its
answer body is then judged as a whole: every answer a client receives has its question's type,
so a request any of whose questions failed fails with ``question_failed``. The first failed
question (in entry order, then question order) decides the status and the flat fields, and the
message lists every failure (the statuses are api/statuses.py's QUESTION_ERROR_STATUS):

    invalid_question 422; max_length_exceeded, scan_budget_exceeded, invalid_input 400;
    invalid_model_output 500; unavailable 503; deadline_exceeded 504.

Errors take the process's System One schema:

- vllm-sr/5.0: the standard's ``detail`` (a list of validation issues on a 422,
  ``{"error_type", "message"}`` otherwise) with the flat ``code``, ``question_error``,
  ``question``, ``state``, ``reason`` and ``limit`` beside it; overloaded is 529. A body that is
  not JSON, or whose ``state`` or ``questions`` is missing, wrongly typed or empty, is a 422 with
  the standard's issues (:mod:`edge_runtime.requests.validation`); an unknown member stays 400.
- vllm-sr/4.0: the runtime's ``{"error": {...}}`` with ``detail`` and the flat fields beside it;
  overloaded is 429.

Both carry Retry-After where the runtime's error does (overloaded 1 s, not_ready 5 s).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from edge_runtime.api.statuses import OVERLOADED_SYSTEMONE_5, as_api_error, retry_headers, status_of
from edge_runtime.engine.errors import EngineError
from edge_runtime.errors import ApiError, FailedQuestion, QuestionFailed
from edge_runtime.requests.decisions import NoValidQuestion
from edge_runtime.requests.systemone import (
    SCHEMA_5,
    check_schema,
    internal_body,
    long_context_header,
    parse_systemone_batch,
)
from edge_runtime.requests.validation import JsonInvalid, ShapeInvalid, check_systemone_shape
from edge_runtime.service import serve
from edge_runtime.timing import Timing
from edge_runtime.work import admit_whole

Response = tuple[int, dict[str, Any], dict[str, str]]


# ---- judging a decisions answer -------------------------------------------------------------


def failed_questions(answer: Mapping[str, Any]) -> list[FailedQuestion]:
    """Every failed question of a decisions answer body (standard or ``states``), in order."""
    if "states" in answer:
        entries = [(name, body.get("answers", {})) for name, body in answer["states"].items()]
    else:
        entries = [(None, answer.get("answers", {}))]
    failed = []
    for state, answers in entries:
        for qid, a in answers.items():
            if isinstance(a, dict) and "error" in a:
                failed.append(FailedQuestion(state, qid, a.get("type"), str(a["error"]),
                                             str(a.get("reason") or a["error"]), str(a.get("message", ""))))
    return failed


def systemone_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """The decisions answer itself when every question was answered; raises QuestionFailed otherwise."""
    failed = failed_questions(answer)
    if failed:
        raise QuestionFailed(failed)
    return answer


def from_no_valid_question(exc: NoValidQuestion) -> QuestionFailed:
    """A request none of whose questions is valid, as System One reports it (422, invalid_question)."""
    return QuestionFailed([FailedQuestion(state, q.id, q.type, q.error, q.reason, q.message)
                           for state, q in exc.failed])


# ---- errors in the schema's shape -----------------------------------------------------------


def _issues(exc: ApiError) -> list[dict[str, Any]]:
    """A 422's detail list: one issue per failed question, else one for the whole request."""
    if isinstance(exc, ShapeInvalid):
        return exc.issues
    if isinstance(exc, QuestionFailed):
        issues = []
        for f in exc.failed:
            loc: list[str | int] = ["body"] if f.state is None else ["body", "states", f.state]
            loc += ["questions", f.question]
            if f.type is not None:
                loc.append(f.type)  # the discriminator tag sits after the ID, as the standard writes it
            issues.append({"loc": loc, "msg": f.message, "type": f.reason})
        return issues
    loc = ["body", "model"] if exc.code == "unsupported_surface" else ["body"]
    return [{"loc": loc, "msg": exc.message, "type": exc.reason or exc.code}]


def _flat(exc: ApiError) -> dict[str, Any]:
    flat: dict[str, Any] = {"code": exc.code}
    if isinstance(exc, QuestionFailed):
        flat["question_error"] = exc.question_error
    if isinstance(exc, (QuestionFailed, NoValidQuestion)):
        flat["question"] = exc.question
        if exc.state is not None:
            flat["state"] = exc.state
    if exc.reason is not None:
        flat["reason"] = exc.reason
    if exc.limit is not None:
        flat["limit"] = exc.limit
    return flat


def systemone_error(error: ApiError | EngineError, schema: str) -> Response:
    """(status, body, headers) of a request-level error in the schema's shape."""
    check_schema(schema)
    exc = as_api_error(error)
    if isinstance(exc, NoValidQuestion):
        exc = from_no_valid_question(exc)
    if isinstance(exc, JsonInvalid) and schema == SCHEMA_5:
        exc = ShapeInvalid(exc.issues())  # the standard answers a body that is not JSON 422 json_invalid
    status = status_of(exc)
    detail: Any = _issues(exc) if status == 422 else {"error_type": exc.code, "message": exc.message}
    if schema == SCHEMA_5:
        if exc.code == "overloaded":
            status = OVERLOADED_SYSTEMONE_5
        body = {"detail": detail, **_flat(exc)}
    else:
        body = {"error": exc.body()["error"], "detail": detail, **_flat(exc)}
    return status, body, retry_headers(exc)


# ---- serving --------------------------------------------------------------------------------


async def _answer_one(runtime: Any, body: Any, timing: Timing, schema: str, long_context: bool) -> Response:
    """One System One request: decode, take the decisions path, judge the answer."""
    try:
        internal = internal_body(body, schema, long_context)  # an unknown member stays 400, named
        if schema == SCHEMA_5:
            check_systemone_shape(body)  # 422 with the standard's detail list
        answer = await serve(runtime, "decisions", internal, timing)
        return 200, systemone_answer(answer), {}
    except (ApiError, EngineError) as exc:
        return systemone_error(exc, schema)


async def _answer_batch(runtime: Any, body: Any, timing: Timing, schema: str, long_context: bool) -> Response:
    """Named requests, each answered (concurrently) as it would be alone, under ``responses``."""
    named = parse_systemone_batch(body, runtime.config.max_bundle_tasks)
    timings = [Timing() for _ in named]
    admit_whole()  # as a bundle is: no request refused for a queue its siblings fill

    async def one(i: int) -> tuple[Response, float]:
        result = await _answer_one(runtime, named[i][1], timings[i], schema, long_context)
        return result, time.perf_counter()

    done = await asyncio.gather(*(one(i) for i in range(len(named))))
    responses: dict[str, Any] = {}
    for (name, _), ((status, answer, _headers), _) in zip(named, done):
        responses[name] = answer if status == 200 else {**answer, "status": status}
    # As a bundle does: the tokenizing of every request, the model phases of the one answered last.
    last = max(range(len(done)), key=lambda i: done[i][1])
    timing.add("tokenize", sum(t.seconds["tokenize"] for t in timings))
    t = timings[last].seconds
    timing.set_model_phases(t["queue"], t["forward"], t["post"])
    return 200, {"responses": responses}, {}


async def serve_systemone(
    runtime: Any, body: Any, timing: Timing, schema: str, headers: Mapping[str, str], batch: bool
) -> Response:
    """Answer POST /v1/systemone (``batch`` False) or /v1/systemone/batch in the process's schema.

    ``body`` is the decoded JSON; ``headers`` the request's headers (any case). Returns the status,
    the response body and the extra response headers (Retry-After); never raises ApiError.
    """
    check_schema(schema)
    try:
        long_context = long_context_header(headers)
        if batch:
            return await _answer_batch(runtime, body, timing, schema, long_context)
        return await _answer_one(runtime, body, timing, schema, long_context)
    except (ApiError, EngineError) as exc:
        return systemone_error(exc, schema)


__all__ = ["failed_questions", "from_no_valid_question", "serve_systemone", "systemone_answer", "systemone_error"]
