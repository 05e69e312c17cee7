"""Build the ``sparrow-nano`` package from the sparrow-decider wheel's bundled nano-general model.

The ``.sparrow`` file is a zip of config.json, tokenizer.json (a WordPiece vocabulary) and
model.npz (int8 weights, one fp32 scale per row). Nothing in it is executed: the zip is read as
data, the graph is written with ``onnx.helper`` at opset 18, and the tokenizer is rebuilt as a
Hugging Face ``tokenizers`` file. The graph keeps the int8 embedding table (Gather -> Cast -> Mul by
the row's scale), and dequantises the small MLP once, as the package's own loader does.

Graph (batch axis 1; one question per run; model.question.onnx and model.answer{n}.onnx are it in
two halves, see build_question_graph and build_answer_graph):
    state_ids int64[1,S], question_ids int64[1,Q], option_ids int64[1,K,L] (0-padded),
    option_mask f32[1,K,L], kind int64[1] (0 noul, 1 choice, 2 score)
    -> logits f32[1,K], probs f32[1,K] = softmax(logits / T[kind])

Golden cases record the package's own numpy ``Decider`` (the reference), and the build checks the
graph against it through ONNX Runtime before the package is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import zipfile
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from converters import CONVERTER_VERSION
from converters.package_writer import card_start, write_package
from converters.progress import log
from edge_runtime.engine import GraphSession
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.families.sparrow.family import (
    INPUTS,
    KINDS,
    OUTPUTS,
    QUESTION_TENSORS,
    ROW_TENSORS,
    SPLIT_LAYOUT,
    SparrowForward,
    SparrowRow,
    SparrowText,
    SplitGraphs,
    content,
    state_feed,
)
from edge_runtime.questions import Question
from edge_runtime.requests.decisions import parse_decisions_request

PACKAGE_NAME = "sparrow-nano"
SOURCE_MODEL = "sparrow-nano-general-v1.1"
SOURCE_DIST = "sparrow-decider"
OPSET = 18
MAX_SEGMENT_TOKENS = 512
#: model.onnx split in two (build_question_graph, build_answer_graph): the answer graphs take up to
#: this many questions about one state per run, more run in chunks. A Router request asks a few
#: questions; each answer graph is a session holding the 2 MB table.
MAX_QUESTIONS_PER_RUN = 4
QUESTION_GRAPH = "model.question.onnx"
#: Random requests checked bit for bit through the split graphs at conversion, with the goldens.
SPLIT_CHECK_REQUESTS = 96
#: ORT vs the package's numpy path (which uses an approximate erf, error 1.5e-7): probabilities,
#: and logits, whose scale is a few units.
TOLERANCE = {"probs": 2e-6, "logits": 1e-5}

CARD_DESCRIPTION = (
    "sparrow-nano-general v1.1 from sparrow-decider: a 2.2M-parameter bag-of-words decision model "
    "(WordPiece static embeddings and a small MLP) for Choice, Noul and Score questions. Fast and "
    "weak: it cannot see word order or negation; the embedded default and a parity reference."
)

# (state, question) pairs for golden.npz: the published examples plus unicode and structure.
_GOLDEN: list[tuple[Any, dict[str, Any]]] = [
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


# The MIT licence of the weights sparrow-nano is fine-tuned from; the copyright line is the one
# sparrow-decider's NOTICE gives for potion-base-8M / Model2Vec.
_MIT_POTION = """MIT License

Copyright (c) 2024 Thomas van Dongen

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""


def _source_file() -> Path:
    path = resources.files("sparrow_decider").joinpath("models", f"{SOURCE_MODEL}.sparrow")
    return Path(str(path))


def _read_source(path: Path) -> tuple[dict[str, Any], dict[str, int], dict[str, np.ndarray]]:
    with zipfile.ZipFile(path) as zf:
        cfg = json.loads(zf.read("config.json"))
        vocab = json.loads(zf.read("tokenizer.json"))["vocab"]
        with np.load(io.BytesIO(zf.read("model.npz")), allow_pickle=False) as z:
            weights = {k: z[k] for k in z.files}
    if cfg.get("arch") != "static" or cfg.get("kv"):
        raise ValueError(
            f"{path.name}: only the kv-free static tier converts (arch={cfg.get('arch')}, kv={cfg.get('kv')})"
        )
    return cfg, vocab, weights


