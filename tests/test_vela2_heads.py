"""The Vela 2.0 marker head in numpy, the span decoder and answer assembly (no model needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_runtime.families.vela2.answers import (
    Calibration,
    decode_spans,
    response_body,
    set_answer,
    single_answer,
    span_answer,
)
from edge_runtime.families.vela2.layout import RawRow, RawSpan
from edge_runtime.families.vela2.marker import MarkerHead, head_tensor_names
from edge_runtime.families.vela2.state import engine_question, read_state

CAL = {
    "temperature": {"choice": 1.3, "score": 1.1, "set": 1.05, "span": 0.4},
    "thresholds": {"set:*": 0.3, "set:tags": 0.6, "span:toxic": 0.1, "span:halu": 0.55, "span:*": 0.5,
                   "span:custom": 0.25},
    "pii_types": ["PERSON", "EMAIL_ADDRESS"],
    "pii_length_rule": {"anchors": [{"n_tokens": 21, "threshold": 0.75}, {"n_tokens": 126, "threshold": 0.05},
                                    {"n_tokens": 1022, "threshold": 0.005919}]},
    "pii_sparse_gate": {"K": 3, "t_sparse": 0.1, "probe_threshold": 0.5},
}


def _head(readout: str, hidden: int = 16, proj: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"norm.weight": (hidden,), "norm.bias": (hidden,), "log_tau": (), "log_tau_span": ()}
    for p in ("w_o", "w_q", "w_p", "w_t", "w_e"):
        shapes[f"{p}.weight"], shapes[f"{p}.bias"] = (proj, hidden), (proj,)
    if readout != "cosine":
        shapes.update({"cls_mlp.0.weight": (2 * hidden, hidden), "cls_mlp.0.bias": (2 * hidden,),
                       "cls_mlp.3.weight": (1, 2 * hidden), "cls_mlp.3.bias": (1,)})
    arrays = {k: (rng.standard_normal(s) * 0.2).astype(np.float32) for k, s in shapes.items()}
    arrays["log_tau"] = np.float32(-2.8)
    arrays["log_tau_span"] = np.float32(-2.6)
    return arrays


@pytest.mark.parametrize("readout", ["cosine", "mlp", "both"])
def test_marker_head_matches_torch(readout: str) -> None:
    """The numpy head against the converter's torch head (the §2.7 math in PyTorch) on random states."""
    pytest.importorskip("torch")
    from converters.vela2.verify import torch_readout

    arrays = _head(readout)
    head = MarkerHead.from_arrays(arrays, readout)
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((2, 12, 16)).astype(np.float32)
    idx = {"q_index": np.array([[0, 1, 5, 12], [1, 2, 4, 9]]),
           "opt_index": np.array([[0, 2, 0], [0, 3, 0], [1, 3, 1], [1, 4, 1]]),
           "unit_index": np.array([[0, 6], [0, 7], [1, 5]]), "ent_index": np.array([[0, 4], [1, 1]])}

    class Identity:  # a "backbone" that returns the given states, so only the heads are compared
        def __call__(self, input_ids, attention_mask):  # noqa: ANN001
            import torch

            class Out:
                last_hidden_state = torch.from_numpy(hidden[int(input_ids[0, 0])][None, : input_ids.shape[1]])
            return Out()

    feeds = {"input_ids": np.array([[0] * 12, [1] * 12]), "attention_mask": np.ones((2, 12), np.int64)}
    want_opt, want_span = torch_readout(Identity(), arrays, readout)(feeds, idx)
    got_opt = head.option_logits(hidden, idx["q_index"], idx["opt_index"])
    got_span = head.span_logits(hidden, idx["unit_index"], idx["ent_index"])
    assert got_opt.dtype == np.float32 and got_opt.shape == (4,) and got_span.shape == (3, 2)
    assert np.max(np.abs(got_opt - want_opt)) < 1e-5
    assert np.max(np.abs(got_span - want_span)) < 1e-5
    assert np.ptp(got_opt) > 0.1  # a real spread of logits, not a degenerate constant


def test_marker_head_math_by_hand() -> None:
    """One option logit written out directly from §2.7 (cosine readout)."""
    arrays = _head("cosine", hidden=4, proj=3)
    head = MarkerHead.from_arrays(arrays, "cosine")
    h = np.random.default_rng(2).standard_normal((1, 6, 4)).astype(np.float32)

    def ln(x: np.ndarray) -> np.ndarray:
        return (x - x.mean()) / np.sqrt(x.var() + 1e-5) * arrays["norm.weight"] + arrays["norm.bias"]

    def proj(n: str, x: np.ndarray) -> np.ndarray:
        return arrays[f"{n}.weight"] @ x + arrays[f"{n}.bias"]

    u = proj("w_o", ln(h[0, 3])) + proj("w_q", ln(h[0, 1]))
    v = proj("w_p", ln(h[0, 2:6].mean(0)))
    want = (u / np.linalg.norm(u)) @ (v / np.linalg.norm(v)) / math.exp(-2.8)
    got = head.option_logits(h, np.array([[0, 1, 2, 6]]), np.array([[0, 3, 0]]))
    assert abs(float(got[0]) - want) < 1e-5


