"""System One compatibility: /v1/systemone and /v1/systemone/batch under vllm-sr/5.0 and vllm-sr/4.0.

Most tests run the real sparrow-nano package through Runtime and serve_systemone (no HTTP); one
test drives a real server with the official System One SDK, typesafe-sdk. Every body is checked
against the contract (openapi.yaml).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from converters.sparrow.export import build_sparrow_package
from edge_runtime.api.schema import request_validator, validate_response
from edge_runtime.api.statuses import status_of
from edge_runtime.api.systemone import failed_questions, serve_systemone, systemone_answer, systemone_error
from edge_runtime.config import ModelConfig, ServeConfig
from edge_runtime.engine import Overloaded
from edge_runtime.errors import ApiError
from edge_runtime.requests.systemone import (
    SCHEMA_4,
    SCHEMA_5,
    internal_body,
    long_context_header,
    parse_systemone_request,
)
from edge_runtime.runtime import Runtime
from edge_runtime.service import serve
from edge_runtime.timing import Timing
from tests.support.contract_examples import (
    DECISIONS_EXAMPLE_1,
    DECISIONS_EXAMPLE_2,
    DECISIONS_EXAMPLE_BATCH,
    SYSTEMONE_EXAMPLE_ASSETS,
    SYSTEMONE_EXAMPLE_MEDIA,
)
from tests.support.server_harness import Server, write_models_file

MODEL = "sparrow-nano"
SCHEMAS = (SCHEMA_5, SCHEMA_4)
MAX_REQUESTS = 4

# The contract's requests (tests/contract_examples.py), each copied with the model it names
# replaced by the one served here.
GOLDEN = {**DECISIONS_EXAMPLE_1, "model": MODEL}
SET_SPAN = {**DECISIONS_EXAMPLE_2, "model": MODEL}
STATES = {**DECISIONS_EXAMPLE_BATCH, "model": MODEL}
MEDIA = {**SYSTEMONE_EXAMPLE_MEDIA, "model": MODEL}
ASSETS = {**SYSTEMONE_EXAMPLE_ASSETS, "model": MODEL}
EXAMPLES = {"golden": GOLDEN, "set_span": SET_SPAN, "states": STATES, "media": MEDIA, "assets": ASSETS}


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sparrow_package(tmp_path_factory.mktemp("systemone"))


@pytest.fixture(scope="module")
def runtime(package: Path) -> Iterator[Runtime]:
    config = ServeConfig(models_file=package / "models.yaml",
                         # no result cache: the deadline and overload tests need the forward to run
                         models=(ModelConfig(name=MODEL, package=package, device="cpu", threads=1,
                                             result_cache_entries=0),),
                         max_bundle_tasks=MAX_REQUESTS)
    rt = Runtime(config)
    rt.load_all()
    assert rt.status() == "ready", rt.health()
    yield rt
    rt.models[MODEL].executor.close()


def call(runtime: Runtime, body: Any, schema: str = SCHEMA_5, headers: dict[str, str] | None = None,
         batch: bool = False) -> tuple[int, dict[str, Any], dict[str, str]]:
    """serve_systemone, with the response checked against the contract."""
    sent = copy.deepcopy(body)
    status, out, extra = asyncio.run(serve_systemone(runtime, body, Timing(), schema, headers or {}, batch))
    assert body == sent, "the request body was modified"
    validate_response("/v1/systemone/batch" if batch else "/v1/systemone", "post", status, out)
    return status, out, extra


def decisions(runtime: Runtime, body: Any) -> dict[str, Any]:
    return asyncio.run(serve(runtime, "decisions", copy.deepcopy(body), Timing()))


def with_questions(**questions: Any) -> dict[str, Any]:
    return {"model": MODEL, "state": "I was charged twice for my order. Please refund me.", "questions": questions}


NOUL = {"type": "noul", "instructions": "Is this about billing?"}
MALFORMED = {"type": "noul", "instructions": "Is it?", "colour": "red"}


# ---- answers ----------------------------------------------------------------------------------


def test_contract_examples_are_system_one_requests() -> None:
    validator = request_validator("/v1/systemone")
    for name, body in EXAMPLES.items():
        assert not list(validator.iter_errors(body)), name


@pytest.mark.parametrize("schema", SCHEMAS)
def test_golden_request_is_answered_as_decisions_answers_it(runtime: Runtime, schema: str) -> None:
    status, out, extra = call(runtime, GOLDEN, schema)
    assert status == 200 and extra == {}
    assert out == decisions(runtime, GOLDEN)
    answers = out["answers"]
    assert list(answers) == ["domain", "reasoning", "difficulty"]
    assert [a["type"] for a in answers.values()] == ["choice", "noul", "score"]
    assert answers["domain"]["choice"] in {"code", "math", "other"}
    assert answers["difficulty"]["legend"] == {"0": "Trivial", "1": "Moderate", "2": "Hard"}
    assert isinstance(out["usage"]["input_tokens"], int) and out["usage"]["input_tokens"] > 0


def test_standard_criteria_forms_and_structured_state(runtime: Runtime) -> None:
    """The System One standard's own forms: criteria maps and lists, null descriptions, object state."""
    body = {
        "model": MODEL,
        "state": {"message": "Please help, I was charged twice.", "subject": "Duplicate charge"},
        "questions": {
            "billing": {"type": "noul", "criteria": {"true": "The message is about billing"}},
            "tone": {"type": "choice", "instructions": ["What is", "the tone?"],
                     "criteria": {"calm": None, "angry": None}},
            "urgency": {"type": "score", "instructions": {"task": "How urgent?"},
                        "criteria": ["Can wait", {"level": "this week"}, "Today"]},
        },
    }
    status, out, _ = call(runtime, body)
    assert status == 200
    assert set(out["answers"]["tone"]["probabilities"]) == {"calm", "angry"}
    assert out["answers"]["urgency"]["legend"]["1"] == '{"level":"this week"}'
    assert "confidence" not in out["answers"]["billing"]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_batch_in_states_is_answered_per_entry(runtime: Runtime, schema: str) -> None:
    status, out, _ = call(runtime, STATES, schema)
    assert status == 200
    assert list(out["states"]) == ["doc_1", "doc_2"]
    assert out["usage"]["input_tokens"] == sum(s["usage"]["input_tokens"] for s in out["states"].values())


