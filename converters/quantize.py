"""Int8 variants of a graph, and how closely they agree with fp32.

Two constructions:

- ``int8`` (exact, :func:`quantize_int8_exact`): every MatMul/Gemm whose weight is a constant
  becomes per-token activation quantization plus an integer GEMM against symmetric per-channel
  int8 weights. Each token's scale is max(|x|) over its own hidden vector / 127, so no row depends
  on the other rows of a batch or on padding, and integer accumulation is exact whatever the
  kernel's blocking: the graph is batch-invariant by construction (the server's load-time probe
  still checks it on every CPU). Measured recipe: docs/reference/exact-int8-feasibility.md.
- ``int8-dynamic`` (approximate, :func:`quantize_int8_dynamic`): ONNX Runtime's quantize_dynamic,
  whose DynamicQuantizeLinear takes one activation scale over the whole batch tensor, so another
  request's rows change a row's answer. Kept only for users who ask for it by name.

quant_pre_process is skipped: it fails on these opset-18 exports and leaves temporary files in the
working directory. Agreement is measured one row at a time (the dynamic variant's output depends
on what else is in the batch; the exact one's does not, so alone is the fair comparison for both).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from converters import small_forward
from converters.attention_shapes import fold, fold_verified
from converters.graph_files import MS_DOMAIN, drop_dead_nodes, save_graph, use_contrib_ops
from converters.matmul_pieces import Plan, plan_pieces
from converters.progress import log
from converters.readout import cosine, pool, sigmoid, softmax
from converters.verify import Row
from edge_runtime.engine.cpu import cpu_class

#: Variant name -> how its graph is built and what numerics it promises.
QUANTIZATIONS: dict[str, str] = {"int8": "per-token", "int8-dynamic": "dynamic"}
#: The opset whose QuantizeLinear takes blocks (a scale per token on any rank).
BLOCKED_QUANTIZE_OPSET = 21
#: Guards all-zero activation rows (padding positions): their q is 0, their output the bias.
ACTIVATION_EPS = 1e-8
#: The largest magnitude a 16-bit lane holds. ONNX Runtime's U8S8 kernels for AVX2 and AVX-512 without
#: VNNI multiply with vpmaddubsw: u8 x s8 products summed in adjacent pairs into int16 with saturation.
#: An integer product is exact on every kernel (those, VNNI, AMX, ARM, CUDA) only when every such pair
#: sum fits, whatever the data: 2 x (largest activation code) x (largest |weight code|) <= INT16_MAX.
INT16_MAX = 32767


@dataclass(frozen=True)
class Int8Recipe:
    """How the exact int8 graph quantizes: code ranges and which matmuls stay fp32.

    Activations are uint8 (the fast U8S8 kernels) with codes ``zero point +- activation_max``; weights
    are symmetric int8 with codes ``+- weight_max``, one scale per output channel. ``fp32``: regular
    expressions searched in MatMul/Gemm node names; a match keeps that matmul in fp32.
    """

    weight_max: int = 64
    activation_max: int = 127
    fp32: tuple[str, ...] = ()
    #: SmoothQuant's migration strength: each input channel j of a matmul is divided by
    #: s_j = max|x_j|^alpha / max|W_j|^(1 - alpha) (from calibration rows) and W's row j multiplied by
    #: it, so outlier channels stop eating every token's resolution. 0: off.
    smooth_alpha: float = 0.0
    #: Regular expressions searched in MatMul/Gemm node names; a match gets a two-term weight: codes
    #: W = R*h + l with h, l both within +-weight_max and R = 2*weight_max + 1 (about 14 bits at +-64),
    #: run as two integer GEMMs on the same activation codes. Each GEMM keeps the pair-sum bound, so the
    #: product stays exact on every kernel, at twice the integer work of that matmul.
    split: tuple[str, ...] = ()
    #: Input channels per quantized activation kept out of its int8 codes and multiplied in fp32 (the
    #: largest after smoothing, by calibration), so they no longer set every token's scale. 0: none.
    outliers: int = 0
    #: Fold an encoder export's attention shape arithmetic into constants where the pattern matches
    #: (converters.attention_shapes): about 14 kernels fewer a layer, refused unless bit-identical to the
    #: unfolded graph on the calibration rows, so the numbers are the same either way.
    fold_attention: bool = False
    #: Forwards of at most this many tokens (rows x length) run a second body of the same graph, built for
    #: small forwards: fewer and wider kernels, the same bits (converters.small_forward). 0: one body.
    small_forward_tokens: int = 0

    @property
    def activation_zero_point(self) -> int:
        """uint8 zero point centring the codes: 128 for +-127; activation_max + 1 for fewer bits (codes from 1)."""
        return 128 if self.activation_max == 127 else self.activation_max + 1

    @property
    def split_radix(self) -> int:
        """R of a two-term weight (W = R*h + l): every integer within +-(R + 1)*weight_max has one such h, l."""
        return 2 * self.weight_max + 1

    @property
    def pair_sum_bound(self) -> int:
        """The largest |a0*b0 + a1*b1| any input can produce (a: uint8 activation codes, b: weight codes)."""
        return 2 * (self.activation_zero_point + self.activation_max) * self.weight_max

    def check(self) -> None:
        """ValueError unless the codes fit their types and no 16-bit pair sum can saturate."""
        if not 0.0 <= self.smooth_alpha <= 1.0:
            raise ValueError(f"int8 recipe: smooth_alpha must be in [0, 1], got {self.smooth_alpha}")
        if not (1 <= self.weight_max <= 127 and 1 <= self.activation_max <= 127):
            raise ValueError(f"int8 recipe: weight_max and activation_max must be in 1..127, got {self}")
        if self.activation_zero_point + self.activation_max > 255:
            raise ValueError(f"int8 recipe: activation codes exceed uint8 ({self})")
        if self.small_forward_tokens < 0:
            raise ValueError(f"int8 recipe: small_forward_tokens must be >= 0, got {self.small_forward_tokens}")
        if self.pair_sum_bound > INT16_MAX:
            raise ValueError(f"int8 recipe: pair sums up to {self.pair_sum_bound} saturate 16-bit kernels "
                             f"(AVX2 without VNNI); need <= {INT16_MAX}")
        for pattern in (*self.fp32, *self.split):
            re.compile(pattern)

    @classmethod
    def from_card(cls, described: dict[str, Any]) -> Int8Recipe:
        """The recipe a card's ``recipe`` block (:meth:`describe`'s output) records."""
        return cls(weight_max=int(described["weight_max"]), activation_max=int(described["activation_max"]),
                   fp32=tuple(described.get("fp32_matmuls", ())),
                   smooth_alpha=float(described.get("smooth_alpha", 0.0)),
                   split=tuple(described.get("split_matmuls", ())),
                   outliers=int(described.get("fp32_outlier_channels", 0)),
                   fold_attention=described.get("attention_shapes") == "constant",
                   small_forward_tokens=int(described.get("small_forward_tokens", 0)))

    def describe(self) -> dict[str, Any]:
        """The card's record of the recipe (what a reader needs to judge exactness and cost)."""
        return {"activations": f"uint8 per token, codes {self.activation_zero_point} +- {self.activation_max}",
                "weights": f"int8 per output channel, symmetric, codes +- {self.weight_max}",
                "activation_max": self.activation_max, "activation_zero_point": self.activation_zero_point,
                "weight_max": self.weight_max, "pair_sum_bound": self.pair_sum_bound,
                "fp32_matmuls": list(self.fp32), "smooth_alpha": self.smooth_alpha,
                **({"split_matmuls": list(self.split), "split_radix": self.split_radix} if self.split else {}),
                **({"fp32_outlier_channels": self.outliers} if self.outliers else {}),
                **({"attention_shapes": "constant"} if self.fold_attention else {}),
                **({"small_forward_tokens": self.small_forward_tokens} if self.small_forward_tokens else {})}