def test_marker_head_strict_load() -> None:
    arrays = _head("both")
    with pytest.raises(ValueError, match="readout 'cosine'"):
        MarkerHead.from_arrays(arrays, "cosine")  # cls_mlp present but not expected
    del arrays["w_e.bias"]
    with pytest.raises(ValueError, match="missing"):
        MarkerHead.from_arrays(arrays, "both")
    assert "cls_mlp.3.bias" in head_tensor_names("mlp") and "cls_mlp.3.bias" not in head_tensor_names("cosine")


# ---- answers ------------------------------------------------------------------------------


def _softmax(v: list[float]) -> list[float]:
    e = [math.exp(x - max(v)) for x in v]
    return [x / sum(e) for x in e]


def test_choice_noul_score() -> None:
    cal = Calibration(CAL)
    s = read_state("text")
    q = engine_question("d", {"type": "choice", "instructions": "i", "criteria": {"a": None, "b": None, "c": None}},
                        s, CAL)
    ans = single_answer(q, np.array([1.0, 2.0, 0.5, 0.1], np.float32), cal)
    p = _softmax([1 / 1.3, 2 / 1.3, 0.5 / 1.3])
    assert ans["choice"] == "b" and list(ans) == ["type", "choice", "confidence", "probabilities",
                                                  "abstain_probability"]
    assert ans["probabilities"] == pytest.approx(dict(zip("abc", p)), abs=1e-12)
    assert ans["confidence"] == pytest.approx(sorted(p)[-1] - sorted(p)[-2], abs=1e-12)
    assert ans["abstain_probability"] == pytest.approx(_softmax([x / 1.3 for x in (1.0, 2.0, 0.5, 0.1)])[-1])
    # Noul runs as a choice: the choice temperature, over no/yes only, no abstain_probability
    n = engine_question("j", {"type": "noul", "instructions": "i"}, s, CAL)
    ans = single_answer(n, np.array([0.2, 1.0, 5.0], np.float32), cal)
    assert ans == {"type": "noul", "noul": pytest.approx(_softmax([0.2 / 1.3, 1.0 / 1.3])[1], abs=1e-7)}
    sc = engine_question("u", {"type": "score", "instructions": "i", "criteria": ["lo", {"x": 1}, "hi"]}, s, CAL)
    ans = single_answer(sc, np.array([0.0, 1.0, 2.0], np.float32), cal)
    p = _softmax([0.0, 1 / 1.1, 2 / 1.1])
    mean = p[1] + 2 * p[2]
    var = sum(pi * (i - mean) ** 2 for i, pi in enumerate(p))
    assert ans["score"] == pytest.approx(mean) and ans["confidence"] == pytest.approx(1 - var / ((9 - 1) / 12))
    assert ans["legend"] == {"0": "lo", "1": '{"x":1}', "2": "hi"}
    with pytest.raises(ValueError):
        single_answer(sc, np.array([0.0, np.nan, 1.0]), cal)


def test_set_answer_and_threshold_order() -> None:
    cal = Calibration(CAL)
    s = read_state("text")
    resp: dict = {"answers": {}}
    q = engine_question("tags", {"type": "set", "instructions": "i", "criteria": {"a": None, "b": None}}, s, CAL)
    set_answer(q, np.array([0.5, -0.2], np.float32), cal, resp)
    pa, pb = (1 / (1 + math.exp(-x / 1.05)) for x in (0.5, -0.2))
    assert resp["answers"] == {"tags.a": {"type": "noul", "noul": pytest.approx(pa)},
                               "tags.b": {"type": "noul", "noul": pytest.approx(pb)}}
    assert resp["thresholds"] == {"tags": 0.6}
    assert resp["sets"]["tags"]["selected"] == [name for name, p in (("a", pa), ("b", pb)) if p > 0.6]
    other = engine_question("other", {"type": "set", "instructions": "i", "criteria": {"a": None}}, s, CAL)
    set_answer(other, np.array([0.0]), cal, resp)
    assert resp["thresholds"]["other"] == 0.3 and resp["sets"]["other"]["selected"] == ["a"]  # 0.5 > 0.3
    given = engine_question("g", {"type": "set", "instructions": "i", "criteria": {"a": None}, "threshold": 0.5},
                            s, CAL)
    set_answer(given, np.array([0.0]), cal, resp)
    assert resp["sets"]["g"]["selected"] == []  # strictly above the threshold


def test_span_thresholds() -> None:
    cal = Calibration(CAL)
    assert cal.span_threshold("pii", ["X"], 21) == (pytest.approx(0.75), "pii:length")
    assert cal.span_threshold("q", ["PERSON"], 126)[0] == pytest.approx(0.05)  # all labels are PII types
    mid = math.exp(np.interp(math.log(60), [math.log(21), math.log(126)], [math.log(0.75), math.log(0.05)]))
    assert cal.span_threshold("pii", [], 60)[0] == pytest.approx(mid)
    assert cal.span_threshold("pii", [], 10 ** 6)[0] == pytest.approx(0.005919)  # clamped at the last anchor
    assert cal.span_threshold("halu", ["unsupported"], 5) == (0.55, "halu")
    assert cal.span_threshold("custom", ["x"], 5)[0] == 0.25
    assert cal.span_threshold("q", ["x"], 5) == (0.5, "span:*")
    buckets = Calibration({**{k: v for k, v in CAL.items() if k != "pii_length_rule"},
                           "pii_buckets": [{"name": "short", "max_tokens": 50, "threshold": 0.4},
                                           {"name": "long", "max_tokens": 10 ** 9, "threshold": 0.1}]})
    assert buckets.span_threshold("pii", [], 80) == (0.1, "pii:long")


