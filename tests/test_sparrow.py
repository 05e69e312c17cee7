"""sparrow-nano: the converted package through ONNX Runtime and the family, against sparrow-decider's numpy Decider."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any
from unittest import mock

import numpy as np
import pytest
from sparrow_decider import Decider
from sparrow_decider.wordpiece import WordPiece

from converters.sparrow.export import build_sparrow_package
from edge_runtime.api.statuses import status_of
from edge_runtime.engine import GraphSession, ModelExecutor, create_session, probe_grouping
from edge_runtime.engine.batching import bucket_ceiling
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.errors import ApiError, ItemError
from edge_runtime.families.registry import read_package
from edge_runtime.families.sparrow.family import KINDS, SparrowFamily, SparrowForward, SparrowText, SplitGraphs, content
from edge_runtime.requests.decisions import NoValidQuestion, parse_decisions_request

PARITY_TOLERANCE = 2e-6


class _Counting:
    """A session that counts its runs."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        self.calls += 1
        return self.inner.run(feeds, outputs)


@pytest.fixture(scope="session")
def package(tmp_path_factory: pytest.TempPathFactory):
    return read_package(build_sparrow_package(tmp_path_factory.mktemp("sparrow")))


@pytest.fixture(scope="session")
def session(package) -> GraphSession:
    return create_session(package.graph("fp32"), "cpu", 1)


@pytest.fixture(scope="session")
def family(package, session) -> SparrowFamily:
    return SparrowFamily(package, session)


@pytest.fixture(scope="session")
def whole(session) -> SparrowForward:
    """model.onnx per question: the forward the split graphs must equal."""
    return SparrowForward(session)


@pytest.fixture(scope="session")
def decider() -> Decider:
    return Decider.load()


def answer(family: SparrowFamily, body: dict[str, Any]) -> dict[str, Any]:
    """The family's response body for a request, forwards run through the family's own Forward."""
    plan = family.plan_request(parse_decisions_request(body))
    outputs = family.forward(plan.rows) if plan.rows else []
    return family.finish(plan, outputs)


# ---- the package -------------------------------------------------------------------------


def test_package_card_config_and_licences(package) -> None:
    card = package.card
    assert (card.name, card.family, card.kind, card.surfaces) == ("sparrow-nano", "sparrow", "sparrow", ("decisions",))
    assert card.limits == {"max_input_tokens": 512}
    assert card.raw["question_types"] == ["choice", "noul", "score"]
    assert card.raw["usage"] == "per_question"
    assert card.raw["graph"] == {"inputs": ["state_ids", "question_ids", "option_ids", "option_mask", "kind"],
                                 "outputs": ["logits", "probs"], "opset": 18}
    assert 0 <= card.raw["verification"]["max_abs_diff"] <= card.raw["verification"]["tolerance"] == 1e-5
    config = package.decision_config()
    assert config["kinds"] == KINDS
    assert config["temperatures"] == {"choice": 1.395, "noul": 0.939, "score": 0.555}
    assert config["noul_defaults"] == {"false": "the statement does not hold for this state",
                                       "true": "the statement holds for this state"}
    notice = package.file("LICENSES/sparrow-decider-NOTICE").read_text()
    assert "potion-base-8M" in notice and "MIT" in notice
    assert "Apache License" in package.file("LICENSES/sparrow-decider-LICENSE").read_text()
    assert "Thomas van Dongen" in package.file("LICENSES/potion-base-8M-MIT").read_text()


def test_graph_keeps_the_int8_table_and_exact_gelu(package) -> None:
    import onnx

    model = onnx.load(str(package.graph("fp32")))
    table = next(t for t in model.graph.initializer if t.name == "emb_q8")
    assert table.data_type == onnx.TensorProto.INT8 and list(table.dims) == [16384, 128]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Erf") == 2 and "Gelu" not in ops
    assert model.opset_import[0].version == 18


def test_golden_cases_self_check(package, session) -> None:
    """What the server does at start: every case twice, bitwise equal, within 1e-3 of the recording."""
    cases = package.golden("fp32")
    assert len(cases) >= 3
    for case in cases:
        first, second = session.run(case.feeds), session.run(case.feeds)
        for name, want in case.outputs.items():
            assert np.array_equal(first[name], second[name])
            assert first[name].shape == want.shape
            assert np.max(np.abs(first[name] - want)) <= (PARITY_TOLERANCE if name == "probs" else 1e-5)


