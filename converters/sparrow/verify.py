"""Verification of the sparrow graphs: model.onnx against the package's own numpy Decider through ONNX
Runtime, and the split question and answer graphs bit for bit against model.onnx."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from converters.sparrow.graphs import MAX_QUESTIONS_PER_RUN, MAX_SEGMENT_TOKENS, QUESTION_GRAPH, answer_file
from edge_runtime.engine import GraphSession
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.families.sparrow.family import (
    KINDS,
    OUTPUTS,
    SparrowForward,
    SparrowRow,
    SparrowText,
    SplitGraphs,
    content,
    state_feed,
)
from edge_runtime.questions import Question
from edge_runtime.requests.decisions import parse_decisions_request

# (state, question) pairs for golden.npz: the published examples plus unicode and structure.
GOLDEN: list[tuple[Any, dict[str, Any]]] = [
    ("User: I was charged twice for order 1182, I want my money back",
     {"type": "choice", "instructions": "Which tool fits this request?",
      "criteria": {"flights": "search and book flights", "refunds": "refund a payment",
                   "weather": "forecasts for a city", "calendar": "create or move meetings"}}),
    ("Write a Python function that merges two sorted lists",
     {"type": "noul", "instructions": "Is this about programming?"}),
    ("Write a Python function that merges two sorted lists",
     {"type": "score", "instructions": "How difficult is this task?",
      "criteria": ["trivial", "easy", "moderate", "hard", "very hard"]}),
    ({"user": "Où est ma commande ? Ça fait déjà 10 jours.", "order": {"id": 1182, "status": "shipped"}},
     {"type": "choice", "instructions": None,
      "criteria": {"shipping": "delivery and parcels", "billing": None, "other": "anything else"}}),
    ("", {"type": "noul", "instructions": "Is the state empty?",
          "criteria": {"true": "nothing was said"}}),
]

#: Random requests checked bit for bit through the split graphs at conversion, with the goldens.
SPLIT_CHECK_REQUESTS = 96


#: ORT vs the package's numpy path (which uses an approximate erf, error 1.5e-7): probabilities,
#: and logits, whose scale is a few units.
TOLERANCE = {"probs": 2e-6, "logits": 1e-5}


def golden_question(state: Any, raw: dict[str, Any]) -> Question:
    """A golden question in the validated form the family plans from, through the server's parser."""
    request = parse_decisions_request({"state": state, "questions": {"golden": raw}})
    assert request.single is not None
    return request.single.valid[0]


def reference_outputs(decider: Any, state: Any, raw: dict[str, Any]) -> dict[str, np.ndarray]:
    from sparrow_decider import _options  # the package's own option rendering

    kind, opts = _options(raw)
    logits = decider.static.logits(state, raw.get("instructions"), kind, opts)
    probs = decider.static.probs(state, raw.get("instructions"), kind, opts)
    return {"logits": np.asarray(logits, np.float32)[None], "probs": np.asarray(probs, np.float32)[None]}


def graph_session(model_bytes: bytes) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def verify_graph(model_bytes: bytes, cases: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> float:
    sess = graph_session(model_bytes)
    worst = 0.0
    for i, (feeds, want) in enumerate(cases):
        got = dict(zip(OUTPUTS, sess.run(list(OUTPUTS), feeds)))
        for name in OUTPUTS:
            diff = float(np.max(np.abs(got[name].astype(np.float64) - want[name])))
            if diff > TOLERANCE[name]:
                raise ValueError(f"golden case {i}: {name} differs from the reference by {diff:.3g}")
            worst = max(worst, diff)
        if int(np.argmax(got["probs"])) != int(np.argmax(want["probs"])):
            raise ValueError(f"golden case {i}: the graph's argmax differs from the reference")
    return worst


def _split_check_requests(text: SparrowText, vocab_size: int) -> list[list[SparrowRow]]:
    """Questions about one state each: the goldens' questions about every golden state, then
    seeded random ids of every shape the family makes (empty segments, up to 512 tokens, 40 options)."""
    questions = [golden_question(state, raw) for state, raw in GOLDEN]
    requests = []
    for state_value in dict.fromkeys(json.dumps(s) for s, _ in GOLDEN):
        golden_ids = text.ids(content(json.loads(state_value)), text.max_tokens)
        shared = state_feed(golden_ids)
        requests.append([text.row(golden_ids, q, shared) for q in questions])
    rng = np.random.default_rng(20261204)

    def random_ids(longest: int) -> list[int]:
        size = int(rng.choice([0, 1, int(rng.integers(1, 13)), longest]))
        return rng.integers(1, vocab_size, size=size).tolist()

    for _ in range(SPLIT_CHECK_REQUESTS):
        state_ids = random_ids(int(rng.integers(1, MAX_SEGMENT_TOKENS + 1)))
        shared = state_feed(state_ids)
        rows = []
        for _ in range(int(rng.integers(2, 2 * MAX_QUESTIONS_PER_RUN + 2))):
            count = int(rng.choice([2, 3, 5, int(rng.integers(2, 41))]))
            options = [random_ids(int(rng.integers(1, 200))) for _ in range(count)]
            row = text.feeds(state_ids, random_ids(int(rng.integers(1, MAX_SEGMENT_TOKENS + 1))), options,
                             int(rng.integers(0, len(KINDS))))
            rows.append(SparrowRow({**row.feeds, "state_ids": shared}, row.tokens))
        requests.append(rows)
    return requests


def verify_split_graphs(model_bytes: bytes, split: dict[str, bytes], text: SparrowText, vocab_size: int) -> int:
    """Check that the split graphs, as the family runs them (question tensors cached, chunks of
    questions about one state), answer every question exactly as model.onnx does alone; returns
    the number of questions checked."""
    def session(name: str, data: bytes) -> GraphSession:
        return GraphSession(graph_session(data), Path(name), "cpu", 1)

    single = session("model.onnx", model_bytes)
    answers = {n: session(answer_file(n), split[answer_file(n)]) for n in range(1, MAX_QUESTIONS_PER_RUN + 1)}
    forward = SparrowForward(single, SplitGraphs(session(QUESTION_GRAPH, split[QUESTION_GRAPH]), answers))
    whole = SparrowForward(single)
    checked = 0
    for i, rows in enumerate(_split_check_requests(text, vocab_size)):
        for k, (got, want) in enumerate(zip(forward(rows), whole(rows))):
            if not bitwise_equal(got, want):
                raise ValueError(f"split graph case {i}, question {k} of {len(rows)}: differs from model.onnx")
            checked += 1
    return checked
