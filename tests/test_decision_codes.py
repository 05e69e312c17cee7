"""decision-codes: a tiny random Qwen3 through the converter, the causal forward and the family.

The readout is checked against Transformers' own logits (Qwen3ForCausalLM in PyTorch, the code
tokens' softmax), state-once against each question run alone, right-padded batches against rows
alone, the limits, header-v1, temperature_by_questions, and serving through the Runtime.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.decision_codes.export import DecisionCodesOptions, export_decision_codes
from converters.decision_codes.fixture import build_decision_codes_fixture_result
from converters.errors import ConversionError
from converters.samples import SAMPLE_TEXTS
from edge_runtime.api.statuses import status_of
from edge_runtime.engine import create_session, probe_grouping
from edge_runtime.engine.causal import BranchRow, CausalForward, CausalRow, causal_row
from edge_runtime.errors import ApiError, ItemError
from edge_runtime.families.decision_codes.family import DecisionCodesFamily
from edge_runtime.families.registry import read_package
from edge_runtime.heads.decisions import code_probabilities, select_temperature
from edge_runtime.requests.decisions import NoValidQuestion, parse_decisions_request

PROBABILITY_TOLERANCE = 1e-5
T_BY_Q = {"max_questions": [1, 3], "temperature": [1.7, 0.6, 1.2]}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two fixture packages (seed 0) and their Hugging Face sources, built once for the module:
    causal with the LM-head readout, and state-once with a trained readout, header-v1 and
    temperature_by_questions."""
    root = tmp_path_factory.mktemp("decision-codes")
    causal = build_decision_codes_fixture_result(root / "causal", source_dir=root / "causal-src")
    once = build_decision_codes_fixture_result(
        root / "once", attention_mode="prefix_causal", prompt_layout="header-v1",
        temperature_by_questions=T_BY_Q, readout="trained", source_dir=root / "once-src")
    return {"causal": causal, "once": once, "root": root}


def _family(path: Path) -> DecisionCodesFamily:
    package = read_package(path)
    return DecisionCodesFamily(package, create_session(package.graph("fp32"), "cpu", 1))


@pytest.fixture(scope="module")
def causal(built) -> DecisionCodesFamily:
    return _family(built["causal"].path)


@pytest.fixture(scope="module")
def once(built) -> DecisionCodesFamily:
    return _family(built["once"].path)


@pytest.fixture(scope="module")
def torch_lm(built):
    import torch
    from transformers import Qwen3ForCausalLM

    torch.set_num_threads(1)
    return Qwen3ForCausalLM.from_pretrained(built["root"] / "causal-src", dtype=torch.float32).eval()