# ---- tokenizer ---------------------------------------------------------------------------

_WORDS = [
    "refund", "charged", "twice", "order", "1182", "money", "back", "python", "function", "merges",
    "sorted", "lists", "robot", "battery", "obstacle", "dock", "café", "naïve", "résumé", "Zürich",
    "straße", "ÉCOLE", "東京", "北京大学", "日本語テキスト", "한국어", "Привет", "мир", "ΟΔΥΣΣΕΥΣ", "λόγος",
    "emoji🙂", "🚀🚀", "don't", "e-mail", "x=34", "battery: 6%", "(parens)", "[brackets]", "a/b",
    "e\u0301", "zero\u200bwidth", "tab\tsep", "new\nline", "\u00a0nbsp", "ﬁ", "Ⅻ", "½", "x\x00y",
    "\ufffd", "line\u2028sep", "ctl\x1cx", "supercalifragilisticexpialidocious" * 4, "İstanbul", "ǅ",
]


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def test_tokenizer_matches_the_package_wordpiece(package, decider) -> None:
    vocab = decider.static.tok.vocab
    reference = WordPiece(vocab)
    text = SparrowText.from_files(package.file("tokenizer.json"), package.decision_config())
    rng = random.Random(7)
    texts = list(_WORDS) + [_text(rng, rng.randint(1, 60)) for _ in range(400)]
    texts += [_text(rng, 900), "é" * 300, "x" * 5000, "東京" * 700, ""]
    for t in texts:
        assert text.ids(t, 512) == reference.encode(t, 512), repr(t[:80])


def test_long_text_prefix_cut_equals_whole_text(package) -> None:
    """Tokenizing only a prefix of a long text gives the whole text's first tokens."""
    text = SparrowText.from_files(package.file("tokenizer.json"), package.decision_config())
    rng = random.Random(11)
    for budget in (1, 7, 100, 512):
        for _ in range(20):
            t = _text(rng, rng.randint(1000, 3000))  # past budget * 8 characters: the cut path
            whole = text.ids(t, len(t) + 1)  # a budget past the text's length reads it whole
            assert len(whole) > budget and text.ids(t, budget) == whole[:budget]


# ---- parity against the package's own numpy path ----------------------------------------


