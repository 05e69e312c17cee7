"""`export --kind embedding | sequence-classification | multi-label | token-classification | rerank`:
a Hugging Face encoder directory -> a verified edge-runtime package.

Steps: the source (resolved, the PyTorch model loaded, its tokenizer with padding and truncation
removed, its head and limit read), the graph (ONNX with Optimum), its verification (parity against
PyTorch, refused above tolerance; optionally the int8 variant and its agreement), the card, the write.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters import CONVERTER_VERSION
from converters.attention_shapes import Folding, fold_file
from converters.encoder import verify as encoder_verify
from converters.errors import ConversionError
from converters.graph_files import EXTERNAL_DATA_BYTES, data_file, gather_graph
from converters.identity import PackageIdentity, identity_card, notice_files, sanitize_name
from converters.package_writer import ExportResult, GoldenCases, PackageBuild, card_start
from converters.progress import log
from converters.sentence_transformers import SentenceTransformerInfo, read_sentence_transformer
from converters.source import check_tokenizer, is_hub_id, package_tokenizer, resolve_source, source_stamp
from converters.verify import Row, create_session, encode_rows, rounded, torch_reference

KINDS = ("embedding", "sequence-classification", "multi-label", "token-classification", "rerank")
QUANTIZE = ("int8", "int8-dynamic")  # int8: per-token, exact; int8-dynamic: approximate
_BIO = re.compile(r"^(O|[BI]-.+)$")


@dataclass
class ExportOptions(PackageIdentity):
    """What to export and how; None means "read it from the source" or the documented default."""

    kind: str
    quantize: str | None = None
    layers: Sequence[int] = ()
    dimensions: Sequence[int] = ()
    thresholds: dict[str, float] | None = None
    pooling: str | None = None
    normalize: bool | None = None
    max_input_tokens: int | None = None
    #: a LoRA adapter's base directory (default: found from adapter_config.json) and the Hugging Face
    #: cache a base repo id is looked up in (default: HF_HUB_CACHE)
    base: Path | None = None
    cache_dir: Path | None = None
    #: graphs above this many bytes keep their weights in model.onnx.data
    external_data_above: int = EXTERNAL_DATA_BYTES
    #: embedding int8: the least cosine to fp32 over the sample set for the variant to be recommended
    #: (recorded in the card with whether it was met); None records no floor
    int8_min_cosine: float | None = None


def _check_options(opts: ExportOptions) -> None:
    if opts.kind not in KINDS:
        raise ConversionError(f"unknown kind {opts.kind!r} (one of {', '.join(KINDS)})")
    if opts.quantize is not None and opts.quantize not in QUANTIZE:
        raise ConversionError(f"--quantize {opts.quantize!r} is not supported ({', '.join(QUANTIZE)})")
    if opts.kind != "embedding" and (opts.layers or opts.dimensions or opts.pooling or opts.normalize is not None):
        raise ConversionError("--layers, --dimensions, --pooling and --normalize apply to kind embedding only")
    if opts.kind != "multi-label" and opts.thresholds:
        raise ConversionError("--thresholds applies to kind multi-label only")
    if opts.pooling is not None and opts.pooling not in ("mean", "cls", "last"):
        raise ConversionError(f"--pooling {opts.pooling!r}: one of mean, cls, last")


#: model types whose graphs are written in fp32 only, and why (the card says it)
FP32_ONLY = {"gemma3_text": "Gemma3's activations reach about 8e5, past fp16's range (TEI and unsloth refuse fp16 "
                            "for it), and no int8 of it has been measured: only the fp32 graph is written"}


def model_class(kind: str) -> Any:
    """The Transformers auto class a kind's model is loaded as."""
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

    return {"embedding": AutoModel, "token-classification": AutoModelForTokenClassification}.get(
        kind, AutoModelForSequenceClassification)


def _load_model(kind: str, model_dir: Path) -> Any:
    """The PyTorch model, every weight it computes with loaded from the checkpoint (an embedding may drop a
    task head and never runs BERT's pooler)."""
    from converters.torch_models import load_pretrained

    embedding = kind == "embedding"
    return load_pretrained(model_class(kind), model_dir, str(model_dir), unused=("pooler.",) if embedding else (),
                           discard_unexpected=embedding)


