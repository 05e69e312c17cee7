"""A request stage's calls as the Router sends them: one /v1/bundle per part of at most the process's
max_bundle_tasks (bundle.go ``Bundle.sendLocked``), each result read as its own surface call; and the
Server-Timing every exchange carries (timing.go)."""

from __future__ import annotations

from typing import Any

from tests.router import api
from tests.router.client import (
    Question,
    bind_head,
    bundle_parts,
    check_classify_results,
    check_embeddings,
    check_relevance,
    checked_answers,
    classify_request,
    content_part,
    decisions_request,
    decode_embed,
    decode_rerank,
    embed_request,
    exchange,
    rerank_request,
    send_bundle,
    server_timing,
    status_error,
)
from tests.router.conftest import BUNDLE_CAP, DECIDERS, Router

STATE = "I was charged twice for one order."
QUESTIONS = [Question("domain", "choice", "Which domain?", choices=[("billing", "Payments"), ("other", "")]),
             Question("urgent", "noul", "Is it urgent?")]


def stage(router: Router) -> list[tuple[dict[str, Any], Any]]:
    """One task per surface and model, and the check the Router applies to its result."""
    tasks: list[tuple[dict[str, Any], Any]] = []
    for name, kind in (("cls", "sequence"), ("ml", "scores"), ("tok", "token")):
        head = bind_head(router.card(name), "", kind, "text")

        def check_classify(result: api.BundleResult, head: api.HeadCard = head) -> None:
            assert result.classify is not None
            assert all(r.error is None for r in check_classify_results(result.classify, 2, head))

        tasks.append(({"classify": classify_request(name, [{"text": STATE}, {"text": "short"}], head=head.name)},
                      check_classify))
    for name in ("emb", "minilm-embedding", "siglip"):

        def check_embed(result: api.BundleResult) -> None:
            assert result.embeddings is not None
            check_embeddings(decode_embed(result.embeddings), 2)

        tasks.append(({"embeddings": embed_request(name, [content_part(STATE), content_part("x")])}, check_embed))

    def check_rerank(result: api.BundleResult) -> None:
        assert result.rerank is not None
        check_relevance(decode_rerank(result.rerank, 2))

    tasks.append(({"rerank": rerank_request("rr", STATE, ["a refund", "a parcel"], overflow="reject")}, check_rerank))
    for name in DECIDERS:

        def check_decide(result: api.BundleResult) -> None:
            assert result.decisions is not None
            answers = checked_answers(result.decisions, QUESTIONS)
            assert set(answers) == {"domain", "urgent"} and not any(a.error for a in answers.values()), answers

        tasks.append(({"decisions": decisions_request(name, STATE, QUESTIONS, router.card(name))}, check_decide))
    return tasks


def test_a_stage_split_at_the_process_limit(router: Router) -> None:
    limit = router.models.limits.max_bundle_tasks
    assert limit == BUNDLE_CAP
    tasks = stage(router)
    parts = bundle_parts([task for task, _ in tasks], limit)
    assert len(parts) > 1 and all(len(part) <= limit for part in parts)
    checks = iter(check for _, check in tasks)
    for part in parts:
        for result in send_bundle(router.server.client, part):
            status_error(result.status, result.error)
            next(checks)(result)


def test_a_bundle_over_the_limit_is_refused_whole(router: Router) -> None:
    tasks = [{"id": str(i), "embeddings": embed_request("emb", [content_part("x")])} for i in range(BUNDLE_CAP + 1)]
    ex = exchange(router.server.client, "/v1/bundle", {"tasks": tasks})
    assert ex.status == 413 and isinstance(ex.body, api.ErrorResponse)
    assert ex.body.error.code == "request_too_large" and ex.body.error.message


def test_every_exchange_reports_its_time(router: Router) -> None:
    """timing.go: every surface answer, errors included, carries a Server-Timing total and known phases."""
    calls = [
        ("/v1/classify", classify_request("cls", [{"text": STATE}])),
        ("/v1/embeddings", embed_request("emb", [content_part(STATE)])),
        ("/v1/rerank", rerank_request("rr", STATE, ["doc"])),
        ("/v1/decisions", decisions_request("sparrow-nano", STATE, QUESTIONS, router.card("sparrow-nano"))),
        ("/v1/bundle", {"tasks": [{"id": "1", "classify": classify_request("cls", [{"text": STATE}])}]}),
        ("/v1/classify", classify_request("missing-model", [{"text": STATE}])),
    ]
    for path, body in calls:
        headers = router.server.client.post(path, json=body).headers
        timing = server_timing(headers)
        assert timing.reported and timing.total >= 0, (path, headers.get("server-timing"))
        assert set(timing.phases) == {"parse", "tokenize", "queue", "forward", "post", "serialize"}, path
        assert sum(timing.phases.values()) <= timing.total + 0.01, (path, timing)
