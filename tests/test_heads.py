"""The pure numpy readouts of the encoder surfaces."""

from types import SimpleNamespace

import numpy as np
import pytest

from edge_runtime.heads.activations import sigmoid, softmax
from edge_runtime.heads.pooling import embed, pool, project
from edge_runtime.heads.tokens import decode_bio
from edge_runtime.heads.windows import max_over_windows, pick_token_rows


def test_softmax_is_stable_and_sums_to_one() -> None:
    p = softmax(np.array([1000.0, 1000.0, -1000.0]))
    assert np.all(np.isfinite(p))
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert p[0] == pytest.approx(0.5)
    assert softmax(np.array([0.0, np.log(3.0)]))[1] == pytest.approx(0.75)


def test_softmax_temperature() -> None:
    logits = np.array([0.0, 1.0])
    assert softmax(logits, 2.0)[1] == pytest.approx(1 / (1 + np.exp(-0.5)))


def test_sigmoid_extremes_do_not_overflow() -> None:
    s = sigmoid(np.array([-1000.0, 0.0, 1000.0]))
    assert s.tolist() == [0.0, 0.5, 1.0]


def test_pooling_modes_and_matryoshka() -> None:
    hidden = np.array([[1.0, 2.0, 3.0, 4.0], [3.0, 2.0, 1.0, 0.0]], dtype=np.float32)
    assert pool(hidden, "mean").tolist() == [2.0, 2.0, 2.0, 2.0]
    assert pool(hidden, "cls").tolist() == [1.0, 2.0, 3.0, 4.0]
    assert pool(hidden, "last").tolist() == [3.0, 2.0, 1.0, 0.0]
    v = embed(hidden, "cls", True, 2)
    assert v.shape == (2,)
    assert float(np.linalg.norm(v)) == pytest.approx(1.0, abs=1e-6)
    assert v[1] / v[0] == pytest.approx(2.0)
    with pytest.raises(ValueError):
        pool(hidden, "max")


def test_dense_projections_come_before_truncation() -> None:
    """sentence-transformers' order: pool, Dense modules, then Matryoshka truncation and normalisation."""
    hidden = np.array([[1.0, -2.0], [3.0, 0.0]], dtype=np.float32)  # mean [2, -1]
    up = (np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=np.float32), np.array([0.0, 0.0, 1.0]), "tanh")
    down = (np.array([[2.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32), None, "identity")
    assert project(pool(hidden, "mean"), [up, down]) == pytest.approx([2 * np.tanh(2.0), np.tanh(2.0)])
    v = embed(hidden, "mean", True, 1, [up, down])
    assert v.tolist() == [1.0]  # the first channel after both projections, renormalised
    with pytest.raises(ValueError):
        project(pool(hidden, "mean"), [(up[0], None, "relu")])


def test_decode_bio_spans_offsets_and_probability() -> None:
    labels = ["O", "B-PER", "I-PER", "B-LOC"]
    text = "Tom Baker lives in Paris"
    #        tokens: [CLS] Tom Baker lives in Paris [SEP]
    offsets = np.array([[0, 0], [0, 3], [3, 9], [10, 15], [16, 18], [19, 24], [0, 0]])
    chosen = [0, 1, 2, 0, 0, 3, 0]
    probs = np.full((7, 4), 0.1)
    for t, c in enumerate(chosen):
        probs[t, c] = 0.7
    probs[2, 2] = 0.9
    spans = decode_bio(probs, offsets, labels, text)
    assert [(s.label, s.start, s.end, s.text) for s in spans] == [
        ("PER", 0, 9, "Tom Baker"),
        ("LOC", 19, 24, "Paris"),
    ]
    assert spans[0].probability == pytest.approx(0.8)


def test_decode_bio_i_of_other_entity_opens_new_span() -> None:
    labels = ["O", "B-A", "I-B"]
    offsets = np.array([[0, 1], [2, 3]])
    probs = np.array([[0, 1, 0], [0, 0, 1]], dtype=float)
    spans = decode_bio(probs, offsets, labels, "a b")
    assert [(s.label, s.text) for s in spans] == [("A", "a"), ("B", "b")]


def test_windows_reduce_and_pick_most_context() -> None:
    assert max_over_windows([np.array([0.1, 0.9]), np.array([0.6, 0.4])]).tolist() == [0.6, 0.9]
    # two windows over content tokens 0..5: window A holds 0..3, window B holds 2..5
    a = SimpleNamespace(sequence_ids=[None, 0, 0, 0, 0, None], offsets=[(0, 0), (0, 1), (1, 2), (2, 3), (3, 4), (0, 0)],
                        sequence_starts=(0,))
    b = SimpleNamespace(sequence_ids=[None, 0, 0, 0, 0, None], offsets=[(0, 0), (2, 3), (3, 4), (4, 5), (5, 6), (0, 0)],
                        sequence_starts=(2,))
    pa = np.zeros((6, 2))
    pa[:, 0] = 1
    pb = np.zeros((6, 2))
    pb[:, 1] = 1
    probs, offsets = pick_token_rows([(pa, a), (pb, b)], 0)
    assert offsets[:, 0].tolist() == [0, 1, 2, 3, 4, 5]
    # token 2: context 1 in A (k=2 of 4 -> min(2,1)=1), 0 in B (k=0) -> A; token 3: A k=3 ->0, B k=1 ->1 -> B
    assert probs.argmax(axis=1).tolist() == [0, 0, 0, 1, 1, 1]
