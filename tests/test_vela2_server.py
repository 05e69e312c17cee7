"""The vela2 family over HTTP: the contract's two Vela 2.0 examples, answers equal to the converter's
pipeline (ONNX Runtime + numpy head) on the same requests, alone vs batched, windows and the scan
budget, roles, presets, and System One."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.api.schema import validate_response
from tests.support.server_harness import Server, write_models_file

MODEL = "Vela-2.0-0.3B"  # served under the contract examples' own name

EXAMPLE_1 = {
    "model": MODEL,
    "state": "Write a Python function that merges two sorted lists and explain its running time.",
    "questions": {
        "domain": {"type": "choice", "instructions": "Which domain does this request belong to?",
                   "choices": [{"key": "code", "description": "Programming"},
                               {"key": "math", "description": "Mathematics"}, {"key": "other"}]},
        "reasoning": {"type": "noul", "instructions": "Does answering this request need multi-step reasoning?"},
        "difficulty": {"type": "score", "instructions": "How difficult is this request?",
                       "levels": ["Trivial", "Moderate", "Hard"]},
    },
}
EXAMPLE_2 = {
    "model": MODEL,
    "state": "My card was charged twice and the parcel never arrived. Write to me at jane.doe@example.com.",
    "questions": {
        "problems": {"type": "set", "instructions": "Which problems does the customer report?",
                     "labels": [{"key": "billing", "description": "A payment or charge problem"},
                                {"key": "shipping", "description": "A delivery problem"},
                                {"key": "account", "description": "A login or account problem"}]},
        "contacts": {"type": "span", "instructions": "Find the personal contact details.",
                     "labels": [{"key": "EMAIL_ADDRESS", "description": "An email address"}]},
    },
}


@pytest.fixture(scope="module")
def package(fixture_package: Callable[..., Path]) -> Path:
    return fixture_package("vela2")


@pytest.fixture(scope="module")
def server(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = [{"name": MODEL, "package": str(package), "device": "cpu", "threads": 1}]
    srv = Server(write_models_file(tmp_path_factory.mktemp("vela2") / "models.yaml", models),
                 "--max-request-bytes", str(16 << 20))
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def reference(package: Path) -> Callable[..., dict[str, Any]]:
    """The converter's pipeline (upstream answers) on the package's graph, in-process."""
    from converters import verify
    from converters.vela2.verify import onnx_hidden
    from edge_runtime.families.registry import read_package
    from edge_runtime.families.vela2.pipeline import Vela2Assets, graph_readout, run_request

    pkg = read_package(package)
    assets = Vela2Assets.from_package(pkg)
    readout = graph_readout(onnx_hidden(verify.create_session(pkg.graph("fp32"))), assets.head)

    def run(state: Any, questions: dict[str, Any], windows: bool = True) -> dict[str, Any]:
        return run_request(state, questions, tokens=assets.tokens, layout=assets.layout,
                           calibration=assets.calibration, readout=readout, windows=windows).body
    return run


def post(server: Server, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = server.client.post("/v1/decisions", json=body)
    assert r.status_code == status, r.text
    got = r.json()
    validate_response("/v1/decisions", "post", status, got)
    return got


def test_loads_exact_and_lists_its_card(server: Server) -> None:
    listing = server.client.get("/v1/models").json()
    card = next(m for m in listing["models"] if m["name"] == MODEL)["card"]
    assert (card["family"], card["presets"]) == ("vela2", ["pii", "halu", "relevance"])
    entry = next(m for m in listing["data"] if m["id"] == MODEL)
    assert entry["question_types"] == ["choice", "noul", "score", "set", "span"]
    assert entry["presets"] == ["halu", "pii", "relevance"]
    assert entry["limits"]["max_input_tokens"] == 1024
    assert entry["limits"]["max_scan_tokens"] == 4096
    assert (entry["numerics"], entry["engine_args"]["grouping"]) == ("exact", "padded")
    assert entry["self_check"]["status"] == "passed"


def test_contract_example_choice_noul_score(server: Server, reference: Callable[..., dict[str, Any]]) -> None:
    got = post(server, EXAMPLE_1)
    a = got["answers"]
    assert list(a) == ["domain", "reasoning", "difficulty"]
    assert set(a["domain"]) == {"type", "choice", "confidence", "probabilities", "abstain_probability"}
    assert list(a["domain"]["probabilities"]) == ["code", "math", "other"]
    assert a["reasoning"]["type"] == "noul" and 0 <= a["reasoning"]["abstain_probability"] <= 1
    assert a["difficulty"]["legend"] == {"0": "Trivial", "1": "Moderate", "2": "Hard"}
    full = reference(EXAMPLE_1["state"], EXAMPLE_1["questions"])
    ref = full["answers"]
    # the same logits: probabilities and abstain as upstream; confidence is the contract's statistic
    assert a["domain"]["probabilities"] == ref["domain"]["probabilities"]
    assert a["domain"]["abstain_probability"] == ref["domain"]["abstain_probability"]
    assert a["domain"]["choice"] == ref["domain"]["choice"]
    p = max(a["domain"]["probabilities"].values())
    assert a["domain"]["confidence"] == pytest.approx((p - 1 / 3) / (1 - 1 / 3))
    assert a["reasoning"]["noul"] == ref["reasoning"]["noul"]
    # the contract's Score renormalises its distribution: equal within the last bit
    assert a["difficulty"]["probabilities"] == pytest.approx(ref["difficulty"]["probabilities"], rel=1e-15)
    assert a["difficulty"]["score"] == pytest.approx(ref["difficulty"]["score"], abs=1e-12)
    assert got["usage"] == full["usage"]


def test_contract_example_set_and_span(server: Server, reference: Callable[..., dict[str, Any]]) -> None:
    got = post(server, EXAMPLE_2)
    assert list(got["answers"]) == ["problems.billing", "problems.shipping", "problems.account", "contacts"]
    assert all(v["type"] == "noul" for v in got["answers"].values())
    ref = reference(EXAMPLE_2["state"], EXAMPLE_2["questions"])
    probs = got["sets"]["problems"]["probabilities"]
    assert probs == ref["sets"]["problems"]["probabilities"]
    threshold = got["thresholds"]["problems"]
    assert threshold == ref["thresholds"]["problems"]
    assert got["sets"]["problems"]["selected"] == [k for k, v in probs.items() if v >= threshold]
    assert got["spans"]["contacts"] == ref["spans"]["contacts"]
    assert got["thresholds"]["contacts"] == ref["thresholds"]["contacts"]
    assert got["answers"]["contacts"] == ref["answers"]["contacts"]
    text = EXAMPLE_2["state"]
    for span in got["spans"]["contacts"]:
        assert text[span["start"]:span["end"]] == span["text"]  # code-point offsets, end exclusive
    # a question's own threshold replaces the calibration's
    q = {**EXAMPLE_2["questions"]["problems"], "threshold": 0.0}
    low = post(server, {"model": MODEL, "state": text, "questions": {"problems": q}})
    assert low["thresholds"]["problems"] == 0.0
    assert low["sets"]["problems"]["selected"] == ["billing", "shipping", "account"]


STATES: list[Any] = [
    "Café ☕ at 7 — ünïcödé and 漢字 text, then an email a.b@example.org and a phone +1 555 0100.",
    {"request": "Summarise the refund policy.", "answer": "Refunds within 30 days; call 555 0100.",
     "document": "Refunds are accepted within 30 days of purchase."},
    {"request": "Is this safe?", "notes": "An unknown key feeds the context part.", "extra": [1, 2, {"k": "v"}]},
]


@pytest.mark.parametrize("state", STATES, ids=["string", "roles", "unknown-keys"])
def test_answers_equal_the_pipeline(server: Server, reference: Callable[..., dict[str, Any]], state: Any) -> None:
    questions = {**EXAMPLE_1["questions"], **EXAMPLE_2["questions"],
                 "pii": {"type": "span", "preset": "pii", "labels": [{"key": "ignored"}]},
                 "relevance": {"type": "score", "preset": "relevance", "levels": ["a", "b"]}}
    got = post(server, {"model": MODEL, "state": state, "questions": questions})
    upstream = {k: v for k, v in questions.items() if k not in ("pii", "relevance")}
    upstream.update(pii={"preset": "pii"}, relevance={"preset": "relevance"})
    ref = reference(state, upstream)
    assert got["usage"] == ref["usage"]
    for key in ("spans", "sets", "thresholds"):
        assert got[key] == ref[key]
    for qid, answer in got["answers"].items():
        want = ref["answers"][qid]
        for field in ("noul", "choice", "legend"):
            assert answer.get(field) == want.get(field), (qid, field)
        if "probabilities" in want:
            assert answer["probabilities"] == pytest.approx(want["probabilities"], rel=1e-15)
        if answer["type"] == "choice":  # upstream reports the abstain share on a Choice only
            assert answer["abstain_probability"] == want["abstain_probability"]


def test_batch_and_concurrency_are_bit_identical_to_alone(server: Server) -> None:
    requests = [{"model": MODEL, "state": s, "questions": {**EXAMPLE_1["questions"], **EXAMPLE_2["questions"]}}
                for s in STATES]
    alone = [post(server, r) for r in requests]
    batch = post(server, {"model": MODEL, "states": {
        f"s{i}": {"state": r["state"], "questions": r["questions"]} for i, r in enumerate(requests)}})
    for i, one in enumerate(alone):
        entry = batch["states"][f"s{i}"]
        assert {k: entry[k] for k in one if k != "model"} == {k: one[k] for k in one if k != "model"}
    assert batch["usage"]["input_tokens"] == sum(a["usage"]["input_tokens"] for a in alone)
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda r: post(server, r), requests * 2))
    assert together == alone * 2


def test_long_parts_are_read_in_windows_up_to_the_scan_budget(server: Server) -> None:
    long_text = " ".join(f"Sentence {i} mentions jane{i}@example.com and nothing else." for i in range(100))
    questions = {"contacts": EXAMPLE_2["questions"]["contacts"],
                 "reasoning": EXAMPLE_1["questions"]["reasoning"]}
    got = post(server, {"model": MODEL, "state": long_text, "questions": questions})
    assert "noul" in got["answers"]["reasoning"], got["answers"]
    assert got["usage"]["input_tokens"] > 1024  # more than one model input
    for span in got["spans"]["contacts"]:
        assert long_text[span["start"]:span["end"]] == span["text"]
    assert max(s["end"] for s in got["spans"]["contacts"] or [{"end": 0}]) <= len(long_text)
    tight = post(server, {"model": MODEL, "state": long_text, "questions": questions,
                          "options": {"max_tokens": 1500}})
    assert tight["answers"]["contacts"]["error"] == "scan_budget_exceeded"
    assert tight["answers"]["reasoning"]["error"] == "scan_budget_exceeded"  # they share the row
    refused = post(server, {"model": MODEL, "state": "s", "questions": questions,
                            "options": {"max_tokens": 10**6}}, status=400)
    assert "scan budget" in refused["error"]["message"]


def test_overflow_truncate_reads_a_long_part_once_cut(server: Server, reference: Callable[..., dict[str, Any]]
                                                      ) -> None:
    """A question with overflow truncate shares its row unless a part must be read in windows; then
    it reads the row once, the part cut, alone, and never fails the scan budget."""
    long_text = " ".join(f"Sentence {i} mentions jane{i}@example.com and nothing else." for i in range(100))
    reasoning = {**EXAMPLE_1["questions"]["reasoning"], "overflow": "truncate"}
    questions = {"contacts": EXAMPLE_2["questions"]["contacts"], "reasoning": reasoning}
    tight = post(server, {"model": MODEL, "state": long_text, "questions": questions, "options": {"max_tokens": 1500}})
    assert tight["answers"]["contacts"]["error"] == "scan_budget_exceeded"
    cut = reference(long_text, {"reasoning": EXAMPLE_1["questions"]["reasoning"]}, windows=False)["answers"]
    assert tight["answers"]["reasoning"]["noul"] == cut["reasoning"]["noul"]
    # a state that fits: the question reads the row it shares with the others, as without overflow
    short = {"model": MODEL, "state": EXAMPLE_2["state"], "questions": questions}
    plain = {**short, "questions": {**questions, "reasoning": EXAMPLE_1["questions"]["reasoning"]}}
    assert post(server, short) == post(server, plain)
    bad = post(server, {**short, "questions": {"r": {**reasoning, "overflow": "window"}}}, status=400)
    assert "overflow must be reject or truncate" in bad["error"]["message"]


def test_roles_choose_the_parts(server: Server) -> None:
    state = {"q": "Call me at 555 0100.", "a": "Sure, jane@example.com is mine."}
    span = {"c": EXAMPLE_2["questions"]["contacts"]}
    # a span reads the answer part when there is one: here "a"
    as_answer = post(server, {"model": MODEL, "state": state, "questions": span,
                              "roles": {"q": "user", "a": "answer"}})
    assert all(state["a"][s["start"]:s["end"]] == s["text"] for s in as_answer["spans"]["c"])
    as_user = post(server, {"model": MODEL, "state": state, "questions": span,
                            "roles": {"q": "answer", "a": "user"}})
    assert all(state["q"][s["start"]:s["end"]] == s["text"] for s in as_user["spans"]["c"])
    # null: no part has a role; the keys become context blocks "<key>:\n<value>"
    none = post(server, {"model": MODEL, "state": state, "questions": span, "roles": None})
    blocks = "q:\n" + state["q"] + "\n\na:\n" + state["a"]
    assert all(blocks[s["start"]:s["end"]] == s["text"] for s in none["spans"]["c"])
    assert none["usage"] != as_answer["usage"] or none["answers"] != as_answer["answers"]


def test_refusals_and_in_place_failures(server: Server) -> None:
    got = post(server, {"model": MODEL, "state": "text", "questions": {
        "box": {"type": "box", "instructions": "Where is the cat?"},
        "clash": {"type": "set", "labels": [{"key": "x"}]},
        "clash.x": {"type": "noul", "instructions": "Is it?"},
        "ok": EXAMPLE_1["questions"]["reasoning"]}})
    assert got["answers"]["box"]["reason"] == "box_unsupported"
    assert got["answers"]["clash"]["reason"] == "question_malformed"
    assert got["answers"]["ok"]["type"] == "noul"
    image = post(server, {**EXAMPLE_1, "images": ["data:image/png;base64,iVBORw0KGgo="]}, status=400)
    assert image["error"]["reason"] == "image_unsupported"
    none_valid = post(server, {"model": MODEL, "state": "s", "questions": {
        "b": {"type": "box", "instructions": "Where?"}}}, status=400)
    assert none_valid["error"]["reason"] == "box_unsupported"


def test_system_one_answers_set_and_span(server: Server) -> None:
    direct = post(server, EXAMPLE_2)
    r = server.client.post("/v1/systemone", json=EXAMPLE_2)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["answers"] == direct["answers"]
    assert got["sets"] == direct["sets"] and got["spans"] == direct["spans"]


def test_examples_command_answers_every_text_example(server: Server) -> None:
    from edge_runtime.examples import run_examples

    results = {r.title: r for r in run_examples(server.url, MODEL)}
    assert all(r.outcome != "wrong" for r in results.values()), results
    for title in ("decisions: choice, noul and score", "decisions: set and span", "decisions: a batch under states"):
        assert results[title].outcome == "answered", results[title]
    assert {r.outcome for t, r in results.items() if t.startswith("systemone")} == {"refused"}  # text only


@pytest.mark.parametrize("unit", ["the quick brown fox jumps over the lazy dog ", "!?", "a", "\u03a3\u03b1 ",
                                  "\u4e2d\u6587", "\U0001f600 "])
def test_a_long_state_costs_its_budget_not_its_length(server: Server, unit: str) -> None:
    """A part far over the scan budget is tokenized only up to it: read truncated beside another part
    it answers as its prefix does (tokens_lower_bound), read in windows it fails with its reason."""
    noul = {"r": EXAMPLE_1["questions"]["reasoning"]}
    words = unit * ((8 << 20) // len(unit.encode()) - 64)
    huge = post(server, {"model": MODEL, "state": {"request": "Is this safe?", "document": words}, "questions": noul})
    prefix = post(server, {"model": MODEL, "state": {"request": "Is this safe?", "document": words[:65_536]},
                           "questions": noul})
    assert huge == prefix and huge["usage"]["tokens_lower_bound"] is True
    alone = post(server, {"model": MODEL, "state": words, "questions": noul})
    assert alone["answers"]["r"]["error"] == "scan_budget_exceeded"
    assert alone["usage"]["tokens_lower_bound"] is True
