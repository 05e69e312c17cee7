"""`export`: a Hugging Face encoder directory -> a verified edge-runtime package.

Steps: resolve the source, load the PyTorch model, take its tokenizer (padding and truncation
removed), export ONNX with Optimum, check parity against PyTorch (refused above tolerance),
optionally quantize to int8 and measure agreement, record golden cases, write the package.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from converters import CONVERTER_VERSION
from converters.errors import ConversionError
from converters.package_writer import card_start
from converters.progress import Step, log
from converters.source import (
    SentenceTransformerInfo,
    is_hub_id,
    read_sentence_transformer,
    resolve_source,
    source_stamp,
)
from edge_runtime.families.registry import read_package

KINDS = ("embedding", "sequence-classification", "multi-label", "token-classification", "rerank")
QUANTIZE = ("int8", "int8-dynamic")  # int8: per-token, exact; int8-dynamic: approximate
_BIO = re.compile(r"^(O|[BI]-.+)$")
_LICENSE_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE", "NOTICE.txt", "NOTICE.md")


@dataclass(kw_only=True)
class PackageIdentity:
    """How any exported package is named, dated and credited; None means "read it from the source".

    Keyword-only, so that a kind's options keep their own positional fields first.
    """

    name: str | None = None
    description: str | None = None
    version: str = "1.0.0"
    release_date: str | None = None
    revision: str | None = None
    license: str | None = None
    source_name: str | None = None
    #: more files for the package (license notices, ...), by package path
    extra_files: dict[str, Path | bytes] = field(default_factory=dict)


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
    #: embedding int8: the least cosine to fp32 over the sample set for the variant to be recommended
    #: (recorded in the card with whether it was met); None records no floor
    int8_min_cosine: float | None = None


@dataclass
class ExportResult:
    """A written package and what the export measured."""

    path: Path
    digest: str
    card: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


def check_out(out: Path) -> None:
    """ConversionError unless ``out`` may be written (package_writer.check_replaceable): checked before
    any work, so that a wrong ``--out`` fails at once."""
    from converters.package_writer import check_replaceable

    try:
        check_replaceable(Path(out))
    except ValueError as e:
        raise ConversionError(str(e)) from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def sanitize_name(name: str) -> str:
    """A package name: lowercase ``[a-z0-9._-]``, other runs as one ``-``, at most 128 characters."""
    clean = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")
    return clean[:128] or "model"


def _readme_license(src: Path) -> str | None:
    """The license: field of a model card's YAML front matter, if any."""
    readme = src / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"^---\s*\n(.*?)\n---\s*\n", text, re.S)
    if not m:
        return None
    import yaml

    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return None
    lic = meta.get("license") if isinstance(meta, dict) else None
    return str(lic) if isinstance(lic, (str, int, float)) else None


def identity_card(opts: PackageIdentity, src_dir: Path, *, source_name: str, architecture: str, stamp: str,
                  description: str) -> dict[str, Any]:
    """The card's description, version, release_date, revision and source, defaults filled in.

    ``description`` is the kind's default text; the revision defaults to the source stamp's first
    12 characters, the release date to today (UTC), the license to the README's front matter.
    """
    return {
        "description": opts.description or description,
        "version": opts.version,
        "release_date": opts.release_date or dt.datetime.now(dt.UTC).date().isoformat(),
        "revision": opts.revision or stamp[:12],
        "source": {"name": source_name, "architecture": architecture,
                   "license": opts.license or _readme_license(src_dir) or "unknown"},
    }


def notice_files(src_dir: Path, opts: PackageIdentity) -> dict[str, Path | bytes]:
    """The source's license and notice files under ``LICENSES/``, then the options' extra files."""
    files: dict[str, Path | bytes] = {f"LICENSES/{name}": src_dir / name
                                      for name in _LICENSE_FILES if (src_dir / name).is_file()}
    files.update(opts.extra_files)
    return files


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