# ---- decoding ---------------------------------------------------------------------------------


def test_5_0_refuses_any_other_member_naming_it(runtime: Runtime) -> None:
    for member in ("roles", "temperature", "stream"):
        body = {**GOLDEN, member: None}
        status, out, _ = call(runtime, body)
        assert status == 400 and out["code"] == "invalid_request"
        assert repr(member) in out["detail"]["message"]
        assert out["detail"]["error_type"] == "invalid_request"


def test_4_0_reads_the_internal_form_with_roles(runtime: Runtime) -> None:
    body = {**GOLDEN, "state": {"user": "Merge two sorted lists."}, "roles": {"user": "user"}}
    assert call(runtime, body, SCHEMA_4)[0] == 200
    status, out, _ = call(runtime, {**GOLDEN, "temperature": 1.0}, SCHEMA_4)
    assert status == 400 and "'temperature'" in out["error"]["message"]


def test_object_state_without_roles_gives_no_part_a_role() -> None:
    body = {"state": {"request": "Refund?", "candidate": "30 days."}, "questions": {"q": NOUL}}
    five = parse_systemone_request(body, SCHEMA_5).single
    assert (five.roles_given, five.roles) == (True, None)
    four = parse_systemone_request(body, SCHEMA_4).single
    assert (four.roles_given, four.roles) == (False, None)  # absent: the keys name the parts
    batch = parse_systemone_request(STATES, SCHEMA_5)
    assert all(e.roles_given and e.roles is None for _, e in batch.entries())
    # An entry of states may still give its roles.
    named = copy.deepcopy(STATES)
    named["states"]["doc_1"]["roles"] = {"request": "user", "candidate": "context"}
    entries = dict(parse_systemone_request(named, SCHEMA_5).entries())
    assert entries["doc_1"].roles == {"request": "user", "candidate": "context"}
    assert entries["doc_2"].roles is None


