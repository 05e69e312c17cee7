"""`export --kind image-text-embedding | audio-embedding --quantize int8`: the exact int8 of every tower.

Each tower's graph goes through converters.quantize's exact recipe without smoothing (DEFAULT_RECIPE:
per-token uint8 activations, per-channel int8 weights at +-64 so no 16-bit pair sum saturates), so
no calibration enters it. The encoders' SmoothQuant (alpha 0.6) was chosen on real sentences; a
tower has only the export's few sample inputs to calibrate on, and smoothing calibrated on them
hurt: Whisper tiny.en's int8 on the four real recordings of tests/data/speech fell to cosine
0.82-0.85 with fp32 when smoothed on the export's three tones, and is 0.9993-0.9994 unsmoothed
(docs/benchmarks.md). The sample inputs still prove the folded weights constant and feed the
integer-product check. Only MatMul/Gemm with a constant 2-D weight become integer GEMMs: convolutions (SigLIP's
and CLIP's patch embedding, Whisper's two front-end Conv1d, HTSAT's patch embedding), attention's
activation-by-activation products, normalisation and embeddings stay fp32.

Agreement with fp32 is measured per tower on inputs the calibration never saw (generated here with
their own seeds, or real sentences for a text tower), each run alone, as the cosine of the tower's
pooled, normalised vectors. The integer products of every GEMM are checked against exact numpy
arithmetic on the tower's sample batch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from converters import quantize
from converters.graph_files import drop_dead_nodes, save_graph
from converters.multimodal.verify import tower_session
from converters.readout import cosine

#: The recipe every tower's int8 is built with: no smoothing, so no calibration (module docstring).
RECIPE = quantize.DEFAULT_RECIPE
#: Real sentences a text tower's agreement is measured on: every 10th of the STS-B train sentences.
TEXT_AGREEMENT_STEP = 10
#: Generated images and clips the image and audio agreement is measured on.
AGREEMENT_IMAGES = 24
AGREEMENT_CLIPS = 12

Feeds = dict[str, np.ndarray]


def agreement_images() -> list[Any]:
    """24 generated images unlike the calibration's noise: smooth gradients with drawn shapes, in
    several sizes and aspect ratios (seed 101), so the tower meets structure it was not calibrated on."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(101)
    images = []
    for i in range(AGREEMENT_IMAGES):
        w, h = int(rng.integers(24, 160)), int(rng.integers(24, 160))
        yy, xx = np.mgrid[0:h, 0:w] / np.array([max(h - 1, 1), max(w - 1, 1)])[:, None, None]
        base = rng.uniform(0, 255, size=(2, 3))
        grad = (base[0] * (1 - xx[..., None]) + base[1] * yy[..., None]) / 2 + 60
        img = Image.fromarray(np.clip(grad, 0, 255).astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(1, 6))):
            x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
            x1, y1 = x0 + int(rng.integers(2, w)), y0 + int(rng.integers(2, h))
            fill = tuple(int(c) for c in rng.integers(0, 256, 3))
            (draw.ellipse if i % 2 else draw.rectangle)([x0, y0, x1, y1], fill=fill)
        images.append(img)
    return images


def agreement_clips(rate: int, window_s: float) -> list[np.ndarray]:
    """12 generated clips unlike the calibration's steady tones: chirps, harmonic stacks with vibrato
    and noise bursts of 0.3 s to a full window (seed 202)."""
    rng = np.random.default_rng(202)
    clips = []
    for i in range(AGREEMENT_CLIPS):
        seconds = float(rng.uniform(0.3, window_s))
        t = np.arange(int(seconds * rate)) / rate
        if i % 3 == 0:  # a chirp
            f0, f1 = rng.uniform(100, 800), rng.uniform(800, 4000)
            x = np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t ** 2 / (2 * max(seconds, 1e-3))))
        elif i % 3 == 1:  # a voiced-like harmonic stack with vibrato
            f = rng.uniform(90, 250) * (1 + 0.02 * np.sin(2 * np.pi * 5 * t))
            phase = 2 * np.pi * np.cumsum(f) / rate
            x = np.sum([np.sin(k * phase) / k for k in range(1, 8)], axis=0)
        else:  # noise bursts
            x = rng.normal(0, 1, t.shape) * (np.sin(2 * np.pi * rng.uniform(1, 6) * t) > 0)
        x = x / max(float(np.max(np.abs(x))), 1e-6) * rng.uniform(0.05, 0.8)
        clips.append(x.astype(np.float32))
    return clips


