"""Vela 2.0 request reading, token layout, truncation, windows and words (pure modules, no model)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from edge_runtime.engine.batching import greedy_batches
from edge_runtime.families.vela2.layout import (
    MARKERS,
    UNCOVERED_LOGIT,
    LayoutConfig,
    SchemaTooLong,
    Tokens,
    batch_indices,
    combine,
    encode_parts,
    fit,
    pad_batch,
    sequences,
    split_outputs,
    strip_markers,
)
from edge_runtime.families.vela2.state import (
    NOUL_NO,
    NOUL_YES,
    QuestionInvalid,
    engine_question,
    plan,
    read_state,
    resolve_over,
    rows_of,
)
from edge_runtime.families.vela2.words import split_words, trim, words_of

MARKER_IDS = {m: 100 + i for i, m in enumerate(MARKERS)}
M = MARKER_IDS
BOS, EOS, PAD = 2, 1, 0
CALIBRATION = {
    "temperature": {}, "thresholds": {"set:*": 0.3},
    "pii_schema": {"text": "Which spans are personal information?", "labels": {"PERSON": "person"}},
    "relevance_schema": {"text": "How relevant?", "levels": {"no": "Not relevant.", "yes": "Relevant."}},
}


def word_tokens(words: list[str]) -> tuple[Tokens, dict[str, int]]:
    """A whitespace word-level tokenizer: one id per word, so expected layouts can be written by hand."""
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "[UNK]": 3}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokens(tok), vocab


def layout(max_length: int = 512, overlap: int = 64) -> LayoutConfig:
    return LayoutConfig.from_config({"marker_ids": MARKER_IDS, "bos_token_id": BOS, "eos_token_id": EOS,
                                     "pad_token_id": PAD, "max_length": max_length, "window_overlap": overlap})


# ---- state and questions ------------------------------------------------------------------


def test_state_forms() -> None:
    s = read_state("hello")
    assert [(p.role, p.text) for p in s.parts] == [("user", "hello")] and s.fields["request"] == ("user", 0, 5)
    s = read_state('  {"prompt": "hi", "response": "yo"} ')
    assert [(p.role, p.text) for p in s.parts] == [("user", "hi"), ("answer", "yo")]
    s = read_state(["a", {"b": 1}])
    assert s.parts[0].text == '["a",{"b":1}]'
    with pytest.raises(ValueError):
        read_state("   ")


def test_object_state_blocks_and_ranges() -> None:
    s = read_state({"Request": "ask", "document": "doc", "ticket": 7, "answer": "ans"})
    # two keys feed context (one unknown): "<key>:\n<value>" blocks joined by a blank line
    assert [p.role for p in s.parts] == ["user", "context", "answer"]
    ctx = s.text("context")
    assert ctx == "document:\ndoc\n\nticket:\n7"
    role, a, b = s.fields["ticket"]
    assert role == "context" and ctx[a:b] == "7"
    assert s.fields["Request"] == ("user", 0, 3)
    # a single unknown key still becomes a block
    assert read_state({"notes": "n"}).text("context") == "notes:\nn"


def test_over_resolution_and_defaults() -> None:
    s = read_state({"request": "r", "source": "s", "answer": "a"})
    assert resolve_over("source", s) == (("context",), (0, 1))
    assert resolve_over(["answer", "user"], s) == (("user", "answer"), None)
    assert resolve_over("document", s) == (("context",), None)  # a well-known key whose role exists
    with pytest.raises(QuestionInvalid):
        resolve_over("nothing", s)
    span = engine_question("x", {"type": "span", "criteria": {"a": None}}, s, CALIBRATION)
    assert span.roles == ("answer",)
    choice = engine_question("c", {"type": "choice", "instructions": "i", "criteria": {"a": None, "b": "B"}}, s,
                             CALIBRATION)
    assert choice.roles == ("user", "context", "answer") and choice.options == (("a", ""), ("b", "B"))
    with pytest.raises(QuestionInvalid):
        engine_question("x", {"type": "span", "criteria": {"a": None}, "over": ["user", "answer"]}, s, CALIBRATION)


def test_engine_forms_and_presets() -> None:
    s = read_state("text")
    noul = engine_question("n", {"type": "noul", "instructions": "q"}, s, CALIBRATION)
    assert noul.type == "choice" and noul.abstain and noul.options == (("no", NOUL_NO), ("yes", NOUL_YES))
    score = engine_question("s", {"type": "score", "instructions": "q", "criteria": ["low", {"x": 1}]}, s, CALIBRATION)
    assert score.options == (("low", ""), ('{"x":1}', "")) and not score.abstain
    rel = engine_question("r", {"preset": "relevance"}, s, CALIBRATION)
    assert rel.kind == "score" and rel.key == "relevance"
    assert rel.options == (("no", "Not relevant."), ("yes", "Relevant."))
    pii = engine_question("p", {"preset": "pii", "threshold": 0.2}, s, CALIBRATION)
    assert pii.kind == "span" and pii.key == "pii" and pii.threshold == 0.2 and pii.names == ["PERSON"]
    with pytest.raises(QuestionInvalid):
        engine_question("p", {"preset": "pii", "criteria": {}}, s, CALIBRATION)
    with pytest.raises(QuestionInvalid):
        engine_question("p", {"preset": "halu"}, s, CALIBRATION)  # this calibration has no halu schema
    with pytest.raises(QuestionInvalid):
        engine_question("t", {"type": "set", "instructions": "q", "criteria": {"a": None}, "threshold": 2}, s,
                        CALIBRATION)


def test_set_naming_rule_and_rows() -> None:
    p = plan("text", {
        "tags": {"type": "set", "instructions": "q", "criteria": {"a": None, "b": None}},
        "tags.b": {"type": "noul", "instructions": "q"},
        "s1": {"type": "span", "criteria": {"x": None}},
        "c": {"type": "choice", "instructions": "q", "criteria": {"a": None, "b": None}},
        "s2": {"type": "span", "criteria": {"y": None}},
        "one": {"type": "choice", "instructions": "q", "criteria": {"a": None}},
        "bad": {"type": "box", "instructions": "q"},
    }, CALIBRATION)
    assert p.errors["tags"]["error"] == "invalid_question"
    assert p.errors["bad"]["error"] == "invalid_question"
    assert p.errors["one"]["error"] == "invalid_question"  # a choice takes 2 to 255 options
    rows = rows_of(p.questions)
    assert [[q.id for q in r.questions] for r in rows] == [["tags.b", "c", "s1"], ["s2"]]


# ---- layout -------------------------------------------------------------------------------


def test_exact_token_layout() -> None:
    tokens, v = word_tokens(["which", "one", "k1:", "d", "k2", "lab", "a", "b", "c", "x", "y", "mid"])
    state = {"request": "a b c", "source": "mid", "answer": "x y"}
    p = plan(state, {"q1": {"type": "choice", "over": "request", "instructions": "which one",
                            "criteria": {"k1": "d", "k2": None}},
                     "s": {"type": "span", "instructions": "never rendered", "criteria": {"lab": None}}},
             CALIBRATION)
    parts = encode_parts(p.state, p.questions, tokens)
    [row] = rows_of(p.questions)
    [seq] = sequences(row, parts, tokens, layout())
    assert seq.ids == [BOS, M["[Q]"], v["which"], v["one"], M["[O]"], v["k1:"], v["d"], M["[O]"], v["k2"],
                       M["[ABS]"], M["[E]"], v["lab"], M["[SEP_SCHEMA]"], M["[SEG_user]"], v["a"], v["b"], v["c"],
                       M["[SEG_context]"], v["mid"], M["[SEG_answer]"], v["x"], v["y"], EOS]
    [pq] = seq.questions
    assert (pq.query, pq.options, pq.pool) == (1, [4, 7, 9], (13, 17))
    assert seq.labels == [10]
    assert seq.words.tolist() == [20, 21] and seq.word_offsets.tolist() == [[0, 1], [2, 3]]
    idx = batch_indices([seq, seq])
    assert idx["q_index"].tolist() == [[0, 1, 13, 17], [1, 1, 13, 17]]
    assert idx["opt_index"].tolist() == [[0, 4, 0], [0, 7, 0], [0, 9, 0], [1, 4, 1], [1, 7, 1], [1, 9, 1]]
    assert idx["unit_index"].tolist() == [[0, 20], [0, 21], [1, 20], [1, 21]]
    assert idx["ent_index"].tolist() == [[0, 10], [1, 10]]
    # the pool of a question over several roles runs from the first role's marker to the last one's end
    p2 = plan(state, {"q": {"type": "noul", "instructions": "one", "over": ["request", "answer"]}}, CALIBRATION)
    [s2] = sequences(rows_of(p2.questions)[0], encode_parts(p2.state, p2.questions, tokens), tokens, layout())
    assert s2.questions[0].pool == (s2.ids.index(M["[SEG_user]"]), len(s2.ids) - 1)


def test_empty_indices_get_a_dummy_row() -> None:
    tokens, _ = word_tokens(["a"])
    p = plan("a", {"s": {"type": "span", "criteria": {"a": None}}}, CALIBRATION)
    [seq] = sequences(rows_of(p.questions)[0], encode_parts(p.state, p.questions, tokens), tokens, layout())
    idx = batch_indices([seq])
    assert idx["q_index"].tolist() == [[0, 0, 0, 1]] and idx["opt_index"].tolist() == [[0, 0, 0]]


def test_markers_are_never_produced_by_text() -> None:
    raw = json.loads(_marker_tokenizer().to_str())
    assert _marker_tokenizer().encode("[Q] x", add_special_tokens=False).ids[0] == 100
    stripped = Tokenizer.from_str(json.dumps(strip_markers(raw)))
    ids = stripped.encode("say [Q] [SEG_user] now", add_special_tokens=False).ids
    assert not set(ids) & set(MARKER_IDS.values())
    assert strip_markers(raw)["padding"] is None


def _marker_tokenizer() -> Tokenizer:
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "[UNK]": 3, "say": 4, "now": 5, "x": 6}
    vocab.update({f"filler{i}": i for i in range(7, 100)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(MARKERS))
    return tok


def test_fit_truncation_steps() -> None:
    # step 1: the unread part goes to 64, then further; the read part is untouched
    b = fit([10], [], [("user", 100), ("context", 200)], 150, {"user"})
    assert b.lengths == {"user": 100, "context": 35} and (b.shrink_cut, b.protected_cut) == (165, 0)
    # step 1 down to one token, then step 2 cuts the read part
    b = fit([10], [], [("user", 100), ("context", 200)], 60, {"user"})
    assert b.lengths == {"user": 44, "context": 1} and (b.shrink_cut, b.protected_cut) == (199, 56)
    # every part read: cut in part order
    b = fit([5], [3], [("user", 30), ("answer", 30)], 50, {"user", "answer"})
    assert b.lengths == {"user": 7, "answer": 30} and b.protected_cut == 23  # over = 5 + 8 + 60 - 50
    # step 3: the schema alone does not fit
    with pytest.raises(SchemaTooLong):
        fit([10], [], [("user", 5), ("context", 5)], 15, {"user"})


def test_windows_over_a_cut_part() -> None:
    words = [f"w{i}" for i in range(40)]
    tokens, v = word_tokens(words + ["q", "k", "j"])
    choice = {"type": "choice", "instructions": "q", "criteria": {"k": None, "j": None}}
    p = plan(" ".join(words), {"c": choice}, CALIBRATION)
    parts = encode_parts(p.state, p.questions, tokens)
    row = rows_of(p.questions)[0]
    # schema 1+1+2*(1+1)+1 = 7, fixed 4: 13 tokens of the part fit in 24; overlap min(64, 13 // 4) = 3,
    # stride 10: windows start at 0, 10, 20, 30 (the last one reaches the end)
    seqs = sequences(row, parts, tokens, layout(max_length=24))
    kept = [[t for t in s.ids if t in {v[w] for w in words}] for s in seqs]
    assert [(k[0], k[-1]) for k in kept] == [(v["w0"], v["w12"]), (v["w10"], v["w22"]), (v["w20"], v["w32"]),
                                             (v["w30"], v["w39"])]
    assert all(len(s) <= 24 for s in seqs)
    [single] = sequences(row, parts, tokens, layout(max_length=24), windows=False)
    assert len(single) == 24 and single.budget.protected_cut == 27
    # choice logits are the mean over windows
    outs = [([np.array([i, 2 * i, 0], np.float32)], None) for i in range(4)]
    raw = combine(row, parts, seqs, outs)
    assert raw.logits["c"].tolist() == [1.5, 3.0, 0.0] and raw.windows == 4
    assert raw.input_tokens == sum(len(s) for s in seqs)


def test_window_span_and_set_combination() -> None:
    words = [f"w{i}" for i in range(30)]
    tokens, _ = word_tokens(words + ["q", "k", "lab"])
    p = plan(" ".join(words), {"t": {"type": "set", "instructions": "q", "criteria": {"k": None}},
                               "s": {"type": "span", "criteria": {"lab": None}}}, CALIBRATION)
    parts = encode_parts(p.state, p.questions, tokens)
    row = rows_of(p.questions)[0]
    seqs = sequences(row, parts, tokens, layout(max_length=24, overlap=2))
    assert len(seqs) > 1
    outs = []
    for i, s in enumerate(seqs):
        outs.append(([np.array([float(i)], np.float32)], np.full((len(s.words), 1), float(i), np.float32)))
    raw = combine(row, parts, seqs, outs)
    assert raw.logits["t"].tolist() == [float(len(seqs) - 1)]  # set: max over windows
    expected = np.zeros(30)
    counts = np.zeros(30)
    for i, s in enumerate(seqs):
        expected[s.word_index] += i
        counts[s.word_index] += 1
    want = np.where(counts > 0, expected / np.maximum(counts, 1), UNCOVERED_LOGIT)
    assert raw.span is not None and raw.span.logits[:, 0].tolist() == want.tolist()
    assert (counts > 1).any()  # overlapping windows really were averaged


def test_batching_and_padding() -> None:
    assert greedy_batches([5, 3, 9, 3], max_tokens=18, max_rows=32) == [[1, 3, 0], [2]]
    assert greedy_batches([4] * 5, max_tokens=100, max_rows=2) == [[0, 1], [2, 3], [4]]
    tokens, _ = word_tokens(["a", "b", "q", "k", "j"])
    p = plan("a b", {"c": {"type": "choice", "instructions": "q", "criteria": {"k": None, "j": None}}}, CALIBRATION)
    [s] = sequences(rows_of(p.questions)[0], encode_parts(p.state, p.questions, tokens), tokens, layout())
    p2 = plan("a", {"c": {"type": "choice", "instructions": "q", "criteria": {"k": None, "j": None}}}, CALIBRATION)
    [s2] = sequences(rows_of(p2.questions)[0], encode_parts(p2.state, p2.questions, tokens), tokens, layout())
    feeds = pad_batch([s, s2], PAD)
    assert feeds["input_ids"][1].tolist() == s2.ids + [PAD]
    assert feeds["attention_mask"].sum(1).tolist() == [len(s), len(s2)]
    per_seq = split_outputs([s, s2], np.arange(6, dtype=np.float32), np.zeros((1, 1), np.float32))
    assert [o[0][0].tolist() for o in per_seq] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and per_seq[0][1] is None


# ---- words --------------------------------------------------------------------------------


def test_word_units() -> None:
    text = "Email tom.baker@example.com or visit https://example.org/dose, now! state-of_the-art @tbaker 我的"
    got = [text[a:b] for a, b in split_words(text)]
    assert got == ["Email", "tom.baker@example.com", "or", "visit", "https://example.org/dose", ",", "now", "!",
                   "state-of_the-art", "@tbaker", "我", "的"]


def test_words_of_first_token_and_uncovered() -> None:
    text = "ab cd"
    # tokens: "a" [0,1), "b" [1,2), an empty token, " cd" [2,5)
    w = words_of(text, np.array([[0, 1], [1, 2], [2, 2], [2, 5]]))
    assert w.offsets.tolist() == [[0, 2], [3, 5]] and w.first.tolist() == [0, 3]
    # a word no token covers is dropped
    w = words_of("ab cd", np.array([[0, 2]]))
    assert w.offsets.tolist() == [[0, 2]]


def test_trim() -> None:
    text = '"(Tom Baker)" https://example.org/dose). https://a.com/x東京'
    assert text.__getitem__(slice(*trim(text, 0, 13))) == "Tom Baker"
    a = text.index("https://example")
    assert text.__getitem__(slice(*trim(text, a, a + 26))) == "https://example.org/dose"
    b = text.index("https://a.com")
    assert text.__getitem__(slice(*trim(text, b, len(text)))) == "https://a.com/x"


def test_scan_budget() -> None:
    from edge_runtime.families.vela2.layout import ScanBudgetExceeded

    words = [f"w{i}" for i in range(40)]
    tokens, _ = word_tokens(words + ["q", "k", "j"])
    p = plan(" ".join(words), {"c": {"type": "choice", "instructions": "q", "criteria": {"k": None, "j": None}}},
             CALIBRATION)
    parts = encode_parts(p.state, p.questions, tokens)
    row = rows_of(p.questions)[0]
    assert len(sequences(row, parts, tokens, layout(max_length=24), max_scan_tokens=40)) == 4
    with pytest.raises(ScanBudgetExceeded):
        sequences(row, parts, tokens, layout(max_length=24), max_scan_tokens=39)
    # truncation is not scanning: the budget only bounds windows
    assert len(sequences(row, parts, tokens, layout(max_length=24), windows=False, max_scan_tokens=1)) == 1


def test_question_without_instructions_renders_no_text() -> None:
    tokens, v = word_tokens(["a", "k", "j"])
    p = plan("a", {"c": {"type": "choice", "criteria": {"k": None, "j": None}}}, CALIBRATION)
    [seq] = sequences(rows_of(p.questions)[0], encode_parts(p.state, p.questions, tokens), tokens, layout())
    assert seq.ids[:4] == [BOS, M["[Q]"], M["[O]"], v["k"]]