def test_long_context_header_reads_a_long_context(runtime: Runtime) -> None:
    assert long_context_header({"typesafe-danger-zone-long-context": "true"}) is True
    assert long_context_header({"TypeSafe-Danger-Zone-Long-Context": " False "}) is False
    assert long_context_header({"Content-Type": "application/json"}) is False
    for schema in SCHEMAS:
        request = parse_systemone_request(GOLDEN, schema, long_context=True)
        assert request.options.long_context is True
        assert parse_systemone_request(GOLDEN, schema).options.long_context is False
    kept = internal_body({**GOLDEN, "options": {"deadline_ms": 5000}}, SCHEMA_5, long_context=True)
    assert kept["options"] == {"deadline_ms": 5000, "long_context": True}
    # sparrow-nano has no validated_input_tokens: a long context reads the same tokens.
    status, out, _ = call(runtime, GOLDEN, headers={"TypeSafe-Danger-Zone-Long-Context": "true"})
    assert status == 200 and out == call(runtime, GOLDEN)[1]
    status, out, _ = call(runtime, GOLDEN, headers={"TypeSafe-Danger-Zone-Long-Context": "yes"})
    assert status == 400 and "TypeSafe-Danger-Zone-Long-Context" in out["detail"]["message"]


def test_request_level_faults_stay_400(runtime: Runtime) -> None:
    for body in ({**GOLDEN, "options": {"stream": True}}, {**GOLDEN, "questions": {" ": NOUL}},
                 {**GOLDEN, "stream": True}, {"model": MODEL, "stream": True}):
        status, out, _ = call(runtime, body)
        assert status == 400 and out["code"] == "invalid_request", body
        assert isinstance(out["detail"], dict), body
    # Under vllm-sr/4.0 a request whose shape is wrong keeps today's 400 and its shape.
    for body in ({"model": MODEL, "questions": {"q": NOUL}}, {**GOLDEN, "questions": {}}, [GOLDEN]):
        status, out, _ = call(runtime, body, SCHEMA_4)
        assert status == 400 and out["error"]["code"] == "invalid_request", body


SHAPE_FAULTS = [
    ({"model": MODEL, "questions": {"q": NOUL}}, [(["body", "state"], "missing")]),
    ({"model": MODEL, "state": 3, "questions": {"q": NOUL}}, [(["body", "state"], "string_type")]),
    ({"model": MODEL, "state": "s"}, [(["body", "questions"], "missing")]),
    ({**GOLDEN, "questions": {}}, [(["body", "questions"], "too_short")]),
    ({**GOLDEN, "questions": ["q"]}, [(["body", "questions"], "dict_type")]),
    ({"model": MODEL}, [(["body", "state"], "missing"), (["body", "questions"], "missing")]),
    ([GOLDEN], [(["body"], "dict_type")]),
    ({"model": MODEL, "states": {"a": {"state": "s", "questions": {}}, "b": {"questions": {"q": NOUL}}}},
     [(["body", "states", "a", "questions"], "too_short"), (["body", "states", "b", "state"], "missing")]),
]


@pytest.mark.parametrize("body,want", SHAPE_FAULTS)
def test_a_malformed_shape_is_422_with_the_standard_detail_list(runtime: Runtime, body: Any, want: Any) -> None:
    status, out, _ = call(runtime, body)
    assert status == 422 and out["code"] == "invalid_request" and out["reason"] == want[0][1]
    assert [(i["loc"], i["type"]) for i in out["detail"]] == want
    assert all(i["msg"] for i in out["detail"]) and "error" not in out
    # In a batch, the entry fails alone with the status it would have had alone.
    status, out, _ = call(runtime, {"requests": {"bad": body, "good": GOLDEN}}, batch=True)
    assert status == 200 and out["responses"]["bad"]["status"] == 422 and "answers" in out["responses"]["good"]


# ---- failed questions -------------------------------------------------------------------------


@pytest.mark.parametrize("schema", SCHEMAS)
def test_an_invalid_question_fails_the_request(runtime: Runtime, schema: str) -> None:
    body = with_questions(billing=NOUL, bad=MALFORMED)
    status, out, _ = call(runtime, body, schema)
    assert status == 422
    flat = {"code": "question_failed", "question_error": "invalid_question", "reason": "question_malformed",
            "question": "bad"}
    assert {k: out[k] for k in flat} == flat
    assert out["detail"] == [{"loc": ["body", "questions", "bad", "noul"],
                              "msg": "noul questions do not take ['colour']", "type": "question_malformed"}]
    if schema == SCHEMA_4:
        assert out["error"] == {**flat, "message": "1 question failed: bad (invalid_question, question_malformed): "
                                                   "noul questions do not take ['colour']"}
    else:
        assert "error" not in out
    # /v1/decisions answers the same request in place.
    assert decisions(runtime, body)["answers"]["bad"]["error"] == "invalid_question"


