"""POST /v1/bundle: several surface requests in one call, each answered with the status it would have alone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from edge_runtime.api.statuses import as_api_error, status_of
from edge_runtime.engine.errors import EngineError
from edge_runtime.errors import ApiError, invalid_request
from edge_runtime.requests.common import check_count, reject_unknown, require_object
from edge_runtime.runtime import Runtime
from edge_runtime.service import deadline_at, serve
from edge_runtime.timing import Timing
from edge_runtime.work import admit_whole

BUNDLE_SURFACES = ("classify", "embeddings", "rerank", "decisions")


async def serve_bundle(runtime: Runtime, body: Any, timing: Timing) -> dict[str, Any]:
    """Several surface requests in one call; each task answered with the status it would have alone."""
    body = require_object(body)
    reject_unknown(body, {"tasks", "options"}, "bundle requests")
    tasks = body.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise invalid_request("tasks must be a non-empty list")
    check_count(len(tasks), "tasks", runtime.config.max_bundle_tasks)
    options = require_object(body.get("options") or {}, "options")
    reject_unknown(options, {"deadline_ms", "return_meta"}, "bundle options")
    bundle_meta = options.get("return_meta", False)
    if not isinstance(bundle_meta, bool):
        raise invalid_request("options.return_meta must be a boolean")
    deadline_ms = options.get("deadline_ms")
    if deadline_ms is not None and (
        isinstance(deadline_ms, bool) or not isinstance(deadline_ms, (int, float)) or deadline_ms <= 0
    ):
        raise invalid_request("options.deadline_ms must be a number > 0")
    deadline = deadline_at(deadline_ms, time.monotonic())
    parsed: list[tuple[str, str, Any]] = []
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        task = require_object(task, f"tasks[{i}]")
        task_id = task.get("id")
        if not isinstance(task_id, str) or not task_id:
            raise invalid_request(f"tasks[{i}].id must be a non-empty string")
        if task_id in seen:
            raise invalid_request(f"tasks[{i}].id {task_id!r} is repeated")
        seen.add(task_id)
        surfaces = [k for k in task if k != "id"]
        if len(surfaces) != 1 or surfaces[0] not in BUNDLE_SURFACES:
            raise invalid_request(f"tasks[{i}] must hold its id and exactly one of {list(BUNDLE_SURFACES)}")
        request = task[surfaces[0]]
        if bundle_meta and isinstance(request, dict):
            # The bundle's return_meta is every task's default; a task may still say otherwise.
            task_options = request.get("options")
            if task_options is None or isinstance(task_options, dict):
                request = {**request, "options": {"return_meta": True, **(task_options or {})}}
        parsed.append((task_id, surfaces[0], request))

    timings = [Timing() for _ in parsed]
    # Admitted whole: no task is refused for a queue its own siblings fill (work.admit_whole).
    admit_whole()

    async def one(index: int) -> tuple[dict[str, Any], float]:
        task_id, surface, request = parsed[index]
        try:
            answer = await serve(runtime, surface, request, timings[index], deadline)
            result = {"id": task_id, "status": 200, surface: answer}
        except (ApiError, EngineError) as exc:
            error = as_api_error(exc)
            result = {"id": task_id, "status": status_of(error), "error": error.body()["error"]}
        return result, time.perf_counter()

    done = await asyncio.gather(*(one(i) for i in range(len(parsed))))
    last = max(range(len(done)), key=lambda i: done[i][1])
    t = timings[last].seconds
    timing.add("tokenize", sum(x.seconds["tokenize"] for x in timings))
    timing.set_model_phases(t["queue"], t["forward"], t["post"])
    return {"results": [r for r, _ in done]}