def _description(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.1:
        return None
    if r < 0.2:
        return {"hint": _text(rng, 3), "weight": rng.randint(1, 9)}
    return _text(rng, rng.randint(1, 8))


def _state(rng: random.Random, i: int) -> Any:
    r = i % 10
    if r == 0:
        return _text(rng, rng.randint(600, 2500))  # longer than 512 tokens: cut at 512 under truncate
    if r == 1:
        return {"user": _text(rng, 12), "context": {"order": rng.randint(1, 9999), "items": [_text(rng, 2)]}}
    if r == 2:
        return [_text(rng, 5), {"k": _text(rng, 3)}, rng.randint(0, 99)]
    if r == 3:
        return "   " + _text(rng, 4) + "\n\t "  # stripped by both
    return _text(rng, rng.randint(1, 80))


def _question(rng: random.Random, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(internal-form question, the same question as Decider.probs takes it)."""
    kind = ("choice", "noul", "score")[i % 3]
    instructions = _text(rng, rng.randint(2, 12)) if rng.random() > 0.1 or kind == "noul" else None
    if rng.random() < 0.05 and instructions is not None:
        instructions = {"question": instructions, "fields": ["a", "b"]}
    if kind == "choice":
        keys = rng.sample(["billing", "bug", "refunds", "flights", "weather", "calendar", "code", "math", "other",
                           "naïve", "東京", "x y", "🙂", "opt-1", "opt_2", "A", "b", "sales", "legal", "ops"],
                          rng.randint(2, 12))
        criteria = {k: _description(rng) for k in keys}
        ours: dict[str, Any] = {"type": kind, "criteria": criteria}
        if rng.random() < 0.5:  # the Router's list form of the same question
            ours = {"type": kind, "choices": [{"key": k, "description": v} if v is not None else {"key": k}
                                              for k, v in criteria.items()]}
        theirs = {"type": kind, "criteria": criteria}
    elif kind == "noul":
        criteria = {k: _text(rng, 5) for k in ("false", "true") if rng.random() < 0.3}
        ours = {"type": kind}
        theirs = {"type": kind}
        if criteria:
            ours["criteria"] = theirs["criteria"] = criteria
    else:
        levels = [_description(rng) or _text(rng, 2) for _ in range(rng.randint(2, 10))]
        ours = {"type": kind, ("levels" if rng.random() < 0.5 else "criteria"): levels}
        theirs = {"type": kind, "criteria": levels}
    if instructions is not None:
        ours["instructions"] = theirs["instructions"] = instructions
    return ours, theirs


def _probabilities(a: dict[str, Any], keys: list[str]) -> np.ndarray:
    if a["type"] == "noul":
        return np.array([1.0 - a["noul"], a["noul"]])
    return np.array([a["probabilities"][k] for k in keys])


def test_parity_with_the_numpy_decider(family, decider) -> None:
    rng = random.Random(20261202)
    worst, count = 0.0, 0
    for i in range(120):  # 120 requests x 3 questions = 360 questions
        state = _state(rng, i)
        pairs = {f"q{j}": _question(rng, i + j) for j in range(3)}
        long = i % 10 == 0  # a state past the 512-token budget: q0 and q2 ask for it truncated, q1 not
        asked = {k: {**ours, "overflow": "truncate"} if long and k != "q1" else ours for k, (ours, _) in pairs.items()}
        body = answer(family, {"state": state, "questions": asked})
        assert set(body) == {"model", "answers", "usage"}
        assert body["usage"].get("tokens_lower_bound", False) is long
        for qid, (_, theirs) in pairs.items():
            kind, names, _, p_ref = decider.probs(state, theirs)
            got = body["answers"][qid]
            if long and qid == "q1":
                assert got["error"] == "max_length_exceeded" and got["reason"] == "question_tokens"
                assert got["type"] == kind and "512 tokens" in got["message"]
                continue
            assert got["type"] == kind
            p = _probabilities(got, names)
            worst = max(worst, float(np.max(np.abs(p - p_ref))))
            if kind == "choice":
                assert got["choice"] == names[int(np.argmax(p_ref))]
            elif kind == "score":
                assert int(np.argmax(p)) == int(np.argmax(p_ref))
            else:
                assert (got["noul"] > 0.5) == (p_ref[1] > 0.5)
            count += 1
    assert count >= 300
    assert worst <= PARITY_TOLERANCE, worst


def test_published_golden_values(family) -> None:
    state = "Write a Python function that merges two sorted lists"
    body = answer(family, {
        "state": "User: I was charged twice for order 1182, I want my money back",
        "questions": {"tool": {"type": "choice", "instructions": "Which tool fits this request?",
                               "criteria": {"flights": "search and book flights", "refunds": "refund a payment",
                                            "weather": "forecasts for a city",
                                            "calendar": "create or move meetings"}}},
    })
    tool = body["answers"]["tool"]
    assert tool["choice"] == "refunds"
    assert round(tool["probabilities"]["refunds"], 4) == 0.9795
    assert list(tool["probabilities"]) == ["flights", "refunds", "weather", "calendar"]
    assert tool["confidence"] == pytest.approx((tool["probabilities"]["refunds"] - 0.25) / 0.75)

    body = answer(family, {"state": state, "questions": {
        "programming": {"type": "noul", "instructions": "Is this about programming?"},
        "difficulty": {"type": "score", "instructions": "How difficult is this task?",
                       "levels": ["trivial", "easy", "moderate", "hard", "very hard"]},
    }})
    assert round(body["answers"]["programming"]["noul"], 4) == 0.3944
    assert "confidence" not in body["answers"]["programming"]
    score = body["answers"]["difficulty"]
    assert round(score["score"], 4) == 2.4015
    assert [round(score["probabilities"][str(i)], 4) for i in range(5)] == [0.0003, 0.2322, 0.3027, 0.2953, 0.1695]
    assert score["legend"] == {"0": "trivial", "1": "easy", "2": "moderate", "3": "hard", "4": "very hard"}


# ---- the family's surface behaviour ------------------------------------------------------


def test_one_answer_run_per_state_and_usage(family) -> None:
    text = family.text
    state = "Is the parcel late? It was due on Monday."
    body_req = {"state": state, "questions": {
        "late": {"type": "noul", "instructions": "Is the parcel late?"},
        "topic": {"type": "choice", "choices": [{"key": "shipping", "description": "parcels"}, {"key": "other"}]},
    }}
    split = family.forward.split
    assert split is not None
    whole = _Counting(family.forward.session)
    question = _Counting(split.question)
    answers = {n: _Counting(graph) for n, graph in split.answers.items()}
    counted = SparrowForward(whole, SplitGraphs(question, answers))
    plan = family.plan_request(parse_decisions_request(body_req))
    body = family.finish(plan, counted(plan.rows))
    counted(family.plan_request(parse_decisions_request({**body_req, "state": "another state"})).rows)
    # both questions in one answer run per state; each question's half once, then from the cache
    assert answers[2].calls == 2 and question.calls == 2 and whole.calls == 0
    assert sum(a.calls for a in answers.values()) == 2
    n_state = len(text.ids(state, 512))
    expected = (n_state + len(text.ids("Is the parcel late?", 512))
                + len(text.ids("false the statement does not hold for this state", 512))
                + len(text.ids("true the statement holds for this state", 512))
                + n_state + 0 + len(text.ids("shipping parcels", 512)) + len(text.ids("other ", 512)))
    assert body["usage"] == {"input_tokens": expected, "output_tokens": 0}
    assert list(body["answers"]) == ["late", "topic"]


def test_questions_of_any_lengths_share_one_answer_run(family) -> None:
    """Sparrow pads nothing: the executor gives a request's questions one forward, whatever their
    lengths (a padding forward's length buckets would split these two)."""
    split = family.forward.split
    assert split is not None
    answers = {n: _Counting(graph) for n, graph in split.answers.items()}
    counted = SparrowForward(family.forward.session, SplitGraphs(split.question, answers))
    body = {"state": "a parcel", "questions": {
        "short": {"type": "noul", "instructions": "Late?"},
        "long": {"type": "choice", "criteria": {f"team{k}": "parcels and deliveries " * 6 for k in range(12)}}}}
    rows = family.plan_request(parse_decisions_request(body)).rows
    assert max(r.tokens for r in rows) > bucket_ceiling(min(r.tokens for r in rows))
    executor = ModelExecutor("sparrow", counted, "padded", max_queue=4)
    try:
        result = asyncio.run(executor.submit(rows))
    finally:
        executor.close()
    assert result.batches == 1 and answers[2].calls == 1
    assert bitwise_equal(result.outputs, family.forward(rows))


def test_answers_do_not_depend_on_neighbours_or_ids(family) -> None:
    q = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "tech": "bugs"}}
    alone = answer(family, {"state": "the app crashes", "questions": {"a": q}})["answers"]["a"]
    together = answer(family, {"state": "the app crashes", "questions": {
        "x": {"type": "noul", "instructions": "Is it a bug?"}, "other id": q}})["answers"]["other id"]
    assert alone == together


def test_unsupported_questions_fail_in_place(family) -> None:
    body = answer(family, {"state": "my card was charged twice", "questions": {
        "ok": {"type": "noul", "instructions": "Is this about money?"},
        "problems": {"type": "set", "labels": [{"key": "billing"}]},
        "where": {"type": "box", "instructions": "the card"},
        "follow": {"type": "track", "instructions": "the card"},
        "bad": {"type": "noul", "instructions": "x", "colour": "red"},
    }})
    a = body["answers"]
    assert a["ok"]["type"] == "noul"
    assert a["problems"] == {"type": "set", "error": "invalid_question", "reason": "question_type_unsupported",
                             "message": a["problems"]["message"]}
    assert a["where"]["reason"] == "box_unsupported" and a["follow"]["reason"] == "track_unsupported"
    assert a["bad"]["reason"] == "question_malformed" and "['colour']" in a["bad"]["message"]


def test_no_answerable_question_is_400(family) -> None:
    req = parse_decisions_request({"state": "s", "questions": {
        "p": {"type": "span", "labels": [{"key": "EMAIL"}]}, "b": {"type": "box", "instructions": "x"}}})
    with pytest.raises(NoValidQuestion) as e:
        family.plan_request(req)
    assert status_of(e.value) == 400 and e.value.reason == "question_type_unsupported"
    assert e.value.body()["error"]["question"] == "p" and "box_unsupported" in e.value.message


def test_images_are_refused(family) -> None:
    q = {"q": {"type": "noul", "instructions": "Is it red?"}}
    with pytest.raises(ApiError) as e:
        family.plan_request(parse_decisions_request({"state": "s", "images": ["data:image/png;base64,AAAA"],
                                                     "questions": q}))
    assert (status_of(e.value), e.value.code, e.value.reason) == (400, "invalid_request", "image_unsupported")
    body = answer(family, {"states": {
        "a": {"state": "s", "images": ["data:image/png;base64,AAAA"], "questions": q},
        "b": {"state": "the sky is red", "questions": q},
    }})
    assert body["states"]["a"]["answers"]["q"]["error"] == "invalid_input"
    assert body["states"]["a"]["answers"]["q"]["reason"] == "input_malformed"
    assert body["states"]["b"]["answers"]["q"]["type"] == "noul"
    with pytest.raises(ApiError) as e:
        family.plan_request(parse_decisions_request({"states": {
            "a": {"state": "s", "videos": ["data:video/mp4;base64,AAAA"], "questions": q}}}))
    assert e.value.reason == "video_unsupported"


def test_batch_answers_each_entry_as_alone(family) -> None:
    q = {"relevance": {"type": "noul", "instructions": "Does the candidate help answer the request?"}}
    s1 = {"request": "How long is the refund window?", "candidate": "Refunds are accepted within 30 days."}
    s2 = {"request": "How long is the refund window?", "candidate": "Our offices close on public holidays."}
    body = answer(family, {"states": {"doc_1": {"state": s1, "questions": q}, "doc_2": {"state": s2, "questions": q}}})
    assert set(body) == {"model", "states", "usage"}
    alone = [answer(family, {"state": s, "questions": q}) for s in (s1, s2)]
    assert body["states"]["doc_1"] == alone[0] and body["states"]["doc_2"] == alone[1]
    assert body["usage"]["input_tokens"] == sum(a["usage"]["input_tokens"] for a in alone)


def test_a_state_past_the_budget_fails_its_questions_in_place(family) -> None:
    """max_tokens (or the model's 512) bounds the state; one past it fails, the others are answered."""
    questions = {"q": {"type": "noul", "instructions": "Refund?"}}
    state = " ".join(["refund"] * 10)
    n = len(family.text.ids(state, 10_000))
    fits = family.plan_request(parse_decisions_request(
        {"state": state, "options": {"max_tokens": n}, "questions": questions}))
    assert fits.rows[0].feeds["state_ids"].shape == (1, n)
    batch = parse_decisions_request({"options": {"max_tokens": n}, "states": {
        "long": {"state": state + " refund", "questions": questions},
        "short": {"state": "refund", "questions": questions}}})
    plan = family.plan_request(batch)
    assert len(plan.rows) == 1
    body = family.finish(plan, [{"probs": np.array([0.25, 0.75])}])
    failed = body["states"]["long"]["answers"]["q"]
    assert (failed["error"], failed["reason"]) == ("max_length_exceeded", "question_tokens")
    assert body["states"]["short"]["answers"]["q"]["noul"] == pytest.approx(0.75)
    with pytest.raises(ApiError) as e:
        family.plan_request(parse_decisions_request({"state": state, "options": {"max_tokens": 513},
                                                     "questions": {"q": {"type": "noul", "instructions": "x"}}}))
    assert status_of(e.value) == 400


def test_deadline_fails_every_planned_question(family) -> None:
    req = parse_decisions_request({"state": "s", "questions": {
        "a": {"type": "noul", "instructions": "x"}, "b": {"type": "set", "labels": [{"key": "l"}]}}})
    plan = family.plan_request(req)
    body = family.finish(plan, ItemError("deadline_exceeded", "options.deadline_ms passed"))
    assert body["answers"]["a"]["error"] == "deadline_exceeded"
    assert body["answers"]["b"]["reason"] == "question_type_unsupported"


def test_non_finite_output_is_invalid_model_output(family) -> None:
    req = parse_decisions_request(
        {"state": "s", "questions": {"a": {"type": "choice", "criteria": {"x": None, "y": None}}}})
    plan = family.plan_request(req)
    body = family.finish(plan, [{"probs": np.array([np.nan, 0.5], np.float32)}])
    assert body["answers"]["a"]["error"] == "invalid_model_output"


def test_empty_segments_read_one_pad_id(family) -> None:
    row = family.text.row([], parse_decisions_request(
        {"state": "", "questions": {"a": {"type": "choice", "criteria": {"\u200b": None, "b": "x"}}}}).single.valid[0])
    assert row.feeds["state_ids"].tolist() == [[0]] and row.feeds["question_ids"].tolist() == [[0]]
    assert row.feeds["option_mask"][0, 0].tolist()[0] == 1.0


def test_forward_adapter_and_probe_row(family, whole) -> None:
    row = family.probe_row(40)
    options = int(row.feeds["option_mask"].sum())
    (out,) = whole([row])
    assert out["probs"].shape == (3,) and whole.length(row) == row.tokens == 24 + 40 + options
    assert bitwise_equal(family.forward([row]), [out])
    assert family.batchable is True


# ---- the split graphs --------------------------------------------------------------------

_TEAMS = {"billing": "payments and refunds", "shipping": "parcels", "tech": None}


def _questions(rng: random.Random, count: int) -> dict[str, Any]:
    """``count`` questions of every type, some repeating the same texts (cached halves), some new."""
    kinds = [
        {"type": "choice", "instructions": "Which team?", "criteria": _TEAMS},
        {"type": "noul", "instructions": "Is the customer upset?"},
        {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high", "now"]},
        {"type": "choice", "instructions": f"New question {rng.random()}?",
         "criteria": {f"o{k}": "x " * rng.randint(0, 30) for k in range(rng.randint(2, 9))}},
        {"type": "noul", "instructions": "w " * rng.randint(0, 600)},
    ]
    return {f"q{i}": rng.choice(kinds) for i in range(count)}


def test_split_graphs_answer_as_model_onnx_bit_for_bit(family, whole) -> None:
    """Requests of 1 to 9 questions (answer graphs of every size, chunks past 4), repeated and new
    question texts, long segments, a batch: every question as model.onnx answers it alone."""
    rng = random.Random(7)
    for n in [1, 2, 3, 4, 5, 9] * 3:
        words = ["parcel", "refund", "crash", "late", "angry"]
        states = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 90))) for _ in range(rng.randint(1, 3))]
        body = {"states": {f"s{k}": {"state": st, "questions": _questions(rng, n)} for k, st in enumerate(states)}}
        rows = family.plan_request(parse_decisions_request(body)).rows
        assert bitwise_equal(family.forward(rows), whole(rows))