def run_alone(session: Any, feeds_list: Sequence[Feeds], output: str) -> list[np.ndarray]:
    """The tower's output row of each feeds, each run alone."""
    return [session.run([output], feeds)[0][0] for feeds in feeds_list]


def _vectors(values: Sequence[np.ndarray], pool: Callable[[np.ndarray, int], np.ndarray] | None) -> np.ndarray:
    """One vector per output row, pooled as the runtime pools the tower."""
    return np.stack([pool(value, i) if pool is not None else value.astype(np.float64)
                     for i, value in enumerate(values)])


def tower_agreement(fp32: Sequence[np.ndarray], int8: Sequence[np.ndarray], inputs: str,
                    pool: Callable[[np.ndarray, int], np.ndarray] | None = None) -> dict[str, Any]:
    """Cosine of each input's int8 vector to its fp32 one (min, 1st percentile, mean) from the two graphs'
    outputs alone (:func:`run_alone`); ``inputs`` says what they were."""
    cos = cosine(_vectors(fp32, pool), _vectors(int8, pool))
    return {"metric": "cosine", "inputs": inputs, "cases": len(fp32),
            "min_cosine": round(float(cos.min()), 6), "p1_cosine": round(float(np.percentile(cos, 1)), 6),
            "mean_cosine": round(float(cos.mean()), 6)}