def _max_input_tokens(opts: ExportOptions, st: SentenceTransformerInfo | None, model_dir: Path, config: Any) -> int:
    """The input limit: --max-input-tokens (refused past the positions), else the declared one (the
    sentence-transformers max_seq_length, else the tokenizer's model_max_length) within the model's
    max_position_embeddings, as sentence-transformers reads it (Qwen3-Embedding's tokenizer declares
    131072 over 32768 positions)."""
    limit = getattr(config, "max_position_embeddings", None)
    if opts.max_input_tokens is not None:
        if limit and opts.max_input_tokens > limit:
            raise ConversionError(f"--max-input-tokens {opts.max_input_tokens} exceeds the model's "
                                  f"max_position_embeddings {limit}")
        return opts.max_input_tokens
    value = st.max_seq_length if st is not None else None
    if not value:
        cfg_path = model_dir / "tokenizer_config.json"
        if cfg_path.is_file():
            import json

            mml = json.loads(cfg_path.read_text(encoding="utf-8")).get("model_max_length")
            if isinstance(mml, (int, float)) and 0 < mml < 1_000_000:
                value = int(mml)
    if limit and (not value or value > limit):
        if value:
            log(f"the declared input limit {value} exceeds max_position_embeddings {limit}: using {limit}")
        value = limit
    if not value or value < 2:
        raise ConversionError("cannot tell the model's input limit; pass --max-input-tokens")
    return int(value)


def _labels_and_head(opts: ExportOptions, config: Any, st: SentenceTransformerInfo | None) -> tuple[list[str], dict]:
    kind = opts.kind
    n = int(getattr(config, "num_labels", 0) or 0)
    labels = [str(config.id2label[i]) for i in range(n)] if kind != "embedding" else []
    if kind == "embedding":
        layers_total = int(config.num_hidden_layers)
        hidden = int(config.hidden_size)
        layers = {str(layers_total): "last_hidden_state"}
        from converters.onnx_export import hidden_state_output

        for k in opts.layers:
            if not 1 <= k <= layers_total:
                raise ConversionError(f"--layers {k}: the model has layers 1..{layers_total}")
            if k < layers_total:
                layers[str(k)] = hidden_state_output(k)
        width = (st.dimension if st else None) or hidden
        dims = sorted({width, *opts.dimensions}, reverse=True)
        if dims[0] != width:
            raise ConversionError(f"--dimensions {max(opts.dimensions)} exceeds the embedding's width {width}")
        if st and st.dense and len(layers) > 1:
            raise ConversionError("--layers: the Dense modules were trained on the last layer's pooled vector")
        pooling = opts.pooling or (st.pooling if st else None)
        normalize = opts.normalize if opts.normalize is not None else (st.normalize if st else True)
        if pooling is None:
            pooling = "mean"
            log("no sentence-transformers pooling declared: using mean pooling (override with --pooling)")
        head = {"pooling": pooling, "normalize": bool(normalize), "dimension": width, "dimensions": dims,
                "layers": dict(sorted(layers.items(), key=lambda kv: int(kv[0])))}
        if st and st.input_prompts:
            head["prompts"] = st.input_prompts
        if st and st.dense:
            head["dense"] = [{"activation": d.activation, "bias": d.bias is not None} for d in st.dense]
        return labels, head
    if kind == "rerank":
        if n != 1:
            raise ConversionError(f"a rerank model must have exactly one output logit, this one has {n}")
        # the one exit a cross-encoder reads, as rerank cards name it
        return [], {"output": "logits", "activation": "sigmoid", "layer": int(config.num_hidden_layers),
                    "dimension": int(config.hidden_size)}
    if kind == "sequence-classification":
        if n < 2:
            raise ConversionError(f"sequence-classification needs at least 2 labels, the model has {n}")
        return labels, {"output": "logits", "activation": "softmax"}
    if kind == "multi-label":
        thresholds = {label: 0.5 for label in labels}
        for label, t in (opts.thresholds or {}).items():
            if label not in thresholds:
                raise ConversionError(f"--thresholds: unknown label {label!r} (labels: {', '.join(labels)})")
            if not 0.0 <= t <= 1.0:
                raise ConversionError(f"--thresholds {label}={t}: a threshold lies in [0, 1]")
            thresholds[label] = float(t)
        return labels, {"output": "logits", "activation": "sigmoid", "thresholds": thresholds}
    bad = [label for label in labels if not _BIO.match(label)]
    if bad or "O" not in labels:
        raise ConversionError(f"token-classification labels must follow BIO (O, B-X, I-X); got {labels}")
    return labels, {"output": "logits", "scheme": "BIO"}


