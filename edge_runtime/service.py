"""Serving a surface request without HTTP: validate, pick the model, plan, execute, assemble.

The API layer only reads bodies and writes responses; everything between is here, so that a
bundle's tasks and System One requests take exactly the path each would take alone. Request-level
failures go up as typed errors (ApiError, the engine's errors); api/statuses.py decides statuses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from edge_runtime.engine.errors import EngineError, ForwardError
from edge_runtime.engine.result_cache import KeptAnswer, answer_key
from edge_runtime.errors import ApiError
from edge_runtime.families.base import Plan
from edge_runtime.loading import ServedModel
from edge_runtime.requests.decisions import parse_decisions_request
from edge_runtime.requests.encoder import parse_classify, parse_embeddings, parse_rerank
from edge_runtime.runtime import Runtime
from edge_runtime.timing import Timing
from edge_runtime.work import offloaded

Parser = Callable[[Any, int], Any]
PARSERS: dict[str, Parser] = {
    "classify": parse_classify,
    "embeddings": parse_embeddings,
    "rerank": parse_rerank,
    "decisions": parse_decisions_request,
}


def _resolve(runtime: Runtime, surface: str, body: Any) -> tuple[Any, ServedModel]:
    """Validate the request and resolve its model."""
    request = PARSERS[surface](body, runtime.config.max_inputs)
    return request, runtime.resolve(surface, request.model)


def _plan(surface: str, request: Any, model: ServedModel) -> Plan:
    """Plan the request's rows on its model: tokenization, and media decoding where it has media;
    then the rows' result-cache keys (hashing a row's pixels is media work too)."""
    family = model.family
    if family is None:  # a draining version released at its deadline after this request resolved it
        raise ApiError("not_ready", f"model {model.name!r} version {model.version_id} was released; retry")
    plan = family.plan(surface, request)
    cache = model.result_cache
    if cache is not None and cache.enabled and plan.rows:
        plan.keys = cache.keys(plan.rows)
    return plan


def _prepare(runtime: Runtime, surface: str, body: Any) -> tuple[Any, ServedModel, Plan]:
    """Validate, resolve the model and plan its rows: the request's CPU work before the engine.
    The model comes back held (Runtime.resolve): the caller releases it once answered."""
    request, model = _resolve(runtime, surface, body)
    try:
        return request, model, _plan(surface, request, model)
    except BaseException:
        model.release()
        raise


def server_fault(exc: ApiError | EngineError) -> bool:
    """Whether a failed request counts against its version (the watch after a promotion): a failed
    forward or an internal error does; a client's mistake, a full queue or a deadline does not."""
    return isinstance(exc, ForwardError) or (isinstance(exc, ApiError) and exc.code == "internal_error")


def deadline_at(deadline_ms: float | None, started: float) -> float | None:
    return None if deadline_ms is None else started + deadline_ms / 1000.0


def _kept(runtime: Runtime, surface: str, body: Any, started: float) -> tuple[bytes | None, dict[str, Any] | None]:
    """The request's key in its model's result cache (engine/result_cache.py) and the answer kept under
    it, when the version that would answer now answered it before; (key, None) otherwise (the request
    then takes the whole path, which also says what is wrong with a request that cannot be answered).
    The key is None when the model named keeps no answers: the body is not hashed for nothing."""
    name = body.get("model") if isinstance(body, dict) else None
    if name is not None and not isinstance(name, str):
        return None, None
    try:
        model = runtime.resolve(surface, name)
    except ApiError:
        return None, None
    try:
        cache = model.result_cache
        if cache is None or not cache.enabled:
            return None, None
        key = answer_key(surface, body)
        kept = cache.answer(key) if key is not None else None
        if kept is None:
            return key, None
        answer: dict[str, Any] = {"model": model.name, **orjson.loads(kept.body)}
    finally:
        model.release()
    model.stats.record(time.monotonic() - started, False)
    _answered(runtime, model, surface, body, kept.input_tokens)
    return key, answer


def _answered(runtime: Runtime, model: ServedModel, surface: str, body: Any, input_tokens: int) -> None:
    if runtime.on_answered is not None:
        runtime.on_answered(model, surface, body)
    if runtime.metrics is not None and input_tokens:
        runtime.metrics.input_tokens.labels(model.name).inc(input_tokens)


async def serve(
    runtime: Runtime, surface: str, body: Any, timing: Timing, bundle_deadline: float | None = None
) -> dict[str, Any]:
    """Answer one surface request; raises ApiError (or an engine error) for request-level failures.

    A small request answered before by the same version is answered from its result cache; a large
    one is not hashed on the loop (its rows still are, where they are planned). While it is answered
    it counts in ``runtime.answering`` (a lone request may run a short forward inline)."""
    runtime.answering += 1
    try:
        return await _serve(runtime, surface, body, timing, bundle_deadline)
    finally:
        runtime.answering -= 1


async def _serve(
    runtime: Runtime, surface: str, body: Any, timing: Timing, bundle_deadline: float | None
) -> dict[str, Any]:
    started = time.monotonic()
    key = None
    if not offloaded():
        key, kept = _kept(runtime, surface, body, started)
        if kept is not None:
            return kept
    with timing.phase("tokenize"):
        if offloaded():  # a large body: all of it in one hand-off
            request, model, plan = await runtime.work.run(_prepare, runtime, surface, body)
        else:
            # A small body is read here, but its media go to the pool: what an image or a video
            # costs to decode is not bounded by the body's size.
            request, model = _resolve(runtime, surface, body)
            run = runtime.work.offload if request.has_media else runtime.work.run
            try:
                plan = await run(_plan, surface, request, model)
            except BaseException:
                model.release()
                raise
    # From here the model is held: a version being drained finishes this request before it is freed.
    failed = False  # a client that went away (CancelledError) is not the version's fault
    try:
        deadline = deadline_at(request.options.deadline_ms, started)
        if bundle_deadline is not None:
            deadline = bundle_deadline if deadline is None else min(deadline, bundle_deadline)
        answer = await runtime.execute(model, plan, deadline, timing)
    except Exception as exc:
        failed = server_fault(exc) if isinstance(exc, (ApiError, EngineError)) else True
        raise
    finally:
        model.release()
        model.stats.record(time.monotonic() - started, failed)
    _answered(runtime, model, surface, body, plan.input_tokens)
    if plan.usage is not None:  # counted while planning (the decision families): not in their answers
        answer = {**answer, "usage": plan.usage}
    cache = model.result_cache
    if key is not None and cache is not None and plan.complete and not request.options.return_meta:
        cache.keep_answer(key, KeptAnswer(orjson.dumps(answer), len(plan.rows), plan.input_tokens))
    out: dict[str, Any] = {"model": model.name, **answer}
    if request.options.return_meta:
        out["meta"] = model.meta(timing, plan.extras)
    return out
