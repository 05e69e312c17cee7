"""The sparrow graph written with onnx.helper at opset 18 (the int8 embedding table kept, the MLP
dequantised once), and model.onnx in two halves: the question graph and the answer graph for n questions
about one state."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from converters import CONVERTER_VERSION
from converters.sparrow.source import (
    dequant,
)
from edge_runtime.families.sparrow.family import (
    INPUTS,
    KINDS,
    OUTPUTS,
    QUESTION_TENSORS,
    ROW_TENSORS,
)

OPSET = 18

_I64, _F32 = TensorProto.INT64, TensorProto.FLOAT


MAX_SEGMENT_TOKENS = 512


#: model.onnx split in two (build_question_graph, build_answer_graph): the answer graphs take up to
#: this many questions about one state per run, more run in chunks. A Router request asks a few
#: questions; each answer graph is a session holding the 2 MB table.
MAX_QUESTIONS_PER_RUN = 4


QUESTION_GRAPH = "model.question.onnx"


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
            _const("kind_emb", dequant(weights, "kind.weight")),
            _const("w0", dequant(weights, "mlp.0.weight").T.copy()),
            _const("b0", weights["mlp.0.bias"]),
            _const("w1", dequant(weights, "mlp.2.weight").T.copy()),
            _const("b1", weights["mlp.2.bias"]),
            _const("w2", dequant(weights, "mlp.4.weight").T.copy()),
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
    (verify_split_graphs). Fewer, wider nodes than one set per question: 29 for 3 questions
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


def answer_file(questions: int) -> str:
    return f"model.answer{questions}.onnx"