def test_decode_spans_vote_fill_and_trim() -> None:
    text = 'Tom Baker lives "here" x+y'
    offsets = np.array([[0, 3], [4, 9], [10, 15], [16, 17], [17, 21], [21, 22], [23, 24], [24, 25], [25, 26]])
    p = np.zeros((9, 2), np.float32)
    p[0, 0], p[1, 0], p[4, 1] = 0.9, 0.8, 0.7          # Tom Baker -> label 0, here -> label 1
    p[6, 0], p[8, 1] = 0.9, 0.6                          # x (label 0) and y (label 1) share the unit "x+y"
    spans = decode_spans(p, offsets, ["person", "place"], text, 0.5)
    assert [(s["label"], text[s["start"]:s["end"]]) for s in spans] == [("person", "Tom Baker"), ("place", "here"),
                                                                        ("person", "x+y")]
    assert spans[0]["probability"] == pytest.approx((0.9 + 0.8) / 2)
    assert spans[2]["probability"] == pytest.approx(0.9 / 3)  # the filled "+" and outvoted "y" score 0 for label 0
    assert decode_spans(p, offsets, ["person", "place"], text, 0.95) == []


def test_span_answer_gate_and_clip() -> None:
    cal = Calibration(CAL)
    state = read_state({"document": "Tom Baker", "source": "Jane Roe wrote"})
    ctx = state.text("context")  # "document:\nTom Baker\n\nsource:\nJane Roe wrote"
    q = engine_question("pii", {"preset": "pii", "over": "source"},
                        state, {**CAL, "pii_schema": {"text": "t", "labels": {"PERSON": "p"}}})
    assert q.span_range == (ctx.index("Jane"), len(ctx))
    starts = [ctx.index(w) for w in ("document", "Tom", "Baker", "source", "Jane", "Roe", "wrote")]
    offsets = np.array([[a, a + len(w)] for a, w in zip(starts, ("document", "Tom", "Baker", "source", "Jane", "Roe",
                                                                   "wrote"))])
    logits = np.full((7, 1), -8.0)
    logits[[1, 2, 4, 5], 0] = 0.8                       # sigmoid(0.8 / 0.4) = 0.881
    raw = RawRow(span=RawSpan(["PERSON"], offsets, logits), part_tokens={"context": 21})
    resp: dict = {"answers": {}}
    span_answer(q, raw, state, cal, resp)
    # 21 tokens -> 0.75 by the length rule: above t_sparse, so the gate does not apply
    assert resp["thresholds"]["pii"] == pytest.approx(0.75)
    assert resp["spans"]["pii"] == [{"label": "PERSON", "start": 0, "end": 8, "text": "Jane Roe",
                                     "probability": pytest.approx(1 / (1 + math.exp(-2.0)), abs=1e-6)}]
    assert resp["answers"]["pii"]["noul"] == pytest.approx(1 / (1 + math.exp(-2.0)), abs=1e-6)
    # 126 tokens -> 0.05, below t_sparse 0.1; two spans at the probe 0.5 (<= K=3): decode at 0.1
    raw.part_tokens["context"] = 126
    resp = {"answers": {}}
    span_answer(q, raw, state, cal, resp)
    assert resp["thresholds"]["pii"] == pytest.approx(0.1)
    # a request threshold wins and skips the gate
    q2 = engine_question("pii", {"preset": "pii", "threshold": 0.95}, state,
                         {**CAL, "pii_schema": {"text": "t", "labels": {"PERSON": "p"}}})
    resp = {"answers": {}}
    span_answer(q2, RawRow(span=RawSpan(["PERSON"], offsets, logits), part_tokens={"context": 126}),
                read_state({"request": "x", "document": "Tom Baker", "source": "Jane Roe wrote"}), cal, resp)
    assert resp["thresholds"]["pii"] == 0.95


def test_response_body_order() -> None:
    body = response_body(["a", "tags", "s"], {"s": {"type": "noul", "noul": 0.1}, "tags.x": {"noul": 1},
                                              "a": {"type": "choice"}, "tags.y": {"noul": 2}},
                         {"thresholds": {"s": 0.5, "tags": 0.3}, "sets": {"tags": {}}, "spans": {"s": []}}, 42)
    assert list(body) == ["answers", "usage", "spans", "sets", "thresholds"]
    assert list(body["answers"]) == ["a", "tags.x", "tags.y", "s"]
    assert list(body["thresholds"]) == ["tags", "s"] and body["usage"] == {"input_tokens": 42, "output_tokens": 0}