#: Weights +-64 against 8-bit activations: 2 x 255 x 64 = 32,640 fits int16, so AVX2's vpmaddubsw
#: cannot saturate (with +-127 it reached 64,770). Every converter's exact int8 has at least this.
DEFAULT_RECIPE = Int8Recipe(weight_max=64)
#: The encoder converters' recipe (they have calibration rows): DEFAULT_RECIPE plus smoothing at alpha
#: 0.6, which wins back what the weights' lost bit cost and more, and each activation's 4 largest
#: channels in fp32, which halves the remaining distance to fp32 for about a tenth of int8's speed at
#: batch 32. Chosen by measurement on the STS Benchmark dev split (bench/int8_quality.py;
#: docs/benchmarks.md). The attention's shape arithmetic is folded into constants, and forwards of up to 64
#: tokens run a body built for them (both bit-identical; issue 40).
CALIBRATED_RECIPE = Int8Recipe(weight_max=64, smooth_alpha=0.6, outliers=4, fold_attention=True,
                               small_forward_tokens=64)


def variant_file(variant: str) -> str:
    """The package file of a quantized variant: ``model.<variant>.onnx``."""
    return f"model.{variant}.onnx"


def _const(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(array), name)


def split_weight(w: np.ndarray, max_code: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two-term symmetric per-channel codes of a [K, N] weight: (h, l, scale) with w ~ scale * (R*h + l),
    h and l int8 within +-``max_code``, R = 2*max_code + 1 (so |l| <= max_code covers every remainder)."""
    radix = 2 * max_code + 1
    codes, scale = _weight_codes(w, (radix + 1) * max_code)
    high = np.rint(codes / radix)
    low = codes - radix * high
    return high.astype(np.int8), low.astype(np.int8), scale


def _weight_codes(w: np.ndarray, max_code: int) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(w, dtype=np.float32)
    amax = np.abs(w).max(axis=0)
    scale = np.where(amax > 0, amax / np.float32(max_code), 1.0).astype(np.float32)
    return np.clip(np.rint(w / scale), -max_code, max_code), scale


def quantize_weight(w: np.ndarray, max_code: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 of a [K, N] weight: (int8 [K, N], fp32 scale [N]), codes in
    +-``max_code``.

    A channel of zeros gets scale 1 (its q is 0 either way) so nothing divides by zero.
    """
    q, scale = _weight_codes(w, max_code)
    return q.astype(np.int8), scale


def _has_bias(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a Gemm with a C input."""
    return node.op_type == "Gemm" and len(node.input) > 2 and bool(node.input[2])


class _Rewriter:
    """Builds the exact int8 graph: one quantization per distinct activation, one per weight.

    ``small`` builds the body for small forwards instead (converters.small_forward), the same bits in
    fewer kernels, each of which costs more on a large forward: max|x| as ReduceMax(Abs(x)); the token
    scale as the integer GEMM's activation scale (ONNX Runtime multiplies it in after the GEMM, one
    thread); matmuls reading the same activation as one wider GEMM whose output is split; no pieces.
    """

    def __init__(self, model: onnx.ModelProto, recipe: Int8Recipe, small: bool = False,
                 token_dims: Mapping[str, tuple[str | int, ...]] | None = None) -> None:
        self.recipe = recipe
        self.small = small
        self.keep = [re.compile(p) for p in recipe.fp32]
        self.split = [re.compile(p) for p in recipe.split]
        self.graph = model.graph
        self.inits = {t.name: t for t in self.graph.initializer}
        self.new_inits: list[TensorProto] = []
        self.quantized_inputs: dict[str, tuple[str, str]] = {}  # activation -> (codes, token scale)
        #: (weight, transposed, alpha, smoothing activation, split, columns) -> its terms' (codes, channel scale)
        self.quantized_weights: dict[tuple[str, bool, float, str, bool, tuple[int, int] | None],
                                     list[tuple[str, str]]] = {}
        #: matmul outputs read only in pieces of their last axis, computed a piece at a time
        self.piece_plan = Plan()
        #: activation -> per-channel smoothing factor s (x / s meets W * s); empty when not smoothing
        self.smooth: dict[str, np.ndarray] = {}
        #: activation -> its channels multiplied in fp32 (recipe.outliers), and their gathered tensor
        self.outliers: dict[str, np.ndarray] = {}
        self.gathered: dict[str, str] = {}
        #: activation with outlier channels -> its rows view [tokens, K] (quantized as rows)
        self.rows: dict[str, str] = {}
        #: constant int64 vectors -> their initializer (shape targets, shared)
        self.constants: dict[tuple[int, ...], str] = {}
        #: activation -> the symbolic leading dims of its tokens, when known (:func:`zero_point_groups`):
        #: activations with the same dims share one per-token zero-point tensor (one Shape and one Expand
        #: for the whole graph)
        self.token_dims: dict[str, tuple[str | int, ...]] = dict(token_dims or {})
        self.shared_zero_points: dict[tuple[str | int, ...], str] = {}
        #: (token dims, columns) -> the shape of every matmul output over those tokens that wide
        self.shared_shapes: dict[tuple[tuple[str | int, ...], int], str] = {}
        self.count = 0
        self.used_names = {n for node in self.graph.node for n in (*node.input, *node.output, node.name)}
        self.used_names |= set(self.inits)
        shared: dict[str, np.ndarray] = {"er_q_eps": np.array(ACTIVATION_EPS, np.float32),
                  "er_q_inv_amax": np.array(1.0 / recipe.activation_max, np.float32),
                  "er_q_zp_u8": np.array(recipe.activation_zero_point, np.uint8),
                  "er_q_one": np.array(1.0, np.float32),
                  "er_q_axes": np.array([-1], np.int64)}
        for name, value in shared.items():
            self.new_inits.append(_const(name, value))

    def constant(self, value: np.ndarray) -> str:
        """An int64 initializer holding ``value``, one per distinct value."""
        key = tuple(int(v) for v in value.reshape(-1))
        if key not in self.constants:
            self.constants[key] = self._name("er_q_shape_" + "_".join(str(v).replace("-", "m") for v in key))
            self.new_inits.append(_const(self.constants[key], value.astype(np.int64)))
        return self.constants[key]

    def _name(self, base: str) -> str:
        name = base
        i = 0
        while name in self.used_names:
            i += 1
            name = f"{base}_{i}"
        self.used_names.add(name)
        return name

    def quantize_tokens(self, x: str, k: int, nodes: list[onnx.NodeProto]) -> tuple[str, str]:
        """``x`` [..., K] as uint8 codes of its own shape and the per-token scale [..., 1]. Built once per x.

        One blocked QuantizeLinear (opset 21: axis -1, one block of K, so a scale per token) does the
        divide, round (half to even), shift and saturating cast in place, on x's own shape: no
        reshapes to rows and back, which at batch 1 cost more than the arithmetic. An x with outlier
        channels is viewed as rows [tokens, K] first, once: its products end in a Gemm, which takes rows,
        so its codes, scales and products stay rows until each sum takes its output's shape back.
        Activations over the same tokens share one zero-point tensor (:func:`zero_point_groups`).
        """
        if x in self.quantized_inputs:
            return self.quantized_inputs[x]
        p = self._name(f"er_q/{x}")
        src, high, low, neg, floor, scale, shape, zp, q = (
            f"{p}/{s}" for s in ("smoothed", "max", "min", "neg_min", "floor", "scale", "shape", "zp", "q"))
        base = x
        if x in self.outliers:
            base = self.rows[x] = f"{p}/rows"
            nodes.append(helper.make_node("Reshape", [x, self.constant(np.array([-1, k], np.int64))], [base],
                                          name=f"{p}/Rows"))
        if x in self.smooth or x in self.outliers:
            inv = (1.0 / self.smooth[x]) if x in self.smooth else np.ones(k, np.float32)
            inv[self.outliers.get(x, [])] = 0.0  # those channels go through fp32 instead
            name = self._name(f"{p}/inv_smooth")
            self.new_inits.append(_const(name, inv.astype(np.float32)))
            nodes.append(helper.make_node("Mul", [base, name], [src], name=f"{p}/Smooth"))
        else:
            src = base
        if self.small:
            # two kernels fewer; |x| written and read back costs more than that past small forwards
            nodes += [helper.make_node("Abs", [src], [f"{p}/abs"], name=f"{p}/Abs"),
                      helper.make_node("ReduceMax", [f"{p}/abs", "er_q_axes"], [high], name=f"{p}/ReduceMax",
                                       keepdims=1),
                      helper.make_node("Max", [high, "er_q_eps"], [floor], name=f"{p}/Max")]
        else:
            nodes += [
                # max|x| as max(max x, -min x): x read twice, but no |x| written and read back (bit-identical;
                # 1.06-1.09x at batch 8 on a 307M ModernBERT, one tiny kernel more per activation)
                helper.make_node("ReduceMax", [src, "er_q_axes"], [high], name=f"{p}/ReduceMax", keepdims=1),
                helper.make_node("ReduceMin", [src, "er_q_axes"], [low], name=f"{p}/ReduceMin", keepdims=1),
                helper.make_node("Neg", [low], [neg], name=f"{p}/Neg"),
                helper.make_node("Max", [high, neg, "er_q_eps"], [floor], name=f"{p}/Max"),
            ]
        nodes.append(helper.make_node("Mul", [floor, "er_q_inv_amax"], [scale], name=f"{p}/Scale"))
        dims = self.token_dims.get(x)
        if dims is not None and x in self.rows:
            dims = ("rows", *dims)  # the scale is [tokens, 1]
        if dims is not None and dims in self.shared_zero_points:
            zp = self.shared_zero_points[dims]  # same tokens as an earlier activation: same scale shape
        else:
            # a zero point per token (a blocked QuantizeLinear wants it shaped like the scale)
            nodes += [helper.make_node("Shape", [scale], [shape], name=f"{p}/ScaleShape"),
                      helper.make_node("Expand", ["er_q_zp_u8", shape], [zp], name=f"{p}/ZeroPoints")]
            if dims is not None:
                self.shared_zero_points[dims] = zp
        nodes.append(helper.make_node("QuantizeLinear", [src, scale, zp], [q], name=f"{p}/QuantizeLinear",
                                      axis=-1, block_size=k))
        self.quantized_inputs[x] = (q, scale)
        return q, scale

    def weight_matrix(self, name: str, transpose: bool, alpha: float,
                      columns: tuple[int, int] | None = None) -> np.ndarray:
        """The fp32 weight as [K, N], alpha applied; only ``columns`` [start, stop) when given."""
        w = numpy_helper.to_array(self.inits[name]).astype(np.float32)
        w = (w.T if transpose else w) * np.float32(alpha)
        return w if columns is None else np.ascontiguousarray(w[:, columns[0]:columns[1]])

    def quantize_constant_weight(self, name: str, transpose: bool, alpha: float, x: str, split: bool,
                                 columns: tuple[int, int] | None = None) -> list[tuple[str, str]]:
        """The int8 weight [K, N] and its per-channel scale [N] as new initializers, one pair per term
        (two when ``split``: the high term's scale carries R), built once per weight (and activation
        ``x``, whose smoothing factors multiply the weight's rows, and ``columns``)."""
        key = (name, transpose, alpha, x if x in self.smooth or x in self.outliers else "", split, columns)
        if key not in self.quantized_weights:
            w = self._as_read_by(x, self.weight_matrix(name, transpose, alpha, columns))
            if split:
                high, low, scale = split_weight(w, self.recipe.weight_max)
                radix = np.float32(self.recipe.split_radix)
                terms = [("high", high, scale * radix), ("low", low, scale)]
            else:
                q, scale = quantize_weight(w, self.recipe.weight_max)
                terms = [("", q, scale)]
            names = []
            for suffix, q, sc in terms:
                qn = self._name(f"{name}_int8{'_' + suffix if suffix else ''}")
                sn = self._name(f"{qn}_scale")
                self.new_inits += [_const(qn, q), _const(sn, sc.astype(np.float32))]
                names.append((qn, sn))
            self.quantized_weights[key] = names
        return self.quantized_weights[key]

    def _as_read_by(self, x: str, w: np.ndarray) -> np.ndarray:
        """The weight [K, N] as x's codes meet it: rows times x's smoothing, outlier channels' rows zero."""
        if x in self.smooth:
            w = w * self.smooth[x][:, None].astype(np.float32)
        if x in self.outliers:
            w[self.outliers[x]] = 0.0  # their codes are 0; the rows would only widen the scales
        return w

    def quantized_activations(self) -> list[str]:
        """The activations the rewrite quantizes: each constant-weight matmul's input, once, sorted."""
        return sorted({n.input[0] for n in self.graph.node if self.weight_of(n) is not None})

    def weight_of(self, node: onnx.NodeProto) -> tuple[str, bool, float] | None:
        """(weight initializer, transposed, alpha) when ``node`` multiplies by a constant 2-D weight."""
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in self.inits:
            return None
        if len(self.inits[node.input[1]].dims) != 2 or node.input[0] in self.inits:
            return None
        if self.inits[node.input[1]].data_type != TensorProto.FLOAT:
            return None
        if any(p.search(node.name) for p in self.keep):
            return None  # the recipe keeps this one in fp32
        if node.op_type == "MatMul":
            return node.input[1], False, 1.0
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transA", 0):
            return None  # never exported by Optimum; stays fp32
        return node.input[1], bool(attrs.get("transB", 0)), float(attrs.get("alpha", 1.0))

    def plan_smoothing(self, ranges: Mapping[str, np.ndarray]) -> None:
        """Smoothing factors of every quantized activation with calibration ranges (max|x| per channel):
        s_j = max|x_j|^alpha / max|W_j|^(1 - alpha), W_j over every weight that reads x (Q, K and V share)."""
        alpha = self.recipe.smooth_alpha
        wmax: dict[str, np.ndarray] = {}
        for node in self.graph.node:
            found = self.weight_of(node)
            if found is None or node.input[0] not in ranges:
                continue
            rows = np.abs(self.weight_matrix(*found)).max(axis=1)
            x = node.input[0]
            wmax[x] = rows if x not in wmax else np.maximum(wmax[x], rows)
        for x, w in wmax.items():
            a = ranges[x].astype(np.float64)
            s = np.where((a > 0) & (w > 0), a ** alpha / np.maximum(w, 1e-12) ** (1 - alpha), 1.0)
            if alpha > 0:
                self.smooth[x] = s.astype(np.float32)
            if self.recipe.outliers:
                left = a / s if alpha > 0 else a
                self.outliers[x] = np.sort(np.argsort(-left, kind="stable")[:self.recipe.outliers])

    def outlier_product(self, x: str, matrix: np.ndarray, weight: str, p: str, partial: str,
                        nodes: list[onnx.NodeProto]) -> str:
        """partial + x's outlier channels (gathered once per x) times their weight rows ``matrix`` (the
        fp32 weight's [K, N], stored as ``weight``_outlier_rows), in fp32, as rows: returns the sum's name.

        One Gemm with ``partial`` as its C instead of MatMul then Add: the same bits on the AVX-512 SGEMM
        measured (the few channels' dot product is summed in one K block, then added to C once, as Add
        did), one pass over the output fewer (1.046x at batch 8 on a 307M ModernBERT, 1.01x at batch 1); each row
        is still its own, so batch invariance holds on any kernel (the load-time probe checks it). Gemm
        takes rows: x was quantized as rows (:meth:`quantize_tokens`), so ``partial`` is [tokens, N]; the sum
        takes x's leading dimensions back, their shape built once for all outputs over the same tokens and
        as wide (at batch 1 a Shape and a Reshape per matmul were ~7 % of a 307M forward: :meth:`tokens_back`)."""
        channels = self.outliers[x]
        if x not in self.gathered:
            idx, g = self._name(f"er_q/{x}/outlier_channels"), self._name(f"er_q/{x}/outliers")
            self.new_inits.append(_const(idx, channels.astype(np.int64)))
            nodes.append(helper.make_node("Gather", [self.rows[x], idx], [g], name=f"{g}/Gather", axis=-1))
            self.gathered[x] = g
        weights = self._name(f"{weight}_outlier_rows")
        self.new_inits.append(_const(weights, np.ascontiguousarray(matrix[channels])))
        nodes.append(helper.make_node("Gemm", [self.gathered[x], weights, partial], [f"{p}/sum_rows"],
                                      name=f"{p}/OutlierGemm"))
        return f"{p}/sum_rows"

    def tokens_back(self, x: str, n: int, p: str, rows: str, y: str, nodes: list[onnx.NodeProto]) -> None:
        """y = ``rows`` [tokens, n] with x's leading dimensions back."""
        dims = self.token_dims.get(x)
        shape = self.shared_shapes.get((dims, n)) if dims is not None else None
        if shape is None:
            # x's leading dimensions and N: built once for all outputs over the same tokens and as wide
            shape = f"{p}/shape"
            nodes += [helper.make_node("Shape", [x], [f"{p}/tokens"], name=f"{p}/Tokens", end=-1),
                      helper.make_node("Concat", [f"{p}/tokens", self.constant(np.array([n]))], [shape],
                                       name=f"{p}/Shape", axis=0)]
            if dims is not None:
                self.shared_shapes[(dims, n)] = shape
        nodes.append(helper.make_node("Reshape", [rows, shape], [y], name=f"{p}/Outliers"))

    def plan_pieces(self, model: onnx.ModelProto) -> None:
        """Find the quantized MatMuls whose outputs are only read in pieces (converters.matmul_pieces): each
        piece becomes its own integer matmul on the same activation codes (bit-identical)."""
        matmuls = {n.output[0]: int(self.inits[found[0]].dims[1]) for n in self.graph.node
                   if n.op_type == "MatMul" and (found := self.weight_of(n)) is not None}
        self.piece_plan = plan_pieces(model, matmuls)
        self.new_inits += self.piece_plan.constants

    def rewrite(self) -> int:
        """Replace every constant-weight MatMul/Gemm in place (a pieced one by its pieces and their tails, in
        place of the readers they replace); returns how many were replaced."""
        out: list[onnx.NodeProto] = []
        siblings = self.siblings() if self.small else {}
        for node in self.graph.node:
            if node.output and node.output[0] in self.piece_plan.replaced:
                continue  # a piece makes its output, where the matmul was
            found = self.weight_of(node)
            if found is None:
                out.append(node)
                continue
            self.count += 1
            group = siblings.get(node.name)
            if group is not None:
                if group[0][0] is node:  # the first of them computes them all; the rest come earlier than before
                    self.fused_matmuls(group, out)
                continue
            pieces = self.piece_plan.pieces.get(node.output[0])
            if pieces is None:
                self.quantized_matmul(node, found, node.output[0], None, out)
            for piece in pieces or ():
                self.quantized_matmul(node, found, piece.output, (piece.start, piece.stop), out)
                out += piece.tail
        del self.graph.node[:]
        self.graph.node.extend(out)
        return self.count

    def quantized_matmul(self, node: onnx.NodeProto, found: tuple[str, bool, float], y: str,
                         columns: tuple[int, int] | None, out: list[onnx.NodeProto]) -> None:
        """Append to ``out`` the int8 nodes computing ``node``'s output (only ``columns`` of it, when given)
        into ``y``."""
        x = node.input[0]
        terms = self.quantize_constant_weight(*found, x, self.is_split(node), columns)
        k = int(self.inits[found[0]].dims[1 if found[1] else 0])  # Gemm transB: stored [N, K]
        q, scale = self.quantize_tokens(x, k, out)
        p = self._name(f"er_q/{node.name or node.output[0]}" + (f"/columns_{columns[0]}" if columns else ""))
        scaled = f"{p}/scaled" if _has_bias(node) else y
        int8 = f"{p}/int8" if x in self.outliers else scaled
        if len(terms) == 1:
            self.integer_matmul(q, scale, terms[0], p, int8, out)
        else:
            # a split weight's two terms: two GEMMs on the same codes, added in float (each element alone),
            # then the token scale
            parts = [f"{p}/acc_{i}" for i in range(len(terms))]
            out += [helper.make_node("MatMulIntegerToFloat", [q, wq, "er_q_one", ws, "er_q_zp_u8"], [part],
                                     name=f"{p}/MatMulIntegerToFloat_{i}", domain=MS_DOMAIN)
                    for i, ((wq, ws), part) in enumerate(zip(terms, parts))]
            out += [helper.make_node("Add", parts, [f"{p}/acc"], name=f"{p}/Terms"),
                    helper.make_node("Mul", [f"{p}/acc", scale], [int8], name=f"{p}/TokenScale")]
        if x in self.outliers:
            matrix = self.weight_matrix(*found, columns)
            rows = self.outlier_product(x, matrix, found[0], p, int8, out)
            self.tokens_back(x, matrix.shape[1], p, rows, scaled, out)
        self.bias(node, p, scaled, y, out)

    def is_split(self, node: onnx.NodeProto) -> bool:
        """Whether the recipe gives ``node``'s weight two integer terms."""
        return any(p.search(node.name) for p in self.split)

    def siblings(self) -> dict[str, list[tuple[onnx.NodeProto, tuple[str, bool, float]]]]:
        """Matmuls to fuse in the body for small forwards: by node name, each group of two or more (node,
        weight) whose weights (none split, none pieced) read the same activation (a layer's Q, K and V)."""
        groups: dict[str, list[tuple[onnx.NodeProto, tuple[str, bool, float]]]] = {}
        for node in self.graph.node:
            found = self.weight_of(node)
            if found is not None and node.output[0] not in self.piece_plan.pieces and not self.is_split(node):
                groups.setdefault(node.input[0], []).append((node, found))
        return {node.name: group for group in groups.values() if len(group) > 1 for node, _ in group}

    def fused_matmuls(self, group: Sequence[tuple[onnx.NodeProto, tuple[str, bool, float]]],
                      out: list[onnx.NodeProto]) -> None:
        """``group``'s matmuls (node, weight; same activation) as one integer GEMM over their weights side by
        side (and one outlier Gemm), split back into each output. Per-channel weight scales and per-element
        products do not depend on the columns beside them, so each output has the bits it had alone."""
        nodes = [node for node, _ in group]
        founds = [found for _, found in group]
        x = nodes[0].input[0]
        matrices = [self.weight_matrix(*found) for found in founds]
        widths = [m.shape[1] for m in matrices]
        matrix = np.concatenate(matrices, axis=1)
        codes, channel_scale = quantize_weight(self._as_read_by(x, matrix), self.recipe.weight_max)
        fused = self._name(f"{founds[0][0]}_fused")
        weight = (self._name(f"{fused}_int8"), self._name(f"{fused}_int8_scale"))
        self.new_inits += [_const(weight[0], codes), _const(weight[1], channel_scale.astype(np.float32))]
        q, scale = self.quantize_tokens(x, matrix.shape[0], out)
        p = self._name(f"er_q/{nodes[0].name or nodes[0].output[0]}/fused")
        self.integer_matmul(q, scale, weight, p, f"{p}/int8", out)
        whole = self.outlier_product(x, matrix, fused, p, f"{p}/int8", out) if x in self.outliers else f"{p}/int8"
        prefixes = [self._name(f"er_q/{node.name or node.output[0]}") for node in nodes]
        scaled = [f"{pn}/scaled" if _has_bias(node) else node.output[0] for node, pn in zip(nodes, prefixes)]
        parts = [f"{pn}/part" for pn in prefixes] if x in self.outliers else scaled
        out.append(helper.make_node("Split", [whole, self.constant(np.array(widths))], parts, name=f"{p}/Split",
                                    axis=-1))
        for node, pn, part, each, n in zip(nodes, prefixes, parts, scaled, widths):
            if x in self.outliers:
                self.tokens_back(x, n, pn, part, each, out)
            self.bias(node, pn, each, node.output[0], out)

    def integer_matmul(self, q: str, scale: str, weight: tuple[str, str], p: str, y: str,
                       out: list[onnx.NodeProto]) -> None:
        """y = the integer GEMM (int32 accumulation) of the codes ``q`` and ``weight`` (codes, channel scale;
        the channel scale in its output stage) times the per-token ``scale``.

        MatMulIntegerToFloat's fast output stage takes one activation scale; a per-token one it multiplies
        in after the GEMM on one thread. So the main body multiplies in a Mul (on every thread), and the body
        for small forwards, where a kernel's launch costs more than that pass, passes it as a_scale: the same
        two roundings (product times channel scale, then times token scale), the same bits."""
        wq, ws = weight
        if self.small:
            out.append(helper.make_node("MatMulIntegerToFloat", [q, wq, scale, ws, "er_q_zp_u8"], [y],
                                        name=f"{p}/MatMulIntegerToFloat", domain=MS_DOMAIN))
            return
        out += [helper.make_node("MatMulIntegerToFloat", [q, wq, "er_q_one", ws, "er_q_zp_u8"], [f"{p}/acc"],
                                 name=f"{p}/MatMulIntegerToFloat", domain=MS_DOMAIN),
                helper.make_node("Mul", [f"{p}/acc", scale], [y], name=f"{p}/TokenScale")]

    def bias(self, node: onnx.NodeProto, p: str, scaled: str, y: str, out: list[onnx.NodeProto]) -> None:
        """y = scaled + beta * C, for a Gemm ``node`` with a bias (scaled is y otherwise)."""
        if _has_bias(node):
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            beta = float(attrs.get("beta", 1.0))
            c = numpy_helper.to_array(self.inits[node.input[2]]) if node.input[2] in self.inits else None
            if c is not None:
                cn = self._name(f"{node.input[2]}_beta")
                self.new_inits.append(_const(cn, (c * np.float32(beta)).astype(np.float32)))
                out.append(helper.make_node("Add", [scaled, cn], [y], name=f"{p}/Bias"))
            else:
                bn = self._name(f"{p}/beta")
                self.new_inits.append(_const(bn, np.array(beta, np.float32)))
                out.append(helper.make_node("Mul", [node.input[2], bn], [f"{p}/c"], name=f"{p}/Beta"))
                out.append(helper.make_node("Add", [scaled, f"{p}/c"], [y], name=f"{p}/Bias"))

    def finish(self) -> None:
        """Add the new initializers, then drop what nothing reads any more: the fp32 weights (they would
        double the file) and the pieces' former slice bounds."""
        self.graph.initializer.extend(self.new_inits)
        drop_dead_nodes(self.graph)


def zero_point_groups(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, tuple[str | int, ...]]:
    """The activations ``names`` by their tokens' symbolic dims (ONNX Runtime's symbolic shape
    inference), so that each group quantizes against one zero-point tensor.

    Only dims named by the graph's inputs count, each at most once per activation (so a batch merged
    with a length is never trusted). Empty groups (a zero point per activation) when inference fails or
    a dim is anything else. A wrong grouping could not pass silently either: QuantizeLinear refuses a
    zero point shaped unlike its scale. Read from the graph as exported, before any rewrite.
    """
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    # the weights' values play no part in shapes: they enter as typed inputs, not copied
    listed = {i.name for i in model.graph.input}  # old IR versions list initializers as inputs too
    big = [t for t in model.graph.initializer if int(np.prod(t.dims)) > 64 and t.name not in listed]
    small = [t for t in model.graph.initializer if int(np.prod(t.dims)) <= 64]
    light = helper.make_model(
        helper.make_graph(model.graph.node, "shapes", [*model.graph.input, *(
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in big)],
            model.graph.output, small), opset_imports=model.opset_import)
    # inside a scratch directory: on a graph it cannot follow, the tool saves it to the working
    # directory (sym_shape_infer_temp.onnx) before it raises
    with tempfile.TemporaryDirectory(prefix="er-shapes-") as tmp, _in_dir(Path(tmp)):
        try:
            inferred = SymbolicShapeInference.infer_shapes(light, auto_merge=True, guess_output_rank=True)
        except Exception:  # the tool raises bare Exception on any graph it cannot follow
            return {}
    symbols = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    infos = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
    groups: dict[str, tuple[str | int, ...]] = {}
    for x in names:
        if x not in infos or not infos[x].type.tensor_type.HasField("shape"):
            continue
        dims = tuple(d.dim_param or d.dim_value for d in infos[x].type.tensor_type.shape.dim)[:-1]
        named = [d for d in dims if isinstance(d, str)]
        if dims and all(d in symbols or (isinstance(d, int) and d > 0) for d in dims) \
                and len(set(named)) == len(named):
            groups[x] = (len(dims), *dims)
    return groups


def activation_ranges(model: onnx.ModelProto, names: Sequence[str], rows: Sequence[Row]) -> dict[str, np.ndarray]:
    """max |x| per channel (last axis) of the activations ``names`` over the calibration ``rows``,
    each run alone (so no padding enters the maxima)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for n in names:
        if n not in have:
            probe.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    out: dict[str, np.ndarray] = {}
    for row in rows:
        values = session.run(list(names), {n: row[n][None, :] for n in inputs})
        for n, v in zip(names, values):
            m = np.abs(v.reshape(-1, v.shape[-1])).max(axis=0)
            out[n] = m if n not in out else np.maximum(out[n], m)
    return out


def quantize_int8_exact(src: Path, dst: Path, recipe: Int8Recipe = DEFAULT_RECIPE,
                        calibration: Sequence[Row] = ()) -> Path:
    """Write the per-token ("exact") int8 copy of the graph ``src`` to ``dst``.

    Every MatMul/Gemm with a constant fp32 weight (but those the recipe keeps in fp32) becomes, on x's
    own shape: per-token scale s = max(max|x| over the token, eps) / A; q = QuantizeLinear(x, s, zp)
    blocked per token, as uint8; MatMulIntegerToFloat(q, Wq, 1, w_scale, zp) with symmetric
    per-channel int8 weights of codes +-W; times s; then the original bias (A, W, zp: the recipe's
    activation_max, weight_max and zero point, chosen so no 16-bit pair sum of any kernel can
    saturate). The recipe may also smooth (x / s_j meets W's row j * s_j), keep each activation's
    largest channels out of the codes and multiply them in fp32 (``outliers``), and give weights two
    integer terms (``split``); ``calibration`` rows give the channel ranges the first two need.
    Activations are quantized once per producer (Q, K and V share theirs), and all over the same
    tokens share one zero-point tensor. A MatMul whose output is only read in pieces of its last axis
    becomes one integer matmul per piece (converters.matmul_pieces; bit-identical). Attention MatMuls,
    LayerNorm, softmax, GELU and embeddings stay fp32; with ``recipe.fold_attention`` an encoder's
    attention shape arithmetic is then folded into constants (converters.attention_shapes;
    FoldingMismatch unless bit-identical to the unfolded graph on ``calibration``). With
    ``recipe.small_forward_tokens`` the graph has a second body, for forwards of at most that many tokens
    (converters.small_forward; BodiesDiffer unless the same bits on ``calibration``). Raises ValueError
    when the graph has no constant-weight MatMul (nothing to quantize).
    """
    recipe.check()
    if (recipe.smooth_alpha > 0 or recipe.outliers) and not calibration:
        raise ValueError("int8 recipe: smoothing and outlier channels need calibration rows")
    if recipe.small_forward_tokens and not calibration:
        raise ValueError("int8 recipe: a body for small forwards is proven on calibration rows; none given")
    exported = onnx.load(str(src))
    # read once for both bodies, from the graph as exported (before any rewrite renames a tensor)
    quantized = _Rewriter(exported, recipe).quantized_activations()
    groups = zero_point_groups(exported, quantized)
    smoothing = recipe.smooth_alpha > 0 or recipe.outliers
    ranges = activation_ranges(exported, quantized, calibration) if smoothing else {}
    model = large = _int8_body(src, exported, recipe, calibration, groups, ranges, small=False)
    if recipe.small_forward_tokens:
        small = _int8_body(src, exported, recipe, calibration, groups, ranges, small=True)
        compared = small_forward.check_same_bits(large, small, calibration)
        log(f"int8 small-forward body (up to {recipe.small_forward_tokens} tokens): the same bits as the large "
            f"one on {compared} forwards")
        model = small_forward.join(large, small, recipe.small_forward_tokens)
    # shapes of the rewritten outputs are unchanged; stale value_info of removed tensors is harmless
    dst = Path(dst)
    save_graph(model, dst)
    return dst


def _int8_body(src: Path, exported: onnx.ModelProto, recipe: Int8Recipe, calibration: Sequence[Row],
               groups: Mapping[str, tuple[str | int, ...]], ranges: Mapping[str, np.ndarray],
               small: bool) -> onnx.ModelProto:
    """One body of ``exported``'s exact int8 graph (the one for small forwards when ``small``), built on a
    copy from the activations' zero-point ``groups`` and calibration ``ranges`` (empty: no smoothing)."""
    model = onnx.ModelProto()
    model.CopyFrom(exported)
    rewriter = _Rewriter(model, recipe, small, groups)
    if ranges:
        rewriter.plan_smoothing(ranges)
    if not small:
        rewriter.plan_pieces(model)
    if rewriter.rewrite() == 0:
        raise ValueError(f"{src}: no MatMul or Gemm with a constant weight to quantize")
    rewriter.finish()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < BLOCKED_QUANTIZE_OPSET:
            # blocked QuantizeLinear needs opset 21; the exported ops (BERT's and causal LMs') mean
            # the same from 18 to 21
            o.version = BLOCKED_QUANTIZE_OPSET
    use_contrib_ops(model)
    if recipe.fold_attention and small:
        model, _ = fold(model)  # proven with the whole body: the same bits as the large one (small_forward)
    elif recipe.fold_attention:
        model, folded = fold_verified(model, calibration)
        log(f"int8 {folded.summary()}")
    return model


@contextlib.contextmanager
def _in_dir(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def quantize_int8_dynamic(src: Path, dst: Path) -> Path:
    """Write ONNX Runtime's dynamic int8 (QInt8, per-channel) copy of ``src`` to ``dst`` (approximate)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer's "consider pre-processing" warning: skipped on purpose
    with tempfile.TemporaryDirectory(prefix="er-quant-") as tmp, _in_dir(Path(tmp)):
        # run inside a scratch directory: onnxruntime's quantizer may drop helper files in the CWD
        try:
            quantize_dynamic(model_input=str(src), model_output=str(dst), weight_type=QuantType.QInt8,
                             per_channel=True)
        finally:
            root.setLevel(level)
    return dst


def quantize_variant(variant: str, src: Path, dst: Path, recipe: Int8Recipe = DEFAULT_RECIPE,
                     calibration: Sequence[Row] = ()) -> Path:
    """Build the quantized variant ``variant`` (a key of QUANTIZATIONS) of ``src`` at ``dst``
    (``recipe`` and its ``calibration`` rows: the exact variant's; the dynamic one is ONNX Runtime's own)."""
    if variant == "int8":
        return quantize_int8_exact(src, dst, recipe, calibration)
    if variant == "int8-dynamic":
        return quantize_int8_dynamic(src, dst)
    raise ValueError(f"unknown quantization {variant!r} (one of {', '.join(QUANTIZATIONS)})")


def _run_rows(session: ort.InferenceSession, rows: Sequence[Row], output: str) -> list[np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    return [session.run([output], {n: r[n][None, :] for n in names})[0] for r in rows]


def probability_agreement(pa: np.ndarray, pb: np.ndarray, cases: int) -> dict[str, Any]:
    """fp32's probabilities ``pa`` against int8's ``pb`` (a row per input, or per token): the share of top
    labels that agree and the largest |dp|, over ``cases`` inputs."""
    return {"metric": "probability", "top_label_agreement": round(float(np.mean(pa.argmax(-1) == pb.argmax(-1))), 6),
            "max_abs_dp": round(float(np.max(np.abs(pa - pb))), 6), "cases": cases}


def measure_agreement(kind: str, head: dict[str, Any], labels: Sequence[str], fp32: ort.InferenceSession,
                      int8: ort.InferenceSession, rows: Sequence[Row]) -> dict[str, Any]:
    """Agreement of int8 with fp32 on ``rows``, each run alone.

    embedding: cosine of the pooled vectors (mean, min); classifiers: top-label agreement and max
    |dp| of the probabilities; rerank: max and mean |dp| of the relevance scores.
    """
    if kind == "embedding":
        a = _run_rows(fp32, rows, "last_hidden_state")
        b = _run_rows(int8, rows, "last_hidden_state")
        va = np.concatenate([pool(x, r["attention_mask"][None, :], head["pooling"], head["normalize"])
                             for x, r in zip(a, rows)])
        vb = np.concatenate([pool(x, r["attention_mask"][None, :], head["pooling"], head["normalize"])
                             for x, r in zip(b, rows)])
        cos = cosine(va, vb)
        return {"metric": "cosine", "mean_cosine": round(float(cos.mean()), 6),
                "min_cosine": round(float(cos.min()), 6), "cases": len(rows)}
    a = _run_rows(fp32, rows, head["output"])
    b = _run_rows(int8, rows, head["output"])
    if kind == "rerank":
        dp = np.array([abs(float(sigmoid(x).ravel()[0] - sigmoid(y).ravel()[0])) for x, y in zip(a, b)])
        return {"metric": "relevance", "max_abs_dp": round(float(dp.max()), 6),
                "mean_abs_dp": round(float(dp.mean()), 6), "cases": len(rows)}
    activate = sigmoid if kind == "multi-label" else softmax
    pa = np.concatenate([activate(x).reshape(-1, x.shape[-1]) for x in a])  # token kinds: one row per token
    pb = np.concatenate([activate(y).reshape(-1, y.shape[-1]) for y in b])
    result = probability_agreement(pa, pb, len(rows))
    if kind == "multi-label":
        t = np.array([head["thresholds"][label] for label in labels])
        result["selection_agreement"] = round(float(np.mean((pa >= t) == (pb >= t))), 6)
    if kind == "token-classification":
        result["tokens"] = int(pa.shape[0])
    return result


#: Real sentences the embedding agreement is measured on (converters/data/README.md says whence).
REAL_SENTENCES = Path(__file__).resolve().parent / "data" / "stsb-train-sentences.txt"
REAL_SENTENCES_SOURCE = ("STS Benchmark train split, images and headlines genres, none also in dev or test "
                         "(converters/data/README.md)")
#: Sentences per batch when measuring corpus agreement (length-sorted, so little padding).
AGREEMENT_BATCH = 32


def real_sentences() -> list[str]:
    """The 2,500 real English sentences of REAL_SENTENCES."""
    return [line for line in REAL_SENTENCES.read_text(encoding="utf-8").splitlines() if line.strip()]


def _embed_sorted(session: ort.InferenceSession, rows: Sequence[Row], order: np.ndarray, head: dict[str, Any],
                  pad_id: int) -> np.ndarray:
    from converters.verify import pad_batch

    names = [i.name for i in session.get_inputs()]
    out: np.ndarray | None = None
    for start in range(0, len(order), AGREEMENT_BATCH):
        idx = order[start:start + AGREEMENT_BATCH]
        feeds = pad_batch([rows[i] for i in idx], names, pad_id)
        (hidden,) = session.run(["last_hidden_state"], feeds)
        vecs = pool(hidden, feeds["attention_mask"], head["pooling"], True)
        if out is None:
            out = np.zeros((len(rows), vecs.shape[1]), np.float64)
        out[idx] = vecs
    assert out is not None
    return out


def measure_corpus_agreement(head: dict[str, Any], fp32: ort.InferenceSession, int8: ort.InferenceSession,
                             rows: Sequence[Row], pad_id: int, corpus: str) -> dict[str, Any]:
    """Agreement of an int8 embedder with its fp32 on the real sentences ``rows`` (``corpus`` names them).

    Cosine of each sentence's int8 embedding to its fp32 one (min, 1st percentile, mean), and
    nearest-neighbour agreement: the share of sentences whose nearest other sentence of the corpus (by
    cosine) is the same under int8 as under fp32, which is what a semantic cache's hit depends on. Runs
    in length-sorted batches of 32: the exact variant's rows do not depend on their batch, and fp32's
    move by ~1e-7, far below what is stated (6 decimals).
    """
    order = np.argsort([len(r["input_ids"]) for r in rows], kind="stable")
    a = _embed_sorted(fp32, rows, order, head, pad_id)
    b = _embed_sorted(int8, rows, order, head, pad_id)
    cos = cosine(a, b)

    def nearest(v: np.ndarray) -> np.ndarray:
        sims = v @ v.T
        np.fill_diagonal(sims, -np.inf)
        return np.asarray(sims.argmax(axis=1))

    return {"metric": "cosine", "corpus": corpus, "cases": len(rows),
            "min_cosine": round(float(cos.min()), 6), "p1_cosine": round(float(np.percentile(cos, 1)), 6),
            "mean_cosine": round(float(cos.mean()), 6),
            "nearest_neighbour_agreement": round(float(np.mean(nearest(a) == nearest(b))), 6)}


def variant_entry(variant: str, agreement: dict[str, Any], recipe: Int8Recipe | None = None) -> dict[str, Any]:
    """The card's variants entry of a quantized graph: file, dtype, construction, numerics, agreement
    and the CPU it was measured on, and for the exact variant the recipe it was built with.

    ``numerics`` is what the construction promises: per-token int8 is batch-invariant (the server's
    probe still proves it at load); dynamic int8 changes a row's answer with its batch neighbours.
    """
    how = QUANTIZATIONS[variant]
    entry = {"file": variant_file(variant), "dtype": "int8", "quantization": how,
             "numerics": "exact" if how == "per-token" else "approximate", "agreement": agreement,
             # the agreement's fp32 side rounds as this CPU's kernels do (the exact int8 side does not)
             "measured_on": cpu_class()}
    if recipe is not None and how == "per-token":
        entry["recipe"] = recipe.describe()
    return entry


def _integer_operands(graph_path: Path, feeds: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Every MatMulIntegerToFloat of the graph (of each body, converters.small_forward) with its own operands
    on ``feeds``: the uint8 activation codes it read, its activation scale, int8 weight, weight scale and
    activation zero point, and the float it returned."""
    found = []
    for model in small_forward.bodies(onnx.load(str(graph_path))):
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        nodes = [n for n in model.graph.node if n.op_type == "MatMulIntegerToFloat"]
        names: list[str] = []
        for n in nodes:
            for name, kind in ((n.input[0], TensorProto.UINT8), (n.input[2], TensorProto.FLOAT),
                               (n.output[0], TensorProto.FLOAT)):
                if name not in names and name not in inits:
                    names.append(name)
                    model.graph.output.append(helper.make_tensor_value_info(name, kind, None))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2  # the kernels split work across threads as they do in service
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        inputs = {i.name for i in session.get_inputs()}
        values = {**inits, **dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in inputs})))}
        found += [{"name": n.name, "q": values[n.input[0]], "a_scale": values[n.input[2]], "w": inits[n.input[1]],
                   "w_scale": inits[n.input[3]], "zp": int(inits[n.input[4]].reshape(-1)[0]),
                   "out": values[n.output[0]]} for n in nodes]
    return found