def run(family: DecisionCodesFamily, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(plan, response body) with the family's own forward."""
    plan = family.plan_request(parse_decisions_request(body))
    outputs = family.forward(plan.rows) if plan.rows else []
    return plan, family.finish(plan, outputs)


def _probabilities(answer: dict[str, Any], count: int) -> np.ndarray:
    if answer["type"] == "noul":
        return np.array([1.0 - answer["noul"], answer["noul"]])
    return np.array(list(answer["probabilities"].values()))[:count]


def _random_request(rng: random.Random, n: int) -> dict[str, Any]:
    questions: dict[str, Any] = {}
    for j in range(n):
        kind = rng.choice(["choice", "noul", "score"])
        if kind == "choice":
            keys = rng.sample(["billing", "shipping", "tech", "sales", "code", "math", "other", "naïve", "東京",
                               "legal", "ops", "travel"], rng.randint(2, 8))
            q = {"type": kind, "criteria": {k: (rng.choice(SAMPLE_TEXTS)[:24] if rng.random() < 0.5 else None)
                                            for k in keys}}
        elif kind == "noul":
            q = {"type": kind}
            if rng.random() < 0.4:
                q["criteria"] = {"true": rng.choice(SAMPLE_TEXTS)[:30]}
        else:
            q = {"type": kind, "levels": [f"level {i}" for i in range(rng.randint(2, 10))]}
        if kind == "noul" or rng.random() < 0.8:
            q["instructions"] = rng.choice(["Which team should answer?", "Is this urgent?", "How hard is it?",
                                            {"ask": "Is it about money?", "strict": True}])
        questions[f"q{j}"] = q
    state: Any = " ".join(rng.sample(SAMPLE_TEXTS, rng.randint(1, 2)))
    if rng.random() < 0.2:
        state = {"user": state, "order": {"id": rng.randint(1, 9999)}}
    # long_context: the tiny vocabulary spends several tokens on a CJK character
    return {"state": state, "questions": questions, "options": {"long_context": True}}


# ---- the package ---------------------------------------------------------------------------


def test_cards_configs_and_goldens(built, causal, once) -> None:
    from edge_runtime.packages.golden import self_check

    for key, usage in (("causal", "per_question"), ("once", "state_once")):
        package = read_package(built[key].path)
        card = package.card
        assert (card.family, card.kind, card.surfaces) == ("decision-codes", "decision-codes", ("decisions",))
        assert card.raw["question_types"] == ["choice", "noul", "score", "set"] and card.raw["usage"] == usage
        assert card.limits["max_input_tokens"] == 1024 and card.limits["validated_input_tokens"] == 768
        assert ("max_request_tokens" in card.limits) == (usage == "state_once")
        config = package.decision_config()
        assert len(config["codes"]) == 255 and config["codes"][:3] == ["A", "B", "C"] and config["codes"][26] == "AA"
        assert "single token" in config["code_alphabet"] or "one token" in config["code_alphabet"]
        assert card.raw["verification"]["max_abs_diff"] <= PROBABILITY_TOLERANCE
        session = create_session(package.graph("fp32"), "cpu", 1)
        checked = self_check(session, package.golden("fp32"), "cpu")
        assert checked["status"] == "passed", checked
    once_card = read_package(built["once"].path).card
    assert once_card.raw["verification"]["outputs"]["state_once_vs_alone"] <= PROBABILITY_TOLERANCE
    assert once_card.head["source"] == "trained" and read_package(built["causal"].path).card.head["source"] == "lm_head"
    goldens = read_package(built["once"].path).golden("fp32")
    pasts = [c.feeds["past_key_values.0.key"].shape[2] for c in goldens]
    assert 0 in pasts and any(p > 0 for p in pasts)  # prompts over an empty past, and a continuation
    assert causal.batchable and not once.batchable


def test_codes_are_single_tokens_and_conversion_refuses_others(built, causal, tmp_path) -> None:
    for code, tid in zip(causal.prompt.codes, causal.config["token_ids"]):
        assert causal.prompt.text.encode(code, add_special_tokens=False).ids == [tid]
    src = tmp_path / "src"
    shutil.copytree(built["root"] / "causal-src", src)
    (src / "decision_config.json").write_text(json.dumps({"codes": ["A", "B", "not one token"]}))
    with pytest.raises(ConversionError, match="single tokens"):
        export_decision_codes(src, tmp_path / "out", DecisionCodesOptions())
    assert not (tmp_path / "out").exists()


# ---- numerics -----------------------------------------------------------------------------


def test_readout_matches_transformers_logits(causal, torch_lm) -> None:
    """Every question's probabilities equal the softmax of Qwen3ForCausalLM's logits at the code tokens."""
    import torch

    rng = random.Random(20260301)
    token_ids = causal.config["token_ids"]
    worst, spread, count = 0.0, 0.0, 0
    for _ in range(8):
        body = _random_request(rng, rng.randint(1, 4))
        plan, answer = run(causal, body)
        entry = plan.entries[0]
        for slot in entry.slots:
            q = slot.question
            assert slot.row is not None, answer["answers"][q.id]
            ids = torch.tensor([plan.rows[slot.row].ids.tolist()])
            with torch.no_grad():
                logits = torch_lm(input_ids=ids).logits[0, -1].double().numpy()
            z = logits[token_ids[: len(q.options)]]
            ref = np.exp(z - z.max())
            ref /= ref.sum()
            got = _probabilities(answer["answers"][q.id], len(q.options))
            worst = max(worst, float(np.max(np.abs(got - ref))))
            spread = max(spread, float(ref.max() - ref.min()))
            count += 1
    assert count >= 12
    assert spread > 0.2  # the random model is far from uniform, so the comparison can fail
    assert worst <= PROBABILITY_TOLERANCE, worst


def test_trained_readout_matches_the_hidden_state_times_readout(built, once) -> None:
    import torch
    from safetensors.numpy import load_file
    from transformers import Qwen3Model

    base = Qwen3Model.from_pretrained(built["root"] / "once-src", dtype=torch.float32).eval()
    readout = load_file(str(built["root"] / "once-src" / "readout.safetensors"))["weight"]
    plan, answer = run(once, {"state": SAMPLE_TEXTS[2], "questions": {
        "a": {"type": "choice", "instructions": "Which team?",
              "criteria": {"billing": None, "shipping": None, "x": None}},
        "b": {"type": "score", "levels": ["low", "mid", "high", "max"]}}})
    row = plan.rows[0]
    assert isinstance(row, BranchRow)
    for slot in plan.entries[0].slots:
        q = slot.question
        ids = torch.tensor([[*row.prefix.tolist(), *row.branches[slot.branch].tolist()]])
        with torch.no_grad():
            h = base(input_ids=ids).last_hidden_state[0, -1].numpy()
        z = (readout[: len(q.options)] @ h).astype(np.float64) / plan.entries[0].temperature
        ref = np.exp(z - z.max())
        ref /= ref.sum()
        assert np.max(np.abs(_probabilities(answer["answers"][q.id], len(q.options)) - ref)) <= PROBABILITY_TOLERANCE


def test_state_once_equals_each_question_alone(once) -> None:
    """The state run once and every question branched from its cache gives each question's answer alone."""
    rng = random.Random(7)
    worst, bitwise, total = 0.0, 0, 0
    for _ in range(4):
        body = _random_request(rng, rng.randint(2, 4))
        plan, answer = run(once, body)
        (row,) = plan.rows
        assert isinstance(row, BranchRow) and len(row.branches) == len(body["questions"])
        branched = once.forward([row])[0]
        alone = [once.forward([causal_row([*row.prefix, *b])])[0] for b in row.branches]
        for slot in plan.entries[0].slots:
            q = slot.question
            t = plan.entries[0].temperature
            p_alone = code_probabilities(alone[slot.branch], once.readout, len(q.options), t)
            worst = max(worst, float(np.max(np.abs(_probabilities(answer["answers"][q.id], len(q.options)) - p_alone))))
            bitwise += int(np.array_equal(branched[slot.branch], alone[slot.branch]))
            total += 1
        assert answer["usage"]["input_tokens"] == len(row.prefix) + sum(len(b) for b in row.branches)
    assert worst <= PROBABILITY_TOLERANCE, worst
    assert bitwise == total  # measured bit-identical on ORT CPU fp32 (docs/reference/feasibility-notes.md B.2)


def test_branches_in_several_chunks_equal_one_chunk(once) -> None:
    plan, _ = run(once, _random_request(random.Random(3), 4))
    (row,) = plan.rows
    whole = once.forward([row])[0]
    chunked = CausalForward(once.forward.session, pad_id=once.pad_id, max_branch_rows=2, branch_mode="tiled")([row])[0]
    assert np.array_equal(whole, chunked)


def test_branches_share_one_prefix_cache(once, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared branches bind the prefix's batch-1 cache once for all of a request's
    questions: what a request holds for its prefix does not grow with its questions, and the bits
    are the tiled chunks' (and so each question's alone)."""
    from edge_runtime.engine.causal import SHARED, TILED

    session = once.forward.session
    shared = CausalForward(session, pad_id=once.pad_id, branch_mode=SHARED)
    bound: list[Any] = []
    fed: list[tuple[int, ...]] = []
    bind, plain = session.bind, session.run

    def recording_bind(values):
        b = bind(values)
        bound.append((b.nbytes, [v.shape for v in values.values()]))
        return b

    def recording_run(feeds, outputs=None):
        fed.extend(v.shape for n, v in feeds.items() if n.startswith("past_key_values."))
        return plain(feeds, outputs)

    monkeypatch.setattr(session, "bind", recording_bind)
    monkeypatch.setattr(session, "run", recording_run)
    row = None
    for n in (1, 8):
        plan, _ = run(once, _random_request(random.Random(5), n))  # the family's forward: one branch is shared
        (row,) = plan.rows
        assert isinstance(row, BranchRow) and len(row.branches) == n
        fed.clear()
        got = shared([row])[0]
        assert all(shape[0] == 1 for shape in fed)  # the plain run is the prefill: an empty batch-1 past
        tiled = CausalForward(session, pad_id=once.pad_id, branch_mode=TILED)([row])[0]
        assert np.array_equal(got, tiled)
    # one binding per request, batch 1, and as many bytes as the prefix's tokens whatever the questions
    per_token = shared.kv_bytes_per_token()
    shared_bytes = [b for b, shapes in bound if all(s[0] == 1 for s in shapes)]
    assert len(shared_bytes) == len(bound) == 4  # the family's forward and ours, for 1 and 8 questions
    plans = [run(once, _random_request(random.Random(5), n))[0].rows[0] for n in (1, 8)]
    assert [shared_bytes[1], shared_bytes[3]] == [len(r.prefix) * per_token for r in plans]
    with pytest.raises(ValueError, match="branch_mode"):
        CausalForward(session, pad_id=once.pad_id, branch_mode="copied")


def test_right_padded_batches_are_bit_identical_to_rows_alone(causal) -> None:
    rng = random.Random(11)
    rows: list[CausalRow] = []
    for _ in range(3):
        plan, _ = run(causal, _random_request(rng, 3))
        rows.extend(plan.rows)
    lengths = {len(r.ids) for r in rows}
    assert len(lengths) > 3  # mixed lengths, so padding is exercised
    alone = [causal.forward([r])[0] for r in rows]
    batched = causal.forward(list(reversed(rows)))[::-1]
    assert all(np.array_equal(a, b) for a, b in zip(alone, batched))
    assert probe_grouping(causal.forward, causal.probe_row) == "padded"


# ---- prompt, temperature, limits ------------------------------------------------------------


def test_header_v1_lists_the_questions_in_front_of_the_state(once) -> None:
    body = {"state": "Hi <|im_end|> there", "questions": {
        "domain": {"type": "choice", "instructions": "Which domain?",
                   "criteria": {"code": "Programming", "other": None}},
        "tags": {"type": "set", "labels": [{"key": "x"}]},
        "reasoning": {"type": "noul", "instructions": "Needs reasoning?"},
        "difficulty": {"type": "score", "instructions": "How hard?", "levels": ["Easy", "Hard"]},
    }}
    plan, answer = run(once, body)
    prompt = once.prompt
    entry = parse_decisions_request(body).single
    listed = list(entry.valid)
    state_text = prompt.state_text(entry.state, listed)
    assert state_text == ("Questions:\n1. Which domain?\n   A: code: Programming\n   B: other\n2. Which labels apply?\n"
                          "   - x\n3. Needs reasoning?\n4. How hard?\n   A: Easy\n   B: Hard\n\n"
                          "State:\nHi <|im_end|> there\n\n")
    assert prompt.question_text(listed[2], 3) == ("Question 3:\nNeeds reasoning?\n\nOptions:\nA: No / false\n"
                                                  "B: Yes / true\n\nReply with only the code of the best option.")
    (row,) = plan.rows
    before = list(prompt.before)
    assert row.prefix.tolist() == before + prompt.text.encode(state_text, add_special_tokens=False).ids
    im_end = prompt.markup.token_to_id("<|im_end|>")
    assert im_end not in row.prefix.tolist()[len(before):]  # request text never becomes chat markup
    assert row.branches[1].tolist()[-len(prompt.after):] == list(prompt.after)
    assert answer["answers"]["tags.x"]["type"] == "noul" and list(answer["sets"]) == ["tags"]
    # a Box question keeps the plain layout (the contract); it is refused in place
    plan, answer = run(once, {"state": "Hi", "questions": {
        "n": {"type": "noul", "instructions": "Needs reasoning?"}, "where": {"type": "box", "instructions": "x"}}})
    assert answer["answers"]["where"]["reason"] == "box_unsupported"
    state_ids = prompt.text.encode(prompt.state_text("Hi"), add_special_tokens=False).ids
    assert plan.rows[0].prefix.tolist() == before + state_ids


def test_temperature_by_questions(once) -> None:
    config = once.config
    assert [select_temperature(config, n) for n in (1, 2, 3, 4, 9)] == [1.7, 0.6, 0.6, 1.2, 1.2]
    assert select_temperature({"temperature": 0.8}, 5) == 0.8
    q = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None, "sales": None}}
    for n, want in ((1, 1.7), (2, 0.6), (5, 1.2)):
        questions = {"main": q, **{f"o{i}": {"type": "noul", "instructions": "Is it urgent?"} for i in range(n - 1)},
                     "skip": {"type": "box", "instructions": "x"},  # Box and Set questions do not count
                     "tags": {"type": "set", "labels": [{"key": "x"}, {"key": "y"}]}}
        plan, answer = run(once, {"state": "The app crashes.", "questions": questions})
        assert plan.entries[0].temperature == want
        slot = next(s for s in plan.entries[0].slots if s.question.id == "main")
        hidden = once.forward(plan.rows)[0][slot.branch]
        z = (once.readout[:3] @ hidden).astype(np.float64)
        for t, close in ((want, True), (1.0, False)):
            p = np.exp(z / t - (z / t).max())
            p /= p.sum()
            got = _probabilities(answer["answers"]["main"], 3)
            assert (np.max(np.abs(got - p)) <= 1e-12) == close


def _long_state(family: DecisionCodesFamily, tokens: int) -> str:
    words, text = SAMPLE_TEXTS * 40, ""
    for w in words:
        text = f"{text} {w}".strip()
        if len(family.prompt.text.encode(text).ids) >= tokens:
            return text
    raise AssertionError("sample texts too short")


def test_question_limits_fail_in_place(causal) -> None:
    q = {"n": {"type": "noul", "instructions": "Is it urgent?"}}
    state = _long_state(causal, 700)  # with the prompt, more than 768 and less than 1024 tokens
    _, answer = run(causal, {"state": state, "questions": q})
    failed = answer["answers"]["n"]
    assert (failed["error"], failed["reason"]) == ("max_length_exceeded", "question_tokens")
    assert "long_context" in failed["message"] and answer["usage"]["input_tokens"] == 0
    plan, answer = run(causal, {"state": state, "questions": q, "options": {"long_context": True}})
    assert answer["answers"]["n"]["type"] == "noul"
    assert 768 < len(plan.rows[0].ids) <= 1024 == causal.max_input_tokens
    _, answer = run(causal, {"state": state * 3, "questions": q, "options": {"long_context": True}})
    assert answer["answers"]["n"]["reason"] == "question_tokens"
    _, answer = run(causal, {"state": "x" * 2_000_000, "questions": q})  # refused without being tokenized
    assert answer["answers"]["n"]["reason"] == "question_tokens"
    with pytest.raises(ApiError) as e:
        run(causal, {"state": "s", "questions": q, "options": {"max_tokens": 1025}})
    assert status_of(e.value) == 400
    plan, answer = run(causal, {"state": "short", "questions": {
        "n": q["n"], "long": {"type": "choice", "criteria": {f"k{i}": state[:1200] for i in range(3)}}}})
    assert answer["answers"]["n"]["type"] == "noul" and answer["answers"]["long"]["reason"] == "question_tokens"


def test_state_once_request_limit(once) -> None:
    questions = {f"q{i}": {"type": "noul", "instructions": f"Is {i} true?"} for i in range(30)}
    fits = {k: questions[k] for k in list(questions)[:2]}
    with pytest.raises(ApiError) as e:
        run(once, {"state": "The app crashes.", "questions": questions})
    err = e.value
    assert (status_of(err), err.code, err.reason, err.limit) == (400, "invalid_request", "request_tokens", 1536)
    _, answer = run(once, {"states": {"big": {"state": "The app crashes.", "questions": questions},
                                      "small": {"state": "The app crashes.", "questions": fits}}})
    big = answer["states"]["big"]["answers"]["q0"]
    assert ((big["error"], big["reason"]) == ("invalid_input", "input_malformed")
            and "max_request_tokens" in big["message"])
    assert answer["states"]["small"]["answers"]["q0"]["type"] == "noul"
    assert answer["usage"]["input_tokens"] == answer["states"]["small"]["usage"]["input_tokens"] > 0


def test_unsupported_questions_media_deadline_and_bad_outputs(causal) -> None:
    _, answer = run(causal, {"state": "my card was charged twice", "questions": {
        "ok": {"type": "choice", "criteria": {"yes": None, "no": None}},
        "span": {"type": "span", "labels": [{"key": "EMAIL"}]},
        "where": {"type": "box", "instructions": "the card"},
        "follow": {"type": "track", "instructions": "the card"},
    }})
    a = answer["answers"]
    assert a["ok"]["type"] == "choice" and set(a["ok"]["probabilities"]) == {"yes", "no"}
    assert a["span"]["reason"] == "question_type_unsupported"
    assert (a["where"]["reason"], a["follow"]["reason"]) == ("box_unsupported", "track_unsupported")
    with pytest.raises(NoValidQuestion) as e:
        causal.plan_request(parse_decisions_request(
            {"state": "s", "questions": {"b": {"type": "box", "instructions": "x"}}}))
    assert e.value.reason == "box_unsupported"
    with pytest.raises(ApiError) as e:
        causal.plan_request(parse_decisions_request({"state": "s", "images": ["data:image/png;base64,AAAA"],
                                                     "questions": {"n": {"type": "noul", "instructions": "Red?"}}}))
    assert e.value.reason == "image_unsupported"
    plan = causal.plan_request(parse_decisions_request({"state": "s", "questions": {
        "n": {"type": "noul", "instructions": "x"}, "c": {"type": "choice", "criteria": {"a": None, "b": None}}}}))
    body = causal.finish(plan, ItemError("deadline_exceeded", "options.deadline_ms passed"))
    assert body["answers"]["n"]["error"] == "deadline_exceeded"
    nan = np.full(causal.readout.shape[1], np.nan, np.float32)
    body = causal.finish(plan, [nan, nan])
    assert body["answers"]["c"]["error"] == "invalid_model_output"


# ---- serving -------------------------------------------------------------------------------


def test_serving_through_the_runtime(built, causal, once) -> None:
    from edge_runtime.api.schema import validate_response
    from edge_runtime.config import ModelConfig, ServeConfig
    from edge_runtime.runtime import Runtime
    from edge_runtime.service import serve
    from edge_runtime.timing import Timing

    config = ServeConfig(models_file=Path("models.yaml"), models=(
        ModelConfig(name="codes", package=built["causal"].path, device="cpu", threads=1),
        ModelConfig(name="codes-once", package=built["once"].path, device="cpu", threads=1),
    ))
    runtime = Runtime(config)
    runtime.load_all()
    try:
        assert runtime.status() == "ready", runtime.health()
        served = runtime.models
        assert (served["codes"].grouping, served["codes"].numerics) == ("padded", "exact")
        assert served["codes-once"].grouping == "alone"
        assert served["codes"].self_check["status"] == "passed"
        info = served["codes-once"].info()
        assert info["family"] == "decision-codes" and info["limits"]["max_request_tokens"] == 1536
        body = {"state": "Write a Python function that merges two sorted lists.", "questions": {
            "domain": {"type": "choice", "instructions": "Which domain?",
                       "criteria": {"code": "Programming", "math": "Mathematics", "other": None}},
            "reasoning": {"type": "noul", "instructions": "Does it need multi-step reasoning?"},
            "difficulty": {"type": "score", "levels": ["Trivial", "Moderate", "Hard"]}}}
        for name, family in (("codes", causal), ("codes-once", once)):
            got = asyncio.run(serve(runtime, "decisions", {"model": name, **body, "options": {"return_meta": True}},
                                    Timing()))
            _, alone = run(family, body)
            assert got["answers"] == alone["answers"] and got["usage"] == alone["usage"]
            assert got["model"] == name and got["meta"]["numerics"] == "exact"
            validate_response("/v1/decisions", "post", 200, got)
        failing = asyncio.run(serve(runtime, "decisions", {"model": "codes-once", "states": {
            "a": {"state": "x " * 3000, "questions": {"n": body["questions"]["reasoning"]}},
            "b": {"state": "s", "questions": {"t": {"type": "span", "labels": [{"key": "l"}]},
                                              "n": body["questions"]["reasoning"]}}}}, Timing()))
        assert failing["states"]["a"]["answers"]["n"]["reason"] == "question_tokens"
        assert failing["states"]["b"]["answers"]["t"]["reason"] == "question_type_unsupported"
        validate_response("/v1/decisions", "post", 200, failing)
        single = asyncio.run(serve(runtime, "decisions", {"model": "codes", "state": body["state"],
                                                          "questions": {"reasoning": body["questions"]["reasoning"]}},
                                   Timing()))
        together = asyncio.run(serve(runtime, "decisions", {"model": "codes", **body}, Timing()))
        assert single["answers"]["reasoning"] == together["answers"]["reasoning"]  # causal rows never see each other
        with pytest.raises(ApiError) as e:
            asyncio.run(serve(runtime, "decisions", {"model": "codes-once", "state": "s", "questions": {
                f"q{i}": {"type": "noul", "instructions": f"Is {i} true?"} for i in range(30)}},
                Timing()))
        assert e.value.reason == "request_tokens"
        validate_response("/v1/decisions", "post", 400, e.value.body())
    finally:
        for model in runtime.models.values():
            if model.executor is not None:
                model.executor.close()


def test_cli_fixture(tmp_path) -> None:
    from converters.__main__ import main

    assert main(["fixture", "--kind", "decision-codes", "--out", str(tmp_path / "pkg"),
                 "--attention-mode", "prefix_causal"]) == 0
    card = read_package(tmp_path / "pkg").card
    assert card.kind == "decision-codes" and card.raw["usage"] == "state_once"
    assert main(["fixture", "--kind", "decision-codes", "--out", str(tmp_path / "q"),
                 "--quantize", "int8-dynamic"]) == 2  # dynamic int8 is never offered for decision backbones
    assert main(["export", "x", "--kind", "embedding", "--out", str(tmp_path / "e"),
                 "--attention-mode", "causal"]) == 2



def test_branch_chunks_scale_with_the_graph(once, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chunk reads every weight once, so a large graph tiles more cache per chunk; a small one keeps 64 MiB."""
    from edge_runtime.engine import causal

    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"x" * 1000)
    (tmp_path / "model.onnx_data").write_bytes(b"y" * 3000)
    (tmp_path / "model.int8.onnx").write_bytes(b"z" * 10)  # another variant is not this graph's data
    assert causal._graph_bytes(graph) == 4000
    session = once.forward.session
    assert CausalForward(session, pad_id=once.pad_id).max_branch_bytes == causal.DEFAULT_MAX_BRANCH_BYTES
    monkeypatch.setattr(causal, "_graph_bytes", lambda path: 2_000_000_000)
    assert CausalForward(session, pad_id=once.pad_id).max_branch_bytes == 500_000_000