def _check_graph(path: Path, opset: int) -> tuple[list[str], list[str]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    versions = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    if versions.get("ai.onnx") != opset:
        raise ConversionError(f"the exported graph has opset {versions.get('ai.onnx')}, expected {opset}")
    inputs = [i.name for i in model.graph.input]
    for i in model.graph.input:
        dims = i.type.tensor_type.shape.dim
        if len(dims) < 2 or not (dims[0].dim_param and dims[1].dim_param):
            raise ConversionError(f"graph input {i.name} lost its dynamic batch/sequence axes")
    return inputs, [o.name for o in model.graph.output]


def _pad_id(tok: Any, config: Any) -> int:
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        for token in ("[PAD]", "<pad>"):
            pad = tok.token_to_id(token)
            if pad is not None:
                break
    return int(pad or 0)


def build_options(opts: ExportOptions) -> dict[str, Any]:
    """The converter options recorded in card.build.options (compared by `converters default`)."""
    return {"kind": opts.kind, "quantize": opts.quantize, "layers": sorted(set(opts.layers)),
            "dimensions": sorted(set(opts.dimensions), reverse=True), "thresholds": opts.thresholds or {},
            "pooling": opts.pooling, "normalize": opts.normalize, "max_input_tokens": opts.max_input_tokens,
            **({"int8_min_cosine": opts.int8_min_cosine} if opts.int8_min_cosine is not None else {}),
            **({"base": str(opts.base)} if opts.base is not None else {})}


@dataclass
class EncoderSource:
    """A loaded encoder source: what its graph, its checks and its card are made from."""

    src_dir: Path
    model: Any
    tokenizer: Any
    labels: list[str]
    head: dict[str, Any]
    max_tokens: int
    rows: list[Row]  # the sample items, tokenized within max_tokens
    pad_id: int
    stamp: str
    architecture: str
    name: str
    st: SentenceTransformerInfo | None = None
    #: a merged LoRA adapter: the card's ``lora`` member (adapter, base, merge check)
    lora: dict[str, Any] | None = None


@dataclass
class EncoderGraph:
    """The exported graph (with its external data file, if any) and its input and output names."""

    files: list[Path]
    inputs: list[str]
    outputs: list[str]

    @property
    def path(self) -> Path:
        return self.files[0]


def _source(src_dir: Path, hub_id: str | None, opts: ExportOptions) -> EncoderSource:
    """Load the model and its tokenizer, read its head and input limit, and stamp the source; a LoRA
    adapter directory is loaded over its base with the adapter merged (converters/encoder/adapter.py)."""
    from converters.encoder.adapter import is_adapter, load_adapter

    name = sanitize_name(opts.name or (hub_id.split("/")[-1] if hub_id else src_dir.name))
    if is_adapter(src_dir):
        loaded = load_adapter(src_dir, opts.kind, model_class(opts.kind), opts.base, opts.cache_dir)
        return _finish_source(src_dir, loaded.tokenizer_dir, loaded.model, None, opts, name,
                              stamp=loaded.stamp, lora=loaded.record)
    st = read_sentence_transformer(src_dir) if opts.kind == "embedding" else None
    model_dir = st.transformer_dir if st else src_dir
    if not (model_dir / "config.json").is_file():
        raise ConversionError(f"{model_dir}: no config.json (not a Hugging Face model directory)")
    model = _load_model(opts.kind, model_dir)
    # what else the package is made from: the Dense modules' weights and the prompts
    extra = {p.relative_to(src_dir).as_posix(): p for p in sorted(src_dir.glob("*_Dense/*")) if p.is_file()} \
        if st and st.dense else {}
    if st and st.prompts:
        extra["config_sentence_transformers.json"] = src_dir / "config_sentence_transformers.json"
    return _finish_source(src_dir, model_dir, model, st, opts, name,
                          stamp=source_stamp(src_dir, model_dir, extra), lora=None)


def _finish_source(src_dir: Path, model_dir: Path, model: Any, st: SentenceTransformerInfo | None,
                   opts: ExportOptions, name: str, stamp: str, lora: dict[str, Any] | None) -> EncoderSource:
    config = model.config
    if opts.quantize is not None and config.model_type in FP32_ONLY:
        raise ConversionError(f"--quantize: {FP32_ONLY[config.model_type]}")
    tok = package_tokenizer(model_dir)
    labels, head = _labels_and_head(opts, config, st)
    max_tokens = _max_input_tokens(opts, st, model_dir, config)
    items = encoder_verify.sample_items(opts.kind)
    check_tokenizer(model_dir, tok, items[:-1])
    architecture = type(model).__name__ if lora else (getattr(config, "architectures", None) or
                                                      [type(model).__name__])[0]
    return EncoderSource(
        src_dir=src_dir, model=model, tokenizer=tok, labels=labels, head=head, max_tokens=max_tokens,
        rows=encode_rows(tok, items, max_tokens), pad_id=_pad_id(tok, config), stamp=stamp,
        architecture=architecture, name=name, st=st, lora=lora)


def _graph(source: EncoderSource, opts: ExportOptions, work: Path) -> EncoderGraph:
    """Export ONNX with Optimum: the kind's task, with the asked-for earlier layers as outputs."""
    from converters import onnx_export

    extra = [k for k in opts.layers if k < int(getattr(source.model.config, "num_hidden_layers", 0))]
    path = onnx_export.export_onnx(source.model, opts.kind, work / "onnx", layers=sorted(set(extra)))
    inputs, outputs = _check_graph(path, onnx_export.OPSET)
    # past protobuf's 2 GB (Qwen3-Embedding-0.6B in fp32 is 2.4 GB): the weights in model.onnx.data
    return EncoderGraph(gather_graph(path, opts.external_data_above), inputs, outputs)


def _quantized(source: EncoderSource, opts: ExportOptions, session: Any, graph: Path, work: Path
               ) -> tuple[Path, Any, dict[str, Any], Any]:
    """The int8 variant of ``graph``: its file, session, agreement with fp32 and recipe."""
    from converters import quantize

    variant = str(opts.quantize)
    # encoders have calibration rows (the samples), so their exact int8 is smoothed
    recipe = quantize.CALIBRATED_RECIPE if variant == "int8" else None
    q_path = quantize.quantize_variant(variant, graph, work / quantize.variant_file(variant),
                                       recipe or quantize.DEFAULT_RECIPE, source.rows)
    q_session = create_session(q_path)
    if opts.kind == "embedding":
        # stated on real text: the corpus's sentences, not the generated samples
        corpus = encode_rows(source.tokenizer, quantize.real_sentences(), source.max_tokens)
        agreement = quantize.measure_corpus_agreement(source.head, session, q_session, corpus, source.pad_id,
                                                      quantize.REAL_SENTENCES_SOURCE)
    else:
        agreement = quantize.measure_agreement(opts.kind, source.head, source.labels, session, q_session,
                                               source.rows)
    if opts.int8_min_cosine is not None and "min_cosine" in agreement:
        agreement["floor"] = {"min_cosine": opts.int8_min_cosine,
                              "met": agreement["min_cosine"] >= opts.int8_min_cosine}
    return q_path, q_session, agreement, recipe


def export_model(src: str | Path, out: Path, opts: ExportOptions) -> ExportResult:
    """Export ``src`` as a package at ``out``; ConversionError (one line) when it cannot or must not."""
    _check_options(opts)
    with PackageBuild(out, "er-export-") as build:
        hub_id = str(src) if is_hub_id(str(src)) else None
        src_dir = resolve_source(str(src))
        if hub_id and not opts.source_name:
            opts = dataclasses.replace(opts, source_name=hub_id)
        with build.step("imports", "loading PyTorch, transformers and Optimum"):
            from transformers.utils import logging as hf_logging

            from converters import onnx_export, quantize
            hf_logging.set_verbosity_error()
        with build.step("load", f"loading {src_dir}"):
            source = _source(src_dir, hub_id, opts)
        with build.step("export", f"exporting ONNX (opset {onnx_export.OPSET}, task {onnx_export.TASKS[opts.kind]})"):
            graph = _graph(source, opts, build.work)
        with build.step("fold", "folding the graph's shape arithmetic into constants, checked bit-identical"):
            shipped, folding = fold_file(graph.path, source.rows, source.pad_id, build.work, opts.external_data_above)
        log(folding.summary())
        tolerance = encoder_verify.FP32_TOLERANCE
        with build.step("parity", "checking parity against PyTorch (batch 1 and 4, several lengths)"):
            session = create_session(shipped)
            parity = encoder_verify.check_parity(source.model, session, source.rows, source.pad_id, tolerance)
        log(f"parity fp32: max |onnx - torch| = {parity.max_abs_diff:.3g} (tolerance {tolerance:g}) "
            f"over {parity.cases} cases, lengths {parity.lengths}")
        vectors = None
        st = source.st
        if st is not None and st.pooling is not None and opts.pooling in (None, st.pooling) \
                and opts.normalize in (None, st.normalize):  # read as sentence-transformers reads it
            from converters.encoder.vectors import check_vectors

            with build.step("vectors", "checking vectors against sentence-transformers (prompts, dimensions)"):
                vectors = check_vectors(source.src_dir, session, source.tokenizer, source.head, st,
                                        source.max_tokens, source.pad_id)
            log(f"vectors: least cosine to sentence-transformers {vectors['min_cosine']} over {vectors['cases']} "
                f"(input types {vectors['input_types']}, dimensions {vectors['dimensions']})")

        golden_rows = encoder_verify.spread(source.rows, 3, max_len=encoder_verify.GOLDEN_MAX_TOKENS)
        variants: dict[str, dict[str, Any]] = {"fp32": {"file": "model.onnx", "dtype": "fp32"}}
        goldens: dict[str, GoldenCases] = {"fp32": encoder_verify.record_goldens(session, golden_rows)}
        files: dict[str, Path | bytes] = {"model.onnx": shipped,
                                          "tokenizer.json": source.tokenizer.to_str().encode("utf-8")}
        if len(graph.files) > 1:
            files[data_file(Path("model.onnx")).name] = graph.files[1]
        if source.st is not None and source.st.dense:
            from edge_runtime.packages.golden import npz_bytes

            files["head.npz"] = npz_bytes({f"dense.{i}.{part}": array for i, d in enumerate(source.st.dense)
                                           for part, array in (("weight", d.weight), ("bias", d.bias))
                                           if array is not None})
        if opts.quantize is not None:
            variant = opts.quantize
            with build.step("quantize", f"quantizing to {variant} ({quantize.QUANTIZATIONS[variant]} activation "
                                        "scales, per-channel int8 weights)"):
                q_path, q_session, agreement, recipe = _quantized(source, opts, session, graph.path, build.work)
            log(f"{variant} agreement with fp32: {agreement}")
            variants[variant] = quantize.variant_entry(variant, agreement, recipe)
            goldens[variant] = encoder_verify.record_goldens(q_session, golden_rows)
            files[quantize.variant_file(variant)] = q_path
        files.update(notice_files(src_dir, opts))
        card = _card(opts, source, graph, variants, parity, tolerance, folding)
        if vectors is not None:
            card["verification"]["vectors"] = vectors
        return build.write(card, files, goldens)


def _card(opts: ExportOptions, source: EncoderSource, graph: EncoderGraph, variants: dict[str, dict[str, Any]],
          parity: encoder_verify.ParityReport, tolerance: float, folding: Folding) -> dict[str, Any]:
    from converters.onnx_export import OPSET

    adapter = source.lora["adapter"]["name"] if source.lora else None
    source_name = opts.source_name or adapter or source.src_dir.name
    architecture = source.architecture
    merged = f", its LoRA merged into {source.lora['base']['name']}" if source.lora else ""
    return {
        **card_start(source.name, "encoder", opts.kind, identity_card(
            opts, source.src_dir, source_name=source_name, architecture=architecture, stamp=source.stamp,
            description=f"{architecture} {opts.kind} model exported from {source_name}{merged}"),
            labels=source.labels),
        "head": source.head,
        "limits": {"max_input_tokens": source.max_tokens},
        "graph": {"inputs": graph.inputs, "outputs": graph.outputs, "opset": OPSET},
        "variants": variants,
        "verification": {
            "reference": torch_reference(f"{type(source.model).__name__} fp32"),
            "max_abs_diff": rounded(parity.max_abs_diff),
            "tolerance": tolerance,
            "cases": parity.cases,
            "outputs": {k: rounded(v) for k, v in parity.outputs.items()},
            "lengths": parity.lengths,
            "batch_sizes": parity.batch_sizes,
            **({"shape_folding": folding.describe()} if folding.changed else {}),
        },
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": source.stamp, "options": build_options(opts)},
        **({"sentence_transformers": _prompts_record(source.st)} if source.st is not None and source.st.prompts
           else {}),
        **({"fp32_only": FP32_ONLY[source.model.config.model_type]}
           if source.model.config.model_type in FP32_ONLY else {}),
        **({"lora": source.lora} if source.lora is not None else {}),
    }


def _prompts_record(st: SentenceTransformerInfo) -> dict[str, Any]:
    """The card's ``sentence_transformers``: every prompt the source declares and how the server applies them."""
    return {"prompts": st.prompts, "default_prompt_name": st.default_prompt_name,
            "applied": "the request's input_type (query, document) selects its prompt, which leads the text; an "
                       "input without input_type reads none (the Router's own calls), as the upstream runtime"}