def check_integer_products(graph_path: Path, tokenizer_path: Path, recipe: Int8Recipe,
                           texts: Sequence[str] | None = None) -> dict[str, Any]:
    """Prove, on the CPU this runs on, that every integer GEMM of an exact int8 graph returns the exact
    product of its own operands, and that its operand ranges make that so on every kernel.

    Runs ``texts`` (default: 17 of the real sentences, both genres) as one padded batch, reads each
    MatMulIntegerToFloat's uint8 codes, int8 weight and float output, and compares the output with the
    int64 numpy product times the channel scale. Raises ValueError naming the GEMM that differs or
    whose operands leave the recipe's bounds; returns what was checked.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.enable_padding()
    tok.enable_truncation(64)
    encs = tok.encode_batch(list(texts if texts is not None else real_sentences()[::150]))
    ids = np.array([e.ids for e in encs], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.array([e.attention_mask for e in encs], np.int64),
             "token_type_ids": np.zeros_like(ids)}
    return check_integer_products_on(graph_path, feeds, recipe)


def check_integer_products_on(graph_path: Path, feeds: dict[str, np.ndarray], recipe: Int8Recipe) -> dict[str, Any]:
    """:func:`check_integer_products` on any graph's own ``feeds`` (one batch; an image or audio tower's
    pixels or log-mel windows): every MatMulIntegerToFloat's output against the exact int64 product of
    its operands, and the operands inside the recipe's bounds. Raises ValueError; returns what was checked."""
    operands = _integer_operands(graph_path, feeds)
    if not operands:
        raise ValueError(f"{graph_path.name} has no MatMulIntegerToFloat: it is not an exact int8 graph")
    # the bound for every input: codes <= activation_max and |w| <= weight_max keep any two adjacent
    # products inside int16, so no kernel (vpmaddubsw on AVX2 and AVX-512 without VNNI, VNNI, AMX, ARM
    # dot products, CUDA) can saturate
    recipe.check()
    worst = 0.0
    for op in operands:
        q, w, name = op["q"], op["w"], op["name"]
        if q.dtype != np.uint8 or w.dtype != np.int8 or op["zp"] != recipe.activation_zero_point:
            raise ValueError(f"{name}: operands {q.dtype} x {w.dtype}, zero point {op['zp']}; the recipe "
                             f"promises uint8 x int8 around {recipe.activation_zero_point}")
        codes = q.astype(np.int64) - op["zp"]
        widest = int(np.abs(w.astype(np.int64)).max())
        if widest > recipe.weight_max or int(np.abs(codes).max()) > recipe.activation_max:
            raise ValueError(f"{name}: operands exceed the recipe's bounds ({recipe.describe()})")
        exact = codes.reshape(-1, codes.shape[-1]) @ w.astype(np.int64)
        if np.abs(exact).max() >= 2**24:  # float32(exact) would no longer be the integer itself
            raise ValueError(f"{name}: integer sums reach 2**24; the float comparison would be inexact")
        want = exact.astype(np.float32) * op["w_scale"].astype(np.float32)
        a_scale = op["a_scale"].astype(np.float32)  # 1, or each token's scale (the small-forward body)
        want = want * (a_scale.reshape(-1, 1) if a_scale.size > 1 else a_scale.reshape(()))
        got = op["out"].reshape(want.shape)
        err = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), np.finfo(np.float32).tiny)))
        # one float32 rounding of the scale multiply; a saturated pair sum is off by far more
        if not np.allclose(got, want, rtol=1e-6, atol=0):
            raise ValueError(f"{name}: the kernel's result differs from the exact integer product "
                             f"(relative error up to {err:.3g}): saturated or wrong")
        worst = max(worst, err)
    rows = int(next(iter(feeds.values())).shape[0]) if feeds else 0
    return {"gemms": len(operands), "rows": rows, "max_relative_error": worst,
            "pair_sum_bound": recipe.pair_sum_bound}