def test_the_first_failed_question_decides_and_the_message_lists_all(runtime: Runtime) -> None:
    body = with_questions(tags={"type": "set", "labels": [{"key": "a"}]}, billing=NOUL, bad=MALFORMED)
    status, out, _ = call(runtime, body, SCHEMA_4)
    assert status == 422
    assert (out["question"], out["reason"]) == ("tags", "question_type_unsupported")
    assert "tags (invalid_question, question_type_unsupported)" in out["error"]["message"]
    assert "bad (invalid_question, question_malformed)" in out["error"]["message"]
    assert [issue["loc"][2] for issue in call(runtime, body)[1]["detail"]] == ["tags", "bad"]


def test_no_valid_question_is_question_failed_not_400(runtime: Runtime) -> None:
    for body in (with_questions(bad=MALFORMED), SET_SPAN):
        status, out, _ = call(runtime, body)
        assert status == 422 and out["code"] == "question_failed"
        assert out["question_error"] == "invalid_question"
    assert call(runtime, SET_SPAN)[1]["reason"] == "question_type_unsupported"


@pytest.mark.parametrize("schema", SCHEMAS)
def test_a_passed_deadline_is_504(runtime: Runtime, schema: str) -> None:
    status, out, _ = call(runtime, {**GOLDEN, "options": {"deadline_ms": 0.001}}, schema)
    assert status == 504
    assert (out["code"], out["question_error"], out["question"]) == ("question_failed", "deadline_exceeded", "domain")


def test_a_refused_batch_entry_fails_the_request_with_its_state(runtime: Runtime) -> None:
    body = copy.deepcopy(STATES)
    body["states"]["doc_2"]["images"] = MEDIA["images"]
    status, out, _ = call(runtime, body)
    assert status == 400
    assert {k: out[k] for k in ("code", "question_error", "reason", "question", "state")} == {
        "code": "question_failed", "question_error": "invalid_input", "reason": "input_malformed",
        "question": "relevance", "state": "doc_2"}
    assert out["detail"]["error_type"] == "question_failed"
    status, out, _ = call(runtime, body, SCHEMA_4)
    assert out["error"]["state"] == "doc_2" and out["state"] == "doc_2"


@pytest.mark.parametrize("schema", SCHEMAS)
def test_images_videos_and_assets_are_refused_on_a_text_model(runtime: Runtime, schema: str) -> None:
    videos_only = {k: v for k, v in MEDIA.items() if k != "images"}
    for body, reason in ((MEDIA, "image_unsupported"), (ASSETS, "image_unsupported"),
                         (videos_only, "video_unsupported")):
        status, out, _ = call(runtime, body, schema)
        assert (status, out["code"], out["reason"]) == (400, "invalid_request", reason)


def test_every_question_error_has_its_status() -> None:
    expected = {"invalid_question": 422, "max_length_exceeded": 400, "scan_budget_exceeded": 400,
                "invalid_input": 400, "invalid_model_output": 500, "unavailable": 503, "deadline_exceeded": 504}
    ok = {"type": "noul", "noul": 0.5}
    for code, want in expected.items():
        failed = {"type": "choice", "error": code, "reason": "some_reason", "message": "why"}
        answer = {"model": MODEL, "answers": {"a": ok, "b": failed, "c": {**failed, "error": "unavailable"}},
                  "usage": {"input_tokens": 3, "output_tokens": 0}}
        with pytest.raises(ApiError) as caught:
            systemone_answer(answer)
        assert (status_of(caught.value), caught.value.question, caught.value.question_error) == (want, "b", code)
        for schema in SCHEMAS:
            status, body, _ = systemone_error(caught.value, schema)
            assert status == want
            validate_response("/v1/systemone", "post", status, body)
    answered = {"model": MODEL, "answers": {"a": ok}, "usage": {"input_tokens": 3, "output_tokens": 0}}
    assert systemone_answer(answered) is answered and failed_questions(answered) == []