def _shape_only_weights(model: onnx.ModelProto) -> list[str]:
    """Weights of MatMul/Gemm computed inside the graph from initializers, whose only link to the
    graph's inputs is through Shape (so their value may depend on static sizes, never on data)."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    inputs = {i.name for i in graph.input} - inits
    producer = {o: n for n in graph.node for o in n.output}
    cache: dict[str, bool] = {}

    def data_free(name: str) -> bool:
        """True when ``name`` is computed from constants and shapes only."""
        if name in cache:
            return cache[name]
        if name in inits or not name:
            result = True
        elif name in inputs or name not in producer:
            result = False
        else:
            node = producer[name]
            result = node.op_type == "Shape" or (node.domain in ("", "ai.onnx") and node.op_type not in
                                                 ("RandomNormal", "RandomNormalLike", "RandomUniform",
                                                  "RandomUniformLike", "Multinomial", "Bernoulli")
                                                 and all(data_free(i) for i in node.input))
        cache[name] = result
        return result

    return sorted({n.input[1] for n in graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1
                   and n.input[1] not in inits and n.input[0] not in inits and data_free(n.input[1])})


def fold_computed_weights(model: onnx.ModelProto, feeds_list: Sequence[Feeds]) -> list[str]:
    """Store as initializers the MatMul/Gemm weights the graph computes from its own weights and static
    sizes (:func:`_shape_only_weights`) when every one of ``feeds_list`` (and their batch) gives the same
    value; drops the nodes that computed them. Returns the weights stored, in place.

    Why: the TorchScript export leaves some weights computed, not stored. SigLIP's attention-pooling
    head slices its query, key and value weights out of nn.MultiheadAttention's one in_proj_weight
    (bounds from the query's shape), so those MatMuls read no initializer and the int8 rewriter would
    leave them fp32; the query projection then runs on the batch's copies of the probe as one fp32 GEMM
    with M = batch size, which ONNX Runtime rounds differently for one row and for several (the fp32
    image tower is not batch-invariant; int8 rounding hid it from the load-time probe only by chance).
    Stored, they are constant-weight MatMuls and become per-token integer GEMMs like the others.
    """
    names = _shape_only_weights(model)
    if not names:
        return []
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for n in names:
        probe.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = list(feeds_list)
    shapes = {tuple((k, v.shape) for k, v in f.items()) for f in feeds_list}
    if len(feeds_list) > 1 and len(shapes) == 1:
        runs.append({k: np.concatenate([f[k] for f in feeds_list]) for k in feeds_list[0]})
    seen = [session.run(names, f) for f in runs]
    stored = [n for i, n in enumerate(names) if all(np.array_equal(seen[0][i], s[i]) for s in seen[1:])]
    graph = model.graph
    for i, n in enumerate(names):
        if n in stored:
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(seen[0][i]), n))
    drop_dead_nodes(graph)  # the slicing of in_proj_weight, then the weights it read
    return stored


def batch_invariance(session: Any, feeds_list: Sequence[Feeds], alone: Sequence[np.ndarray], output: str
                     ) -> dict[str, Any]:
    """Whether each of ``feeds_list`` gives bit-identical output alone and batched with the others of its
    shape (as the server batches a tower's rows): {rows, batches, identical}. ``alone``: each one's
    output row run alone (:func:`run_alone`).

    Why beside the load-time probe: int8 rounding absorbs most of an fp32 part's batch-dependent
    last-bit differences, so a probe of three random rows can pass by chance where a graph is not
    invariant; this check runs every agreement input, and the server serves a tower that failed it
    one row at a time.
    """
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(feeds_list):
        groups.setdefault(tuple((k, v.shape) for k, v in sorted(f.items())), []).append(i)
    identical, batches = True, 0
    for group in groups.values():
        if len(group) < 2:
            continue
        batches += 1
        together = session.run([output], {k: np.concatenate([feeds_list[i][k] for i in group])
                                          for k in feeds_list[group[0]]})[0]
        identical = identical and all(np.array_equal(alone[i], together[j]) for j, i in enumerate(group))
    return {"rows": sum(len(g) for g in groups.values() if len(g) > 1), "batches": batches, "identical": identical}


def quantize_tower(graph: Path, dst: Path, calibration: Sequence[Feeds], agreement_feeds: Sequence[Feeds],
                   output: str, inputs: str, pool: Callable[[np.ndarray, int], np.ndarray] | None = None
                   ) -> tuple[Path, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Write the exact int8 of the tower ``graph`` at ``dst``: (path, agreement, integer-product check,
    batch invariance on the agreement inputs).

    ``calibration``: the tower's sample feeds (batch 1 each; smoothing ranges when RECIPE smooths, the
    folded weights' check, the integer check); ``agreement_feeds``:
    other inputs, compared alone with fp32. The integer check runs the calibration feeds as one batch
    when they share a shape (else the first alone).
    """
    rows = [{k: v[0] for k, v in f.items()} for f in calibration]
    model = onnx.load(str(graph))
    fold_computed_weights(model, calibration)
    with tempfile.TemporaryDirectory(prefix="er-tower-fold-") as tmp:
        folded = Path(tmp) / graph.name
        save_graph(model, folded)
        quantize.quantize_int8_exact(folded, dst, RECIPE, rows)
    fp32, int8 = tower_session(graph), tower_session(dst)
    fp32_rows, int8_rows = run_alone(fp32, agreement_feeds, output), run_alone(int8, agreement_feeds, output)
    agreement = tower_agreement(fp32_rows, int8_rows, inputs, pool)
    shapes = {tuple((k, v.shape) for k, v in f.items()) for f in calibration}
    batch = ({k: np.concatenate([f[k] for f in calibration]) for k in calibration[0]} if len(shapes) == 1
             else dict(calibration[0]))
    check = quantize.check_integer_products_on(dst, batch, RECIPE)
    invariance = batch_invariance(int8, agreement_feeds, int8_rows, output)
    return dst, agreement, check, invariance


def variant_agreement(towers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The package's int8 agreement: the worst tower's figures, and each tower's own."""
    return {"metric": "cosine", "min_cosine": min(t["min_cosine"] for t in towers.values()),
            "mean_cosine": min(t["mean_cosine"] for t in towers.values()),
            "cases": sum(t["cases"] for t in towers.values()), "towers": towers}
