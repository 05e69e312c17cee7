"""`export --kind task-heads`: a ModernBERT task source (Vela 1.0 and compatible) -> a task-heads package.

Steps: the source read as data (which head, its operating point or layout: source.py); the checkpoint
loaded into Transformers with SDPA attention (never FlashAttention 2, which drops YaRN) and every weight
accounted for; one graph exported with ``torch.onnx.export`` (opset 18) that ends where the head's
batch-invariant part ends (source.py's head -> :data:`GRAPH_OUTPUTS`), its shape arithmetic folded
(attention_shapes.fold_file) and its rotary embedding fused (rotary.fuse_file); the numpy part of the head
written to head.npz; parity against Transformers (verify.py), refused above tolerance; the card; the write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.attention_shapes import fold_file
from converters.errors import ConversionError
from converters.identity import PackageIdentity, identity_card, notice_files, sanitize_name
from converters.package_writer import ExportResult, PackageBuild, card_start
from converters.progress import log
from converters.rotary import fuse_file
from converters.source import check_tokenizer, package_tokenizer, resolve_source, source_stamp
from converters.task_heads import source as task_source
from converters.task_heads import verify
from converters.task_heads.source import TaskSource
from converters.verify import rounded, torch_reference
from edge_runtime.packages.manifest import compute_digest

OPSET = 18
#: every row a package reads is capped here unless --max-input-tokens says otherwise: the exported
#: attention is quadratic in the row (ModernBERT's local window is a mask, not a band), so longer
#: texts are read in windows or truncated
DEFAULT_ROW_LIMIT = 8192
#: below this many parameters the reference runs on one PyTorch thread
SMALL_MODEL_PARAMETERS = 20_000_000
#: the exact int8's integer products are proven at conversion on this many rows of at most this many tokens
EXACTNESS_ROWS, EXACTNESS_MAX_TOKENS = 8, 64
#: the card kind of each head
CARD_KINDS = {"sequence": "task-sequence", "scores": "task-scores", "token": "task-token",
              "grounded": "task-grounded", "pooled": "task-pooled", "relevance": "task-relevance"}


@dataclass
class TaskOptions(PackageIdentity):
    """What to export beyond what the source declares; None and empty mean "as the source says"."""

    max_input_tokens: int | None = None
    #: pooled: the layer exits and Matryoshka sizes (override the package's exit graphs and contract)
    layers: Sequence[int] = ()
    dimensions: Sequence[int] = ()
    #: pooled without a representation contract: normalise exits with the final norm
    exit_normalization: str | None = None
    #: grounded without an operating point (LettuceDetect): the pair template and token threshold
    input_pair: str | None = None
    token_threshold: float | None = None
    #: the longest row the parity check reads
    parity_tokens: int = verify.LONGEST_ROW
    #: the quantized variant written beside fp32 (None: fp32 only). The exact int8 by default: it is what
    #: the server serves on a CPU (variant auto), and the Router's managed runtime converts with defaults
    quantize: str | None = "int8"


def _load(source: TaskSource) -> Any:
    """The checkpoint in Transformers 4.57, SDPA attention, fp32, every weight loaded from it."""
    from transformers import (
        ModernBertConfig,
        ModernBertForSequenceClassification,
        ModernBertForTokenClassification,
        ModernBertModel,
    )

    from converters.torch_models import load_pretrained

    raw = task_source.read_json(source.model_dir / "config.json")
    cfg_dict, notes = task_source.transformers4_config(raw)
    for note in notes:
        log(note)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = ModernBertConfig(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type")})
    # never compiled (its reference_compile path breaks tracing on a GPU host); SDPA, never FA2
    config.reference_compile = False
    cls = {"sequence": ModernBertForSequenceClassification, "scores": ModernBertForSequenceClassification,
           "token": ModernBertForTokenClassification, "grounded": ModernBertForTokenClassification}.get(
        source.head, ModernBertModel)
    return load_pretrained(cls, source.model_dir, str(source.model_dir), config=config, attn_implementation="sdpa")


def graph_module(model: Any, source: TaskSource, layers: Sequence[int], exit_norm: str) -> Any:
    """The torch module the graph is exported from: the model up to where the head's batch-invariant part
    ends. Outputs, by head: last_hidden_state (pooled classifiers: pooling and the head run in numpy),
    logits (token heads), last_hidden_state and hidden_states.<L> per earlier exit (embedders), exit_cls
    [batch, exits, hidden] (the final-normed CLS state of every scored layer: rerankers)."""
    import torch

    head = source.head
    encoder = model.model if hasattr(model, "model") else model
    total = int(model.config.num_hidden_layers)

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            if head in ("token", "grounded"):
                return self.model(input_ids=input_ids, attention_mask=attention_mask).logits
            want = head in ("pooled", "relevance")
            out = encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=want)
            if head in ("sequence", "scores"):
                return out.last_hidden_state
            states = out.hidden_states  # [L] is layer L's output, before the final norm
            if head == "relevance":
                return torch.stack([encoder.final_norm(states[layer][:, 0]) for layer in layers], dim=1)
            exits = [encoder.final_norm(states[k]) if exit_norm == "final_norm" else states[k]
                     for k in layers if k < total]
            return (out.last_hidden_state, *exits)

    return Graph().eval()


def graph_outputs(source: TaskSource, layers: Sequence[int], total: int) -> list[str]:
    """The graph's output names, in the order graph_module returns them."""
    if source.head in ("token", "grounded"):
        return ["logits"]
    if source.head in ("sequence", "scores"):
        return ["last_hidden_state"]
    if source.head == "relevance":
        return ["exit_cls"]
    return ["last_hidden_state", *(f"hidden_states.{k}" for k in layers if k < total)]