def test_request_errors_in_each_schema() -> None:
    surface = ApiError("unsupported_surface", "model 'x' does not serve decisions")
    status, body, _ = systemone_error(surface, SCHEMA_5)
    assert status == 422
    assert body == {"detail": [{"loc": ["body", "model"], "msg": surface.message, "type": "unsupported_surface"}],
                    "code": "unsupported_surface"}
    too_large = ApiError("request_too_large", "questions has 9 items, at most 8", limit=8)
    status, body, _ = systemone_error(too_large, SCHEMA_4)
    assert (status, body["limit"], body["error"]["limit"], body["detail"]["error_type"]) == (
        413, 8, 8, "request_too_large")
    status, body, headers = systemone_error(ApiError("not_ready", "model is loading"), SCHEMA_5)
    assert (status, headers) == (503, {"Retry-After": "5"})


# ---- process errors ---------------------------------------------------------------------------


def test_unknown_model_names_the_served_models(runtime: Runtime) -> None:
    for schema in SCHEMAS:
        status, out, _ = call(runtime, {**GOLDEN, "model": "jev-latest"}, schema)
        assert status == 404 and out["code"] == "model_not_found"
        message = out["detail"]["message"] if schema == SCHEMA_5 else out["error"]["message"]
        assert MODEL in message