def test_probe_proves_rows_batch_exactly(family) -> None:
    assert probe_grouping(family.forward, family.probe_row) == "padded"


def test_question_cache_is_bounded(family, whole) -> None:
    split = family.forward.split
    assert split is not None
    small = SparrowForward(family.forward.session, split, cache_bytes=64 * 1024)
    rng = random.Random(3)
    for _ in range(40):
        rows = family.plan_request(parse_decisions_request(
            {"state": "a parcel", "questions": _questions(rng, 4)})).rows
        assert bitwise_equal(small(rows), whole(rows))
    assert 0 < small._cached <= 64 * 1024 and len(small._cache) > 1


def test_split_graphs_of_an_earlier_layout_are_left_unused(package, session, family, caplog) -> None:
    """Split graphs written before the row layout take other inputs: model.onnx answers alone."""
    config = package.decision_config()
    earlier = {**config, "split_graphs": {k: v for k, v in config["split_graphs"].items() if k != "layout"}}
    with mock.patch.object(type(package), "decision_config", lambda self: earlier), \
            caplog.at_level(logging.WARNING, logger="edge_runtime.families.sparrow.family"):
        old = SparrowFamily(package, session)
    assert old.forward.split is None and old.batchable is False
    assert "earlier layout" in caplog.text
    body = {"state": "my parcel is late", "questions": _questions(random.Random(5), 3)}
    assert answer(old, body) == answer(family, body)


def test_structured_state_reads_as_indented_json(family, decider) -> None:
    state = {"user": "Où est ma commande ?", "order": {"id": 7}}
    assert content(state) == json.dumps(state, indent=2, ensure_ascii=False)
    q = {"type": "noul", "instructions": "Is the user asking about an order?"}
    got = answer(family, {"state": state, "questions": {"q": q}})["answers"]["q"]["noul"]
    assert abs(got - decider.probs(state, q)[3][1]) <= PARITY_TOLERANCE