def _load_model(kind: str, model_dir: Path) -> Any:
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

    cls = {"embedding": AutoModel, "token-classification": AutoModelForTokenClassification}.get(
        kind, AutoModelForSequenceClassification)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls.from_pretrained(model_dir, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - any loading failure is reported the same way
        raise ConversionError(f"{model_dir}: cannot load as {cls.__name__}: {_first_line(e)}") from None
    return model.eval()


def package_tokenizer(model_dir: Path) -> Any:
    """The source tokenizer as a `tokenizers.Tokenizer`, with padding and truncation removed.

    The server pads and truncates itself; a baked-in Fixed padding (MiniLM's 128) would pad
    every row and cost several times the compute.
    """
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if path.is_file():
        tok = Tokenizer.from_file(str(path))
    else:
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
        except Exception as e:  # noqa: BLE001
            raise ConversionError(
                f"{model_dir}: no tokenizer.json and no loadable tokenizer: {_first_line(e)}"
            ) from None
        if not hf.is_fast:
            raise ConversionError(f"{model_dir}: only a slow tokenizer is available; a tokenizer.json is needed")
        tok = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    return tok


def _check_tokenizer(model_dir: Path, tok: Any, items: Sequence[Any]) -> None:
    """The package tokenizer must give transformers' ids on the samples (normaliser settings included)."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
    except Exception as e:  # noqa: BLE001
        log(f"tokenizer parity skipped: transformers cannot load the tokenizer ({_first_line(e)})")
        return
    for i, item in enumerate(items):
        pair = isinstance(item, tuple)
        ref = hf(item[0], item[1]) if pair else hf(item)
        got = tok.encode(item[0], item[1]) if pair else tok.encode(item)
        if list(ref["input_ids"]) != got.ids:
            raise ConversionError(f"tokenizer.json disagrees with transformers' tokenizer on sample {i}")


def _max_input_tokens(opts: ExportOptions, st: SentenceTransformerInfo | None, model_dir: Path, config: Any) -> int:
    limit = getattr(config, "max_position_embeddings", None)
    if opts.max_input_tokens is not None:
        value = opts.max_input_tokens
    elif st is not None and st.max_seq_length:
        value = st.max_seq_length
    else:
        value = None
        cfg_path = model_dir / "tokenizer_config.json"
        if cfg_path.is_file():
            import json

            mml = json.loads(cfg_path.read_text(encoding="utf-8")).get("model_max_length")
            if isinstance(mml, (int, float)) and 0 < mml < 1_000_000:
                value = int(mml)
        value = value or limit
    if not value or value < 2:
        raise ConversionError("cannot tell the model's input limit; pass --max-input-tokens")
    if limit and value > limit:
        raise ConversionError(f"max_input_tokens {value} exceeds the model's max_position_embeddings {limit}")
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
        dims = sorted({hidden, *opts.dimensions}, reverse=True)
        if dims[0] != hidden:
            raise ConversionError(f"--dimensions {max(opts.dimensions)} exceeds the hidden size {hidden}")
        pooling = opts.pooling or (st.pooling if st else None)
        normalize = opts.normalize if opts.normalize is not None else (st.normalize if st else True)
        if pooling is None:
            pooling = "mean"
            log("no sentence-transformers pooling declared: using mean pooling (override with --pooling)")
        return labels, {"pooling": pooling, "normalize": bool(normalize), "dimension": hidden,
                        "dimensions": dims, "layers": dict(sorted(layers.items(), key=lambda kv: int(kv[0])))}
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
            **({"int8_min_cosine": opts.int8_min_cosine} if opts.int8_min_cosine is not None else {})}


def _card(opts: ExportOptions, *, name: str, src_dir: Path, architecture: str, labels: list[str],
          head: dict[str, Any], max_tokens: int, graph: tuple[list[str], list[str], int],
          variants: dict[str, dict[str, Any]], parity: Any, reference: str, tolerance: float,
          stamp: str) -> dict[str, Any]:
    source_name = opts.source_name or src_dir.name
    inputs, outputs, opset = graph
    return {
        **card_start(name, "encoder", opts.kind, identity_card(
            opts, src_dir, source_name=source_name, architecture=architecture, stamp=stamp,
            description=f"{architecture} {opts.kind} model exported from {source_name}"), labels=labels),
        "head": head,
        "limits": {"max_input_tokens": max_tokens},
        "graph": {"inputs": inputs, "outputs": outputs, "opset": opset},
        "variants": variants,
        "verification": {
            "reference": reference,
            "max_abs_diff": float(f"{parity.max_abs_diff:.3g}"),
            "tolerance": tolerance,
            "cases": parity.cases,
            "outputs": {k: float(f"{v:.3g}") for k, v in parity.outputs.items()},
            "lengths": parity.lengths,
            "batch_sizes": parity.batch_sizes,
        },
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": stamp, "options": build_options(opts)},
    }


def export_model(src: str | Path, out: Path, opts: ExportOptions) -> ExportResult:
    """Export ``src`` as a package at ``out``; ConversionError (one line) when it cannot or must not."""
    _check_options(opts)
    check_out(Path(out))
    timings: dict[str, float] = {}
    hub_id = str(src) if is_hub_id(str(src)) else None
    src_dir = resolve_source(str(src))
    if hub_id and not opts.source_name:
        opts = dataclasses.replace(opts, source_name=hub_id)
    st = read_sentence_transformer(src_dir) if opts.kind == "embedding" else None
    model_dir = st.transformer_dir if st else src_dir
    if not (model_dir / "config.json").is_file():
        raise ConversionError(f"{model_dir}: no config.json (not a Hugging Face model directory)")

    with Step("loading PyTorch, transformers and Optimum") as s:
        import torch
        import transformers
        from transformers.utils import logging as hf_logging

        from converters import onnx_export, quantize, verify
        hf_logging.set_verbosity_error()
    timings["imports"] = s.seconds

    with Step(f"loading {model_dir}") as s:
        model = _load_model(opts.kind, model_dir)
        config = model.config
        tok = package_tokenizer(model_dir)
        labels, head = _labels_and_head(opts, config, st)
        max_tokens = _max_input_tokens(opts, st, model_dir, config)
        items = verify.sample_items(opts.kind)
        _check_tokenizer(model_dir, tok, items[:-1])
        stamp = source_stamp(src_dir, model_dir)
    timings["load"] = s.seconds
    architecture = (getattr(config, "architectures", None) or [type(model).__name__])[0]
    name = sanitize_name(opts.name or (hub_id.split("/")[-1] if hub_id else src_dir.name))

    with tempfile.TemporaryDirectory(prefix="er-export-") as tmp:
        work = Path(tmp)
        with Step(f"exporting ONNX (opset {onnx_export.OPSET}, task {onnx_export.TASKS[opts.kind]})") as s:
            extra = [k for k in opts.layers if k < int(getattr(config, "num_hidden_layers", 0))]
            graph_path = onnx_export.export_onnx(model, opts.kind, work / "onnx", layers=sorted(set(extra)))
            inputs, outputs = _check_graph(graph_path, onnx_export.OPSET)
        timings["export"] = s.seconds

        rows = verify.encode_rows(tok, items, max_tokens)
        pad_id = _pad_id(tok, config)
        with Step("checking parity against PyTorch (batch 1 and 4, several lengths)") as s:
            session = verify.create_session(graph_path)
            parity = verify.check_parity(model, session, rows, pad_id, verify.FP32_TOLERANCE)
        timings["parity"] = s.seconds
        log(f"parity fp32: max |onnx - torch| = {parity.max_abs_diff:.3g} (tolerance {verify.FP32_TOLERANCE:g}) "
            f"over {parity.cases} cases, lengths {parity.lengths}")

        golden_rows = verify.spread(rows, 3, max_len=verify.GOLDEN_MAX_TOKENS)
        variants: dict[str, dict[str, Any]] = {"fp32": {"file": "model.onnx", "dtype": "fp32"}}
        goldens = {"fp32": verify.record_goldens(session, golden_rows)}
        files: dict[str, Path | bytes] = {"model.onnx": graph_path, "tokenizer.json": tok.to_str().encode("utf-8")}

        if opts.quantize is not None:
            variant = opts.quantize
            how = quantize.QUANTIZATIONS[variant]
            # encoders have calibration rows (the samples), so their exact int8 is smoothed
            recipe = quantize.CALIBRATED_RECIPE if variant == "int8" else None
            with Step(f"quantizing to {variant} ({how} activation scales, per-channel int8 weights)") as s:
                q_path = quantize.quantize_variant(variant, graph_path, work / quantize.variant_file(variant),
                                                   recipe or quantize.DEFAULT_RECIPE, rows)
                q_session = verify.create_session(q_path)
                if opts.kind == "embedding":
                    # stated on real text: the corpus's sentences, not the generated samples
                    corpus = verify.encode_rows(tok, quantize.real_sentences(), max_tokens)
                    agreement = quantize.measure_corpus_agreement(head, session, q_session, corpus, pad_id,
                                                                  quantize.REAL_SENTENCES_SOURCE)
                else:
                    agreement = quantize.measure_agreement(opts.kind, head, labels, session, q_session, rows)
                if opts.int8_min_cosine is not None and "min_cosine" in agreement:
                    agreement["floor"] = {"min_cosine": opts.int8_min_cosine,
                                          "met": agreement["min_cosine"] >= opts.int8_min_cosine}
            timings["quantize"] = s.seconds
            log(f"{variant} agreement with fp32: {agreement}")
            variants[variant] = quantize.variant_entry(variant, agreement, recipe)
            goldens[variant] = verify.record_goldens(q_session, golden_rows)
            files[quantize.variant_file(variant)] = q_path

        files.update(notice_files(src_dir, opts))

        card = _card(opts, name=name, src_dir=src_dir, architecture=architecture, labels=labels, head=head,
                     max_tokens=max_tokens, graph=(inputs, outputs, onnx_export.OPSET), variants=variants,
                     parity=parity, reference=f"PyTorch {torch.__version__.split('+')[0]} / transformers "
                                           f"{transformers.__version__} {architecture} fp32",
                     tolerance=verify.FP32_TOLERANCE, stamp=stamp)
        with Step(f"writing package {out}") as s:
            from converters.package_writer import write_package

            digest = write_package(Path(out), card, files, goldens)
        timings["write"] = s.seconds
    log(f"package {name} written to {out} (digest {digest[:16]}...)")
    written = read_package(Path(out)).card.raw
    return ExportResult(path=Path(out), digest=digest, card=written, timings=timings)