def export_graph(module: Any, outputs: list[str], path: Path) -> Path:
    """``torch.onnx.export`` (TorchScript, opset 18) with dynamic batch and sequence axes."""
    import torch

    ids = torch.tensor([[2, 5, 6, 7, 8, 1], [2, 9, 10, 11, 1, 0]], dtype=torch.long)
    mask = (ids != 0).long()
    axes: dict[str, dict[int, str]] = {"input_ids": {0: "batch_size", 1: "sequence_length"},
                                       "attention_mask": {0: "batch_size", 1: "sequence_length"}}
    for name in outputs:
        axes[name] = {0: "batch_size"} if name == "exit_cls" else {0: "batch_size", 1: "sequence_length"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings: the graph is checked against PyTorch after
        torch.onnx.export(module, (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                          output_names=outputs, dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    return path


def _max_input_tokens(opts: TaskOptions, source: TaskSource, config: Any) -> int:
    limit = int(config.max_position_embeddings)
    value = opts.max_input_tokens or min(limit, DEFAULT_ROW_LIMIT)
    if source.pooled is not None and source.pooled.max_seq_length and not opts.max_input_tokens:
        value = min(value, source.pooled.max_seq_length)
    point = source.operating_point or {}
    if source.head == "grounded" and point.get("max_input_tokens"):
        value = min(value, int(point["max_input_tokens"]))
    if value > limit:
        raise ConversionError(f"max_input_tokens {value} exceeds the model's max_position_embeddings {limit}")
    return int(value)


def _window(source: TaskSource, max_tokens: int) -> tuple[dict[str, Any], str]:
    """The head's window (upstream's placement) and default overflow: the operating point's, else one window
    of the whole row."""
    window = task_source.operating_window(source.operating_point)
    if window is None:
        return {"tokens": max_tokens, "overlap": 0, "placement": "stride"}, "reject"
    tokens, overlap = window
    if tokens > max_tokens:
        raise ConversionError(f"the operating point's windows of {tokens} tokens exceed max_input_tokens {max_tokens}")
    return {"tokens": tokens, "overlap": overlap, "placement": "stride"}, "window"


def _op_entry(source: TaskSource) -> dict[str, Any]:
    digest = hashlib.sha256((source.root / task_source.OPERATING_POINT).read_bytes()).hexdigest()
    entry: dict[str, Any] = {"file": task_source.OPERATING_POINT, "sha256": digest}
    limit = task_source.max_document_tokens(source.operating_point)
    if limit is not None:
        entry["max_document_tokens"] = limit
    return entry


def head_card(source: TaskSource, opts: TaskOptions, model: Any, max_tokens: int) -> tuple[dict[str, Any], list[int]]:
    """The card's head and the layer exits the graph gives (pooled and relevance heads)."""
    config = model.config
    total, hidden = int(config.num_hidden_layers), int(config.hidden_size)
    if source.head in ("sequence", "scores"):
        window, overflow = _window(source, max_tokens)
        head: dict[str, Any] = {
            "output": "last_hidden_state", "pooling": str(config.classifier_pooling),
            "activation": "softmax" if source.head == "sequence" else "sigmoid",
            "classifier": {"weights": "head.npz", "activation": str(config.classifier_activation),
                           "norm_eps": float(config.norm_eps)},
            "window": window, "overflow": overflow}
        if source.head == "scores":
            point = source.operating_point
            head["thresholds"] = [float(t) for t in point["thresholds"]] if point else [0.5] * len(source.labels)
            head["comparison"] = ">" if point and point["comparison"] == "score > threshold" else ">="
            if point:
                head["operating_point"] = _op_entry(source)
        return head, []
    if source.head == "token":
        window, overflow = _window(source, max_tokens)
        return {"output": "logits", "scheme": "BIO", "window": window, "overflow": overflow}, []
    if source.head == "grounded":
        point = source.operating_point or {}
        if point and (opts.input_pair or opts.token_threshold is not None):
            raise ConversionError("--input-pair and --token-threshold are for grounded heads without an operating "
                                  "point; this one declares its own")
        head = {"output": "logits", "scheme": "runs", "positive": task_source.positive_label(source.labels),
                "threshold": float(point.get("token_threshold", 0.5 if opts.token_threshold is None
                                             else opts.token_threshold)),
                "comparison": ">" if point.get("threshold_comparison", "strictly_greater") == "strictly_greater"
                else ">=",
                "input_pair": list(point.get("input_pair") or [opts.input_pair or task_source.DEFAULT_INPUT_PAIR,
                                                                "answer"])}
        if point:
            head["operating_point"] = _op_entry(source)
        return head, []
    if source.head == "relevance":
        assert source.relevance is not None
        layers = sorted({layer for layer, _ in source.relevance.exits})
        default = {"layer": source.relevance.default[0], "dimension": source.relevance.default[1]}
        return {"output": "exit_cls", "layers": layers, "default": default,
                "exits": [{"layer": la, "dimension": d} for la, d in source.relevance.exits],
                "scorer": {"weights": "head.npz", "activation": "gelu"}}, layers
    pooled = source.pooled
    assert pooled is not None
    layers = sorted({*opts.layers, total}) if opts.layers else list(pooled.layers)
    if any(not 1 <= k <= total for k in layers):
        raise ConversionError(f"--layers {layers}: the model has layers 1..{total}")
    dims = sorted({hidden, *opts.dimensions}, reverse=True) if opts.dimensions else list(pooled.dimensions)
    if dims[0] != hidden:
        raise ConversionError(f"--dimensions {dims[0]} exceeds the hidden size {hidden}")
    exit_norm = opts.exit_normalization or pooled.exit_normalization
    return {"pooling": pooled.pooling, "normalize": pooled.normalize, "dimension": hidden, "dimensions": dims,
            "layers": {str(k): "last_hidden_state" if k == total else f"hidden_states.{k}" for k in layers},
            "exit_normalization": exit_norm}, layers


def head_weights(source: TaskSource, model: Any, exits: Sequence[tuple[int, int]]) -> dict[str, np.ndarray]:
    """head.npz: a pooled classifier's prediction head and classifier, or every exit's pair scorer."""
    if source.head in ("sequence", "scores"):
        state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()
                 if k.startswith(("head.", "classifier."))}
        return dict(sorted(state.items()))
    from safetensors.numpy import load_file

    tensors = load_file(str(source.root / task_source.SCORERS))
    return {f"scorer.{layer}.{dim}.{part}": tensors[f"{layer}.{dim}.{part}"].astype(np.float32)
            for layer, dim in exits for part in ("0.weight", "0.bias", "3.weight", "3.bias")}


@contextmanager
def _torch_threads(model: Any) -> Iterator[None]:
    """One PyTorch thread for a small model: its matrices are tiny, and on a shared CPU more threads spin and
    run 10-70x slower (a fixture's forward: 0.6 s on two threads, 8 ms on one)."""
    import torch

    before = torch.get_num_threads()
    if sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def export_task_heads(src: str | Path, out: Path, opts: TaskOptions) -> ExportResult:
    """Export the task source ``src`` as a package at ``out``; ConversionError (one line) when it cannot
    or must not."""
    with PackageBuild(out, "er-task-heads-") as build:
        src_dir = resolve_source(str(src))
        with build.step("read", f"reading {src_dir}"):
            source = task_source.read_source(src_dir)
        for note in source.notes:
            log(note)
        with build.step("imports", "loading PyTorch and transformers"):
            from transformers.utils import logging as hf_logging
            hf_logging.set_verbosity_error()
        with build.step("load", f"loading the {source.head} head's checkpoint ({source.architecture}, SDPA)"):
            model = _load(source)
            tokenizer = package_tokenizer(source.model_dir)
            max_tokens = _max_input_tokens(opts, source, model.config)
            head, layers = head_card(source, opts, model, max_tokens)
            samples = verify.samples(source.head)
            check_tokenizer(source.model_dir, tokenizer, [s for s in samples if not isinstance(s, dict)][:8])
        exits = source.relevance.exits if source.relevance else ()
        outputs = graph_outputs(source, layers, int(model.config.num_hidden_layers))
        with _torch_threads(model):
            with build.step("export", f"exporting ONNX (opset {OPSET}, outputs {', '.join(outputs)})"):
                module = graph_module(model, source, layers, head.get("exit_normalization", "none"))
                graph = export_graph(module, outputs, build.work / "model.onnx")
            parity_tokens = min(max_tokens, opts.parity_tokens)
            with build.step("fold", "folding the graph's shape arithmetic into constants, checked bit-identical"):
                rows = verify.tokenized_rows(tokenizer, samples, head, parity_tokens)
                graph, folding = fold_file(graph, rows, 0, build.work)
            log(folding.summary())
            with build.step("rotary", "fusing the rotary embedding into one kernel, checked against the export"):
                graph, rotary = fuse_file(graph, rows, 0, build.work)
            log(f"rotary embedding: {rotary['rotations']} rotations fused"
                + (f", outputs within {rotary['max_abs_diff']:.3g} of the export" if rotary["rotations"] else ""))
            weights = head_weights(source, model, exits) if source.head in ("sequence", "scores", "relevance") \
                else {}
            with build.step("parity", "checking parity against Transformers (alone and right-padded batches)"):
                session = verify.create_session(graph)
                parity = verify.check_parity(source, model, module, session, tokenizer, head, weights, samples,
                                             parity_tokens, outputs)
        log(f"parity: graph max |onnx - torch| {parity.graph_max_abs_diff:.3g}, readout {parity.metric} "
            f"{parity.readout:.3g} over {parity.cases} cases")
        files: dict[str, Path | bytes] = {"model.onnx": graph,
                                          "tokenizer.json": tokenizer.to_str().encode("utf-8")}
        variants: dict[str, dict[str, Any]] = {"fp32": {"file": "model.onnx", "dtype": "fp32"}}
        goldens = {"fp32": verify.goldens(session, parity.golden_rows)}
        products = None
        if opts.quantize is not None:
            from converters import quantize

            variant = opts.quantize
            with build.step("quantize", f"quantizing to {variant} ({quantize.QUANTIZATIONS[variant]} activation "
                                        "scales, per-channel int8 weights) and measuring its agreement"):
                q_path, q_session, variants[variant], products = _quantized(
                    variant, source, head, weights, tokenizer, session, graph, outputs, layers, build.work, max_tokens)
            log(f"{variant} agreement with fp32: {variants[variant]['agreement']}")
            goldens[variant] = verify.goldens(q_session, parity.golden_rows)
            files[quantize.variant_file(variant)] = q_path
        if weights:
            files["head.npz"] = verify.npz_bytes(weights)
        if "operating_point" in head:
            files[task_source.OPERATING_POINT] = source.root / task_source.OPERATING_POINT
        files.update(notice_files(src_dir, opts))
        stamp = compute_digest({"weights": source_stamp(src_dir, source.model_dir),
                                **task_source.stamp_files(source)})
        card = _card(opts, source, src_dir, stamp, head, max_tokens, outputs, parity, variants)
        if folding.changed:
            card["verification"]["shape_folding"] = folding.describe()
        if rotary["rotations"]:
            card["verification"]["rotary_fusion"] = rotary
        if products is not None:
            card["verification"]["integer_products"] = products
        return build.write(card, files, goldens)


def _quantized(variant: str, source: TaskSource, head: dict[str, Any], weights: dict[str, np.ndarray],
               tokenizer: Any, session: Any, graph: Path, outputs: list[str], layers: list[int], work: Path,
               max_tokens: int) -> tuple[Path, Any, dict[str, Any], dict[str, Any] | None]:
    """The quantized variant of ``graph``: its file, session, card entry (agreement with fp32 on real
    sentences, read through the head) and, for the exact int8, the proof of its integer products on this CPU.

    The exact int8 takes the encoders' calibrated recipe (smoothing, and each activation's largest channels
    in fp32), calibrated on the parity samples: ModernBERT's activation outliers are what broke upstream's
    dynamic int8 (worst cosine 0.634 on its embedder, router-catalogue.md)."""
    from converters import quantize
    from converters.verify import pad_batch

    calibration = verify.tokenized_rows(tokenizer, verify.samples(source.head), head, max_tokens)
    recipe = quantize.CALIBRATED_RECIPE if variant == "int8" else None
    path = quantize.quantize_variant(variant, graph, work / quantize.variant_file(variant),
                                     recipe or quantize.DEFAULT_RECIPE, calibration)
    q_session = verify.create_session(path)
    corpus = verify.tokenized_rows(tokenizer, verify.agreement_items(source.head), head, max_tokens)
    agreement = verify.int8_agreement(source.head, head, weights, session, q_session, corpus, outputs, layers)
    agreement["corpus"] = f"every {verify.AGREEMENT_STRIDE}th sentence of the {quantize.REAL_SENTENCES_SOURCE}"
    products = None
    if recipe is not None:
        # rows cut short: every integer GEMM's operands of the batch are held at once (GBs at 307M for long ones)
        short = [{k: v[:EXACTNESS_MAX_TOKENS] for k, v in r.items()} for r in calibration[:EXACTNESS_ROWS]]
        try:
            products = quantize.check_integer_products_on(path, pad_batch(short, ["input_ids", "attention_mask"], 0),
                                                          recipe)
        except ValueError as exc:
            raise ConversionError(f"int8: {exc}; no package written") from None
    return path, q_session, quantize.variant_entry(variant, agreement, recipe), products


def _card(opts: TaskOptions, source: TaskSource, src_dir: Path, stamp: str, head: dict[str, Any], max_tokens: int,
          outputs: list[str], parity: verify.Parity, variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    source_name = opts.source_name or src_dir.name
    architecture = (source.config.get("architectures") or [source.architecture])[0]
    kind = CARD_KINDS[source.head]
    identity = identity_card(opts, src_dir, source_name=source_name, architecture=architecture, stamp=stamp,
                             description=f"{architecture} {source.head} head exported from {source_name}")
    return {
        **card_start(sanitize_name(opts.name or src_dir.name), "task-heads", kind, identity,
                     labels=list(source.labels)),
        "head": head,
        "limits": {"max_input_tokens": max_tokens},
        "graph": {"inputs": ["input_ids", "attention_mask"], "outputs": outputs, "opset": OPSET},
        "variants": variants,
        "verification": {
            "reference": torch_reference(f"{architecture} fp32, SDPA"),
            "max_abs_diff": rounded(parity.graph_max_abs_diff),
            "tolerance": verify.GRAPH_TOLERANCE,
            "cases": parity.cases,
            "readout": {"metric": parity.metric, "value": rounded(parity.readout),
                        "tolerance": verify.READOUT_TOLERANCE[parity.metric]},
            "lengths": parity.lengths,
        },
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": stamp,
                  "options": {k: v for k, v in dataclasses.asdict(opts).items()
                              if k in ("max_input_tokens", "layers", "dimensions", "exit_normalization",
                                       "input_pair", "token_threshold", "quantize")}},
    }


__all__ = ["TaskOptions", "export_task_heads"]
