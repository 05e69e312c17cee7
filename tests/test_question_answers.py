"""Decision answers: the contract's formulas and System One's published test vectors (standard 1.3)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.heads.decisions import IN_ORDER_SUM, InvalidModelOutput, distribution
from edge_runtime.heads.tokens import Span
from edge_runtime.questions.answers import DecisionAnswers
from edge_runtime.questions.choice import choice_answer
from edge_runtime.questions.choice import confidence as choice_confidence
from edge_runtime.questions.noul import noul_answer, noul_from_pair
from edge_runtime.questions.score import confidence as score_confidence
from edge_runtime.questions.score import score_answer


def test_choice_confidence_formula() -> None:
    # (p_max - 1/n) / (1 - 1/n); for three options that is (3 p_max - 1) / 2
    assert choice_confidence(np.array([0.88, 0.12, 0.0])) == pytest.approx(0.82)
    assert choice_confidence(np.array([1.0, 0.0, 0.0])) == 1.0
    assert choice_confidence(np.array([0.25, 0.25, 0.25, 0.25])) == pytest.approx(0.0, abs=1e-15)
    assert choice_confidence(np.array([0.6, 0.4])) == pytest.approx(0.2)
    assert choice_confidence(np.array([1.0])) == 1.0
    p = np.full(255, 1 / 255)
    p[7] += 0.1
    p /= p.sum()
    assert choice_confidence(p) == pytest.approx((p.max() - 1 / 255) / (1 - 1 / 255))


def test_choice_answer_keys_ties_and_order() -> None:
    keys = ["billing", "technical support", "sales 🙂"]
    a = choice_answer(keys, [0.4, 0.4, 0.2])
    assert a["choice"] == "billing"  # ties go to the first option in request order
    assert list(a["probabilities"]) == keys
    assert a["type"] == "choice" and "abstain_probability" not in a
    a = choice_answer(keys, np.array([0.1, 0.2, 0.7], np.float32), abstain_probability=0.01)
    assert a["choice"] == "sales 🙂" and a["abstain_probability"] == 0.01
    assert sum(a["probabilities"].values()) == pytest.approx(1.0, abs=1e-12)
    assert all(type(v) is float for v in a["probabilities"].values())


@pytest.mark.parametrize("p, want", [
    ([0.0, 1.0, 0.0], 1.0),
    ([0.5, 0.0, 0.5], 0.0),
    ([0.0, 0.95, 0.05], 0.925),
    ([0.0, 0.57, 0.43], 0.355),
    # the contract's example, torn between Moderate and Hard (Hard a hair ahead): confidence 0
    ([0.13, 0.434, 0.436], 0.0),
])
def test_score_confidence_vectors(p: list[float], want: float) -> None:
    assert score_confidence(np.array(p)) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("n, mad_unif", [(2, 0.5), (3, 2 / 3), (5, 1.2), (10, 2.5)])
def test_score_confidence_spread_of_an_even_split(n: int, mad_unif: float) -> None:
    # one unit of mass e on the neighbour of the mode costs e / MAD_unif
    e = 0.05 * mad_unif * 2
    p = np.zeros(n)
    p[0], p[1] = 1 - e, e
    assert score_confidence(p) == pytest.approx(1 - e / mad_unif)
    # the same mass two levels away costs twice as much (where there is a level two away)
    if n > 2:
        q = np.zeros(n)
        q[0], q[2] = 1 - e, e
        assert score_confidence(q) == pytest.approx(1 - 2 * e / mad_unif)


def test_score_answer() -> None:
    a = score_answer(["Trivial", "Moderate", "Hard"], [0.0, 0.95, 0.05])
    assert a == {"type": "score", "score": pytest.approx(1.05), "confidence": pytest.approx(0.925),
                 "legend": {"0": "Trivial", "1": "Moderate", "2": "Hard"},
                 "probabilities": {"0": 0.0, "1": pytest.approx(0.95), "2": pytest.approx(0.05)}}
    p = np.random.default_rng(0).dirichlet(np.ones(10))
    a = score_answer([f"l{i}" for i in range(10)], p)
    assert a["score"] == pytest.approx(float(np.dot(np.arange(10), p)))
    assert list(a["probabilities"]) == [str(i) for i in range(10)]


def test_noul() -> None:
    assert noul_answer(0.34) == {"type": "noul", "noul": 0.34}  # no confidence, by the standard
    assert noul_from_pair(np.array([0.25, 0.75], np.float32)) == {"type": "noul", "noul": pytest.approx(0.75)}
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(InvalidModelOutput):
            noul_answer(bad)


def test_distribution_renormalises_and_refuses_garbage() -> None:
    p = distribution(np.array([0.2, 0.3, 0.5000001], np.float32))
    assert p.dtype == np.float64 and p.sum() == pytest.approx(1.0, abs=1e-15)
    for bad in ([np.nan, 0.5], [np.inf, 0.0], [-0.1, 1.1], [0.0, 0.0], []):
        with pytest.raises(InvalidModelOutput):
            distribution(np.array(bad))
    with pytest.raises(InvalidModelOutput):
        distribution([0.5, 0.5], count=3)
    with pytest.raises(InvalidModelOutput):
        choice_answer(["a", "b", "c"], [0.5, 0.5])
    for bad in ([0.5, np.nan], [0.2, 0.3, np.nan, 0.5], [0.5] * 9 + [np.nan], [0.5, -np.inf, np.inf]):
        with pytest.raises(InvalidModelOutput):  # a NaN anywhere, on either side of the in-order threshold
            distribution(np.array(bad))


def test_distribution_is_numpys_renormalisation_bit_for_bit() -> None:
    # Few options take Python floats (numpy sums fewer than 8 numbers in order); many take numpy.
    rng = np.random.default_rng(0)
    for n in range(1, 3 * IN_ORDER_SUM):
        for _ in range(300):
            z = rng.standard_normal(n) * rng.choice([1.0, 5.0, 20.0, 60.0])
            probs = (np.exp(z - z.max()) / np.exp(z - z.max()).sum()).astype(np.float32)
            p64 = probs.astype(np.float64)
            assert distribution(probs).tobytes() == (p64 / p64.sum()).tobytes(), (n, probs)


def test_set_answers_are_nouls_and_selected_at_or_above_threshold() -> None:
    answers = DecisionAnswers()
    answers.add_set("problems", ["billing", "shipping", "account"], [0.95, 0.7, 0.03], 0.3)
    answers.add_set("edge", ["at", "below"], [0.3, 0.2999999], 0.3)
    body = answers.body()
    assert body["answers"]["problems.billing"] == {"type": "noul", "noul": 0.95}
    assert body["answers"]["problems.account"] == {"type": "noul", "noul": 0.03}
    assert body["sets"]["problems"] == {"selected": ["billing", "shipping"],
                                        "probabilities": {"billing": 0.95, "shipping": 0.7, "account": 0.03}}
    assert body["sets"]["edge"]["selected"] == ["at"]
    assert body["thresholds"] == {"problems": 0.3, "edge": 0.3}
    assert "spans" not in body
    with pytest.raises(InvalidModelOutput):
        answers.add_set("broken", ["a", "b"], [0.5, float("nan")], 0.3)
    assert "broken.a" not in answers.answers  # nothing half-added


def test_span_answer_and_body_order() -> None:
    answers = DecisionAnswers()
    answers.add("first", noul_answer(0.5))
    answers.add_span("contacts", [Span("PHONE", 95, 103, "555-0100", 0.9),
                                  Span("EMAIL_ADDRESS", 71, 91, "jane.doe@example.com", 1.0)], 1.0, 0.65)
    body = answers.body()
    assert list(body) == ["answers", "spans", "thresholds"]
    assert list(body["answers"]) == ["first", "contacts"]
    assert body["answers"]["contacts"] == {"type": "noul", "noul": 1.0}
    assert body["spans"]["contacts"][0] == {"label": "EMAIL_ADDRESS", "start": 71, "end": 91,
                                            "text": "jane.doe@example.com", "probability": 1.0}
    assert [s["start"] for s in body["spans"]["contacts"]] == [71, 95]
    assert body["thresholds"] == {"contacts": 0.65}
    assert DecisionAnswers().body() == {"answers": {}}


def _float32_distributions(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Softmax outputs as a graph returns them (float32), with ties, zeros and one-hot cases."""
    x = rng.normal(size=n).astype(np.float32)
    e = np.exp(x - x.max())
    tied = np.ones(n, dtype=np.float32) / n
    one_hot = np.zeros(n, dtype=np.float32)
    one_hot[n // 2] = 1.0
    peaked = np.full(n, 1e-7, dtype=np.float32)
    peaked[[0, n - 1]] = 0.5
    return [(e / e.sum()).astype(np.float32), tied, one_hot, peaked]


def test_choice_and_score_readouts_are_the_numpy_formulas_bit_for_bit() -> None:
    """The readouts read plain floats where that is exact (max, first argmax, the values); every
    answer must still equal the formulas computed in numpy throughout, to the last bit."""
    rng = np.random.default_rng(13)
    for n in [*range(2, 12), 37, 128, 255]:
        keys = [f"k{i}" for i in range(n)]
        for probs in _float32_distributions(n, rng):
            p = probs.astype(np.float64) / probs.astype(np.float64).sum()
            got = choice_answer(keys, probs)
            assert got["choice"] == keys[int(np.argmax(p))]
            assert got["confidence"] == min(1.0, max(0.0, (float(p.max()) - 1.0 / n) / (1.0 - 1.0 / n)))
            assert got["probabilities"] == {k: float(x) for k, x in zip(keys, p)}
            if n > 10:
                continue
            levels = np.arange(n, dtype=np.float64)
            mad_unif = float(np.abs(levels - (n - 1) / 2.0).sum() / n)
            spread = float((p * np.abs(levels - int(np.argmax(p)))).sum())
            scored = score_answer([f"level {i}" for i in range(n)], probs)
            assert scored["score"] == float((levels * p).sum())
            assert scored["confidence"] == min(1.0, max(0.0, 1.0 - spread / mad_unif))
            assert scored["probabilities"] == {str(i): float(x) for i, x in enumerate(p)}