def _dequant(weights: dict[str, np.ndarray], name: str) -> np.ndarray:
    # Same float32 operations as sparrow_decider._dequant, so the weights are bit-identical.
    f = weights[f"{name}.q8"].astype(np.float32)
    f *= weights[f"{name}.scale"][:, None]
    return f


# ---- tokenizer ---------------------------------------------------------------------------


def build_tokenizer(vocab: dict[str, int]) -> Any:
    """BERT-uncased WordPiece as the package's pure-Python one: no specials, no truncation."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


# ---- graph -------------------------------------------------------------------------------


def _const(name: str, value: Any, dtype: Any = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


class _Graph:
    """One graph of the static tier being written: its nodes, the weights they use, its building blocks."""

    def __init__(self, cfg: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
        temps = cfg["temperature_by_kind"]
        t_by_kind = [0.0] * len(KINDS)
        for kind, index in KINDS.items():
            t_by_kind[index] = float(temps.get(kind, 1.0))
        self.init = [
            numpy_helper.from_array(np.ascontiguousarray(weights["emb.weight.q8"]), "emb_q8"),
            _const("emb_scale", weights["emb.weight.scale"][:, None]),
            _const("kind_emb", _dequant(weights, "kind.weight")),
            _const("w0", _dequant(weights, "mlp.0.weight").T.copy()),
            _const("b0", weights["mlp.0.bias"]),
            _const("w1", _dequant(weights, "mlp.2.weight").T.copy()),
            _const("b1", weights["mlp.2.bias"]),
            _const("w2", _dequant(weights, "mlp.4.weight").T.copy()),
            _const("b2", weights["mlp.4.bias"]),
            _const("temperature", t_by_kind),
            _const("eps", 1e-12),
            _const("half", 0.5),
            _const("one", 1.0),
            _const("sqrt2", math.sqrt(2.0)),
            _const("ax1", [1], np.int64),
            _const("ax2", [2], np.int64),
            _const("ax_last", [-1], np.int64),
        ]
        self.nodes: list[onnx.NodeProto] = []

    def node(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def lookup(self, ids: str, prefix: str) -> str:
        # int8 rows dequantised on lookup: Gather -> Cast -> Mul by the gathered row scale.
        q = self.node("Gather", ["emb_q8", ids], f"{prefix}_q8")
        f = self.node("Cast", [q], f"{prefix}_f", to=TensorProto.FLOAT)
        s = self.node("Gather", ["emb_scale", ids], f"{prefix}_scale")
        return self.node("Mul", [f, s], f"{prefix}_emb")

    def l2norm(self, x: str, prefix: str) -> str:
        n = self.node("ReduceL2", [x, "ax_last"], f"{prefix}_norm", keepdims=1)
        n = self.node("Max", [n, "eps"], f"{prefix}_norm_eps")
        return self.node("Div", [x, n], f"{prefix}_unit")

    def gelu(self, x: str, prefix: str) -> str:
        # exact GELU: 0.5 * x * (1 + erf(x / sqrt 2))
        e = self.node("Erf", [self.node("Div", [x, "sqrt2"], f"{prefix}_scaled")], f"{prefix}_erf")
        return self.node("Mul", [self.node("Mul", [x, "half"], f"{prefix}_half"),
                                 self.node("Add", [e, "one"], f"{prefix}_erf1")], f"{prefix}_gelu")

    def state_mean(self) -> str:
        return self.node("ReduceMean", [self.lookup("state_ids", "state"), "ax1"], "state_mean", keepdims=0)  # [1,D]

    def state_unit(self, mean: str) -> str:
        return self.node("Unsqueeze", [self.l2norm(mean, "s"), "ax1"], "s3")                              # [1,1,D]

    def question_pools(self) -> tuple[str, str]:
        """A question's pooled vector (with its kind) [1,D] and its options' means [1,K,D]."""
        q = self.node("ReduceMean", [self.lookup("question_ids", "question"), "ax1"], "question_mean", keepdims=0)
        q = self.node("Add", [q, self.node("Gather", ["kind_emb", "kind"], "kind_vec")], "question_vec")
        mask = self.node("Unsqueeze", ["option_mask", "ax_last"], "option_mask_3")                          # [1,K,L,1]
        masked = self.node("Mul", [self.lookup("option_ids", "option"), mask], "option_masked")
        o_sum = self.node("ReduceSum", [masked, "ax2"], "option_sum", keepdims=0)                             # [1,K,D]
        o_cnt = self.node("ReduceSum", ["option_mask", "ax_last"], "option_count", keepdims=1)               # [1,K,1]
        return q, self.node("Div", [o_sum, o_cnt], "option_mean")

    def question_units(self, q: str, o: str) -> tuple[str, str, str]:
        """The question's unit vector [1,1,D], its options' unit vectors [1,K,D] and their mean [1,1,D]."""
        q3 = self.node("Unsqueeze", [self.l2norm(q, "q"), "ax1"], "q3")
        o = self.l2norm(o, "o")
        return q3, o, self.node("ReduceMean", [o, "ax1"], "om", keepdims=1)

    def features(self, s: str, q: str, o: str, om: str, given: tuple[str, str] | None = None) -> str:
        """Option feature rows [1,R,6D] (q and om broadcast to o's rows); ``given`` are f_qo and
        f_o_om when the question graph computed them."""
        sq = self.node("Mul", [s, q], "sq")
        f_so = self.node("Mul", [s, o], "f_so")
        f_qo = given[0] if given else self.node("Mul", [q, o], "f_qo")
        f_sqo = self.node("Mul", [sq, o], "f_sqo")
        f_o_om = given[1] if given else self.node("Sub", [o, om], "f_o_om")
        f_s_om_o = self.node("Mul", [self.node("Sub", [s, om], "s_om"), o], "f_s_om_o")
        return self.node("Concat", [o, f_so, f_qo, f_sqo, f_o_om, f_s_om_o], "features", axis=-1)

    def scores(self, rows: str) -> str:
        """The MLP over option feature rows [1,R,6D]: logits [1,R,1]."""
        h = self.gelu(self.node("Add", [self.node("MatMul", [rows, "w0"], "mm0"), "b0"], "h0"), "g0")
        h = self.gelu(self.node("Add", [self.node("MatMul", [h, "w1"], "mm1"), "b1"], "h1"), "g1")
        return self.node("Add", [self.node("MatMul", [h, "w2"], "mm2"), "b2"], "logit3")

    def probs(self, logits: str, temperature: str, x: str = "") -> None:
        self.node("Softmax", [self.node("Div", [logits, temperature], f"scaled_logits{x}")], f"probs{x}", axis=-1)

    def model(self, name: str, inputs: list[onnx.ValueInfoProto],
              outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        used = {i for n in self.nodes for i in n.input}
        graph = helper.make_graph(self.nodes, name, inputs, outputs,
                                  initializer=[t for t in self.init if t.name in used])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="edge-runtime converters.sparrow", producer_version=CONVERTER_VERSION)
        model.ir_version = 8  # opset 18's IR; keeps the file readable by older runtimes
        onnx.checker.check_model(model, full_check=True)
        return model


_I64, _F32 = TensorProto.INT64, TensorProto.FLOAT


def _question_inputs() -> list[onnx.ValueInfoProto]:
    return [
        helper.make_tensor_value_info("question_ids", _I64, [1, "Q"]),
        helper.make_tensor_value_info("option_ids", _I64, [1, "K", "L"]),
        helper.make_tensor_value_info("option_mask", _F32, [1, "K", "L"]),
        helper.make_tensor_value_info("kind", _I64, [1]),
    ]


def _question_tensors() -> list[onnx.ValueInfoProto]:
    """The question graph's outputs: one row per option of every tensor the answer half reads
    ([1,K,D]; the question's and the options' mean vectors repeated per option), and its kind's
    temperature [1]."""
    shapes: dict[str, list[int | str]] = {name: [1, "K", "D"] for name in ROW_TENSORS}
    shapes["kind_temperature"] = [1]
    assert tuple(shapes) == QUESTION_TENSORS
    return [helper.make_tensor_value_info(n, _F32, shape) for n, shape in shapes.items()]


def build_graph(cfg: dict[str, Any], weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The static tier as an ONNX graph (see the module docstring for its signature)."""
    g = _Graph(cfg, weights)
    state = g.state_mean()
    q, o = g.question_pools()
    s = g.state_unit(state)
    q, o, om = g.question_units(q, o)
    feats = g.features(s, q, o, om)
    g.node("Squeeze", [g.scores(feats), "ax_last"], "logits")                                         # [1,K]
    g.probs("logits", g.node("Gather", ["temperature", "kind"], "kind_temperature"))
    inputs = [helper.make_tensor_value_info("state_ids", _I64, [1, "S"]), *_question_inputs()]
    assert [i.name for i in inputs] == list(INPUTS)
    return g.model("sparrow_static", inputs, [helper.make_tensor_value_info(n, _F32, [1, "K"]) for n in OUTPUTS])


def build_question_graph(cfg: dict[str, Any], weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The half of build_graph that reads only the question: its inputs -> QUESTION_TENSORS.

    Its nodes are build_graph's on the same shapes, so the tensors are the ones model.onnx computes;
    the two [1,1,D] vectors are expanded (copied) to one row per option.
    """
    g = _Graph(cfg, weights)
    q, o = g.question_pools()
    q, o, om = g.question_units(q, o)
    g.node("Mul", [q, o], "f_qo")
    g.node("Sub", [o, om], "f_o_om")
    rows = g.node("Shape", [o], "o_shape")
    g.node("Expand", [q, rows], "q_rows")
    g.node("Expand", [om, rows], "om_rows")
    g.node("Gather", ["temperature", "kind"], "kind_temperature")
    return g.model("sparrow_static_question", _question_inputs(), _question_tensors())


def build_answer_graph(cfg: dict[str, Any], weights: dict[str, np.ndarray], questions: int) -> onnx.ModelProto:
    """The rest of build_graph for ``questions`` questions about one state.

    Inputs: state_ids; the questions' ROW_TENSORS concatenated along the option axis ([1,R,D],
    R options in all); kind_temperature [n], one per question; and, for n > 1, rows [n], each
    question's option count. Outputs: logits_i and probs_i per question.

    The state is pooled once, the feature rows of every option are one set of element-wise nodes,
    and the MLP runs once over all rows (its matmuls treat rows alone); the softmax runs per question
    on its own shape. Element-wise products do not care which tensor broadcast into them, so each
    question's outputs are model.onnx's bit for bit (ORT's reductions depend on the reduced length,
    which is why questions are never padded to one shape); the conversion checks it
    (_verify_split_graphs). Fewer, wider nodes than one set per question: 29 for 3 questions
    instead of 49, a quarter less time on the CPU.
    """
    if questions < 1:
        raise ValueError(f"questions must be >= 1, not {questions}")
    g = _Graph(cfg, weights)
    s = g.state_unit(g.state_mean())
    rows = g.features(s, "q_rows", "o_unit", "om_rows", given=("f_qo", "f_o_om"))               # [1,R,6D]
    xs = [f"_{i}" for i in range(questions)]
    logits = g.node("Squeeze", [g.scores(rows), "ax_last"], "logits_0" if questions == 1 else "logits_rows")
    if questions == 1:
        g.node("Identity", ["kind_temperature"], "kind_temperature_0")
    else:  # back to one [1,K] per question, and one temperature each
        g.nodes.append(helper.make_node("Split", [logits, "rows"], [f"logits{x}" for x in xs],
                                        name="logits_split", axis=1))
        g.init.append(_const("one_each", [1] * questions, np.int64))
        g.nodes.append(helper.make_node("Split", ["kind_temperature", "one_each"],
                                        [f"kind_temperature{x}" for x in xs], name="temperature_split", axis=0))
    for x in xs:
        g.probs(f"logits{x}", f"kind_temperature{x}", x)
    inputs = [helper.make_tensor_value_info("state_ids", _I64, [1, "S"])]
    inputs += [helper.make_tensor_value_info(name, _F32, [1, "R", "D"]) for name in ROW_TENSORS]
    inputs.append(helper.make_tensor_value_info("kind_temperature", _F32, [questions]))
    if questions > 1:
        inputs.append(helper.make_tensor_value_info("rows", _I64, [questions]))
    outputs = [helper.make_tensor_value_info(f"{n}{x}", _F32, [1, f"K{x}"]) for x in xs for n in OUTPUTS]
    return g.model(f"sparrow_static_answer_{questions}q", inputs, outputs)


# ---- reference and goldens ---------------------------------------------------------------


def _question(state: Any, raw: dict[str, Any]) -> Question:
    """A golden question in the validated form the family plans from, through the server's parser."""
    request = parse_decisions_request({"state": state, "questions": {"golden": raw}})
    assert request.single is not None
    return request.single.valid[0]


def _reference(decider: Any, state: Any, raw: dict[str, Any]) -> dict[str, np.ndarray]:
    from sparrow_decider import _options  # the package's own option rendering

    kind, opts = _options(raw)
    logits = decider.static.logits(state, raw.get("instructions"), kind, opts)
    probs = decider.static.probs(state, raw.get("instructions"), kind, opts)
    return {"logits": np.asarray(logits, np.float32)[None], "probs": np.asarray(probs, np.float32)[None]}


def _session(model_bytes: bytes) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def _verify(model_bytes: bytes, cases: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> float:
    sess = _session(model_bytes)
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
    questions = [_question(state, raw) for state, raw in _GOLDEN]
    requests = []
    for state_value in dict.fromkeys(json.dumps(s) for s, _ in _GOLDEN):
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


def _answer_file(questions: int) -> str:
    return f"model.answer{questions}.onnx"


def _verify_split_graphs(model_bytes: bytes, split: dict[str, bytes], text: SparrowText, vocab_size: int) -> int:
    """Check that the split graphs, as the family runs them (question tensors cached, chunks of
    questions about one state), answer every question exactly as model.onnx does alone; returns
    the number of questions checked."""
    def session(name: str, data: bytes) -> GraphSession:
        return GraphSession(_session(data), Path(name), "cpu", 1)

    single = session("model.onnx", model_bytes)
    answers = {n: session(_answer_file(n), split[_answer_file(n)]) for n in range(1, MAX_QUESTIONS_PER_RUN + 1)}
    forward = SparrowForward(single, SplitGraphs(session(QUESTION_GRAPH, split[QUESTION_GRAPH]), answers))
    whole = SparrowForward(single)
    checked = 0
    for i, rows in enumerate(_split_check_requests(text, vocab_size)):
        for k, (got, want) in enumerate(zip(forward(rows), whole(rows))):
            if not bitwise_equal(got, want):
                raise ValueError(f"split graph case {i}, question {k} of {len(rows)}: differs from model.onnx")
            checked += 1
    return checked


# ---- package -----------------------------------------------------------------------------


def _licenses() -> dict[str, bytes]:
    dist = metadata.distribution(SOURCE_DIST)
    out = {}
    for name in ("LICENSE", "NOTICE"):
        f = next((p for p in dist.files or () if p.name == name and "licenses" in p.parts), None)
        if f is None:
            raise FileNotFoundError(f"{SOURCE_DIST} ships no {name}; its notices must travel with the weights")
        out[f"LICENSES/sparrow-decider-{name}"] = Path(str(f.locate())).read_bytes()
    out["LICENSES/potion-base-8M-MIT"] = _MIT_POTION.encode("utf-8")
    out["LICENSES/README"] = (
        f"Weights and vocabulary of {SOURCE_MODEL} from {SOURCE_DIST} {dist.version}.\n"
        "Code: Apache-2.0 (sparrow-decider-LICENSE), with its NOTICE (sparrow-decider-NOTICE).\n"
        "The sparrow-nano weights are fine-tuned from potion-base-8M (Model2Vec, MinishLab), whose\n"
        "MIT licence applies to them (potion-base-8M-MIT): https://github.com/MinishLab/model2vec\n"
    ).encode()
    return out


def build_sparrow_package(out_dir: Path) -> Path:
    """Write the ``sparrow-nano`` package into ``out_dir/sparrow-nano`` and return that path."""
    src = _source_file()
    source_bytes = src.read_bytes()
    cfg, vocab, weights = _read_source(src)
    version = metadata.version(SOURCE_DIST)
    log(f"sparrow: converting {src.name} from {SOURCE_DIST} {version}")

    model = build_graph(cfg, weights)
    model_bytes = model.SerializeToString()
    tokenizer = build_tokenizer(vocab)
    config = {
        "format": "sparrow-decision-config/1",
        "source_model": cfg["name"],
        "kinds": dict(KINDS),
        "temperatures": {k: float(v) for k, v in cfg["temperature_by_kind"].items()},
        "noul_defaults": _noul_defaults(),
        "option_text": "{name} {description}",
        "max_segment_tokens": int(cfg.get("max_len", MAX_SEGMENT_TOKENS)),
        "empty_segment_id": 0,
    }
    text = SparrowText(tokenizer, config)

    from sparrow_decider import Decider

    decider = Decider.load(str(src))
    cases = []
    for state, raw in _GOLDEN:
        q = _question(state, raw)
        row = text.row(text.ids(content(state), text.max_tokens), q)
        cases.append((row.feeds, _reference(decider, state, raw)))
    worst = _verify(model_bytes, cases)
    split = {QUESTION_GRAPH: build_question_graph(cfg, weights).SerializeToString()}
    split.update((_answer_file(n), build_answer_graph(cfg, weights, n).SerializeToString())
                 for n in range(1, MAX_QUESTIONS_PER_RUN + 1))
    checked = _verify_split_graphs(model_bytes, split, text, len(vocab))
    log(f"sparrow: the split graphs answer {checked} questions as model.onnx does, bit for bit")
    config["split_graphs"] = {"layout": SPLIT_LAYOUT, "question": QUESTION_GRAPH,
                              "answers": {str(n): _answer_file(n) for n in range(1, MAX_QUESTIONS_PER_RUN + 1)}}

    source_stamp = hashlib.sha256(source_bytes).hexdigest()
    card = {
        **card_start(PACKAGE_NAME, "sparrow", "sparrow", {
            "description": CARD_DESCRIPTION,
            "version": "1.1.0",
            "release_date": _release_date(src),
            "revision": f"{SOURCE_DIST}-{version}/{cfg['name']}@{source_stamp[:12]}",
            "source": {
                "name": f"{SOURCE_DIST}=={version}:{cfg['name']}",
                "architecture": "static WordPiece embeddings (int8 table, potion-base-8M) + 768-128-128-1 GELU MLP",
                "license": "Apache-2.0 (code); MIT (potion-base-8M weights)",
            },
        }),
        "head": {"output": "probs", "activation": "softmax", "temperature": "per question kind"},
        "limits": {"max_input_tokens": MAX_SEGMENT_TOKENS},
        "graph": {"inputs": list(INPUTS), "outputs": list(OUTPUTS), "opset": OPSET},
        "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
        "verification": {
            "reference": f"{SOURCE_DIST} {version} Decider.probs (numpy)",
            "max_abs_diff": worst,
            "tolerance": max(TOLERANCE.values()),
            "cases": len(cases),
            "split_graphs": {"questions": checked, "equal_to": "model.onnx alone, bit for bit"},
        },
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": source_stamp},
        "question_types": ["choice", "noul", "score"],
        "usage": "per_question",
    }
    files: dict[str, Path | bytes] = {
        "model.onnx": model_bytes,
        **split,
        "tokenizer.json": tokenizer.to_str().encode("utf-8"),
        "decision_config.json": (
            json.dumps(config, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
        ).encode("utf-8"),
        **_licenses(),
    }
    out = Path(out_dir) / PACKAGE_NAME
    digest = write_package(out, card, files, {"fp32": cases})
    log(f"sparrow: wrote {out} (digest {digest[:12]}, max |diff| vs reference {worst:.2g})")
    return out


def _noul_defaults() -> dict[str, str]:
    from sparrow_decider import NOUL_DEFAULT

    return {"false": NOUL_DEFAULT["false"], "true": NOUL_DEFAULT["true"]}


def _release_date(src: Path) -> str:
    """The model file's own build date (its zip members' timestamp)."""
    with zipfile.ZipFile(src) as zf:
        y, m, d = zf.getinfo("model.npz").date_time[:3]
    return f"{y:04d}-{m:02d}-{d:02d}"