def test_overloaded_is_529_under_5_0_and_429_under_4_0(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    async def full(rows: Any, deadline: Any, refusable: bool = True, alone: bool = False) -> Any:
        raise Overloaded("1 job waiting")

    monkeypatch.setattr(runtime.models[MODEL].executor, "submit", full)
    status, out, headers = call(runtime, GOLDEN, SCHEMA_5)
    assert (status, out["code"], headers) == (529, "overloaded", {"Retry-After": "1"})
    status, out, headers = call(runtime, GOLDEN, SCHEMA_4)
    assert (status, out["error"]["code"], headers) == (429, "overloaded", {"Retry-After": "1"})
    status, out, headers = call(runtime, {"requests": {"a": GOLDEN}}, SCHEMA_5, batch=True)
    assert (status, out["responses"]["a"]["status"], headers) == (200, 529, {})


# ---- /v1/systemone/batch ----------------------------------------------------------------------


@pytest.mark.parametrize("schema", SCHEMAS)
def test_batch_answers_each_request_as_alone(runtime: Runtime, schema: str) -> None:
    requests = {"golden": GOLDEN, "bad": with_questions(billing=NOUL, bad=MALFORMED),
                "extra": {**GOLDEN, "x_extra": 1}, "states": STATES}
    status, out, _ = call(runtime, {"requests": requests}, schema, batch=True)
    assert status == 200 and list(out["responses"]) == list(requests)
    for name, body in requests.items():
        alone_status, alone, _ = call(runtime, body, schema)
        want = alone if alone_status == 200 else {**alone, "status": alone_status}
        assert out["responses"][name] == want, name
    assert out["responses"]["bad"]["status"] == 422
    assert out["responses"]["extra"]["status"] == 400


def test_batch_body_faults_fail_the_call(runtime: Runtime) -> None:
    for body in ({"requests": {}}, {"requests": [GOLDEN]}, {"requests": {"a": GOLDEN}, "model": MODEL},
                 {"requests": {" ": GOLDEN}}, GOLDEN):
        status, out, _ = call(runtime, body, batch=True)
        assert status == 400 and out["code"] == "invalid_request", body
    many = {"requests": {f"r{i}": GOLDEN for i in range(MAX_REQUESTS + 1)}}
    status, out, _ = call(runtime, many, batch=True)
    assert (status, out["code"], out["limit"]) == (413, "request_too_large", MAX_REQUESTS)


# ---- over HTTP, with the official SDK ---------------------------------------------------------


def _server(package: Path, tmp_path: Path, *flags: str) -> Server:
    models = write_models_file(tmp_path / "models.yaml",
                               [{"name": MODEL, "package": str(package), "device": "cpu", "threads": 1}])
    srv = Server(models, *flags)
    try:
        srv.wait()
    except BaseException:
        srv.stop()
        raise
    return srv


def test_official_sdk_calls_systemone_and_lists_models(package: Path, tmp_path: Path) -> None:
    from typesafe_sdk import (
        Choice,
        Noul,
        RetryPolicy,
        Score,
        TypeSafeClient,
        TypeSafeNotFoundError,
        TypeSafeUnprocessableEntityError,
    )

    srv = _server(package, tmp_path)
    try:
        questions = {
            "billing": Noul(instructions="Is this message about billing?"),
            "tone": Choice(instructions="What is the tone?", criteria={"calm": None, "angry": "An upset message"}),
            "urgency": Score(instructions="How urgent is it?", criteria=["Can wait", "This week", "Today"]),
        }
        state = "I was charged twice for my order. Please refund me today."
        with TypeSafeClient(api_key="test", base_url=srv.url, retry=RetryPolicy(max_retries=0),
                            compression=False) as client:
            result = client.system_one(state=state, questions=questions, model=MODEL)
            raw = result.raw_http_response
            assert raw.status_code == 200 and "server-timing" in raw.headers
            validate_response("/v1/systemone", "post", 200, raw.json())
            # The same numbers /v1/decisions gives for the same request.
            wire = {"model": MODEL, "state": state, "questions": {k: q.model_dump() for k, q in questions.items()}}
            internal = srv.client.post("/v1/decisions", json=wire).json()["answers"]
            assert result.nouls["billing"].noul == internal["billing"]["noul"]
            assert result.choices["tone"].choice == internal["tone"]["choice"]
            assert result.scores["urgency"].score == internal["urgency"]["score"]
            assert result.scores["urgency"].legend == {0: "Can wait", 1: "This week", 2: "Today"}
            assert result.model == MODEL and result.usage.input_tokens > 0 and result.usage.output_tokens == 0

            listed = client.models.list().models
            assert [(m.name, m.release_date) for m in listed] == [(MODEL, "2026-10-23")]
            entry = srv.client.get("/v1/models").json()["models"][0]
            assert entry["version"] and {"choice", "noul", "score"} <= set(entry["features"])
            assert entry["card"]["family"] == "sparrow" and len(entry["card"]["model_sha256"]) == 64

            with pytest.raises(TypeSafeUnprocessableEntityError) as failed:
                client.system_one(state=state, questions={"one": {"type": "choice", "criteria": {"only": None}}},
                                  model=MODEL)
            assert failed.value.status == 422 and failed.value.body["code"] == "question_failed"
            assert "questions.one.choice: criteria must hold 2 to 255 options" in str(failed.value)
            with pytest.raises(TypeSafeNotFoundError) as missing:
                client.system_one(state=state, questions=questions, model="jev-latest")
            assert MODEL in str(missing.value)

        # A body that is not JSON is answered as the standard answers it: 422, json_invalid, in a list.
        bad = srv.client.post("/v1/systemone", content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 422 and bad.json()["code"] == "invalid_request"
        assert bad.json()["detail"] == [{"loc": ["body", 1], "msg": "JSON decode error", "type": "json_invalid"}]
        validate_response("/v1/systemone", "post", 422, bad.json())
    finally:
        srv.stop()


def test_4_0_process_answers_in_its_schema(package: Path, tmp_path: Path) -> None:
    srv = _server(package, tmp_path, "--systemone-schema", "vllm-sr/4.0")
    try:
        body = {**GOLDEN, "state": {"user": "Merge two sorted lists."}, "roles": {"user": "user"}}
        ok = srv.client.post("/v1/systemone", json=body)
        listed = srv.client.get("/v1/models").json()["models"]
        assert set(listed[0]) == {"name", "description", "release_date"}  # 5.0 adds version, features, card
        assert ok.status_code == 200 and set(ok.json()["answers"]) == set(GOLDEN["questions"])
        batch = srv.client.post("/v1/systemone/batch", json={"requests": {"a": body, "b": {**body, "stream": True}}})
        assert batch.status_code == 200
        validate_response("/v1/systemone/batch", "post", 200, batch.json())
        assert batch.json()["responses"]["b"]["status"] == 400
        bad = srv.client.post("/v1/systemone", content=b"[1,", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
        validate_response("/v1/systemone", "post", 400, bad.json())
    finally:
        srv.stop()
