"""`export --kind vela2`: an upstream Vela 2.0 (0.3B encoder) package -> a verified edge-runtime package.

Steps: read and verify the source (config.json, calibration.json, tokenizer.json,
model.safetensors, SHA256SUMS when present; vela2_source.py), load the backbone into Transformers'
``ModernBertModel`` (SDPA; global and local attention, YaRN or default RoPE as HF computes them),
export it with Optimum (feature-extraction: ``last_hidden_state``, final-normed), and keep the
marker head as numpy data (head.npz) and the layout and calibration as JSON
(decision_config.json). The tokenizer is written with the 8 marker tokens removed from its added
tokens: markers are inserted by id only, so no user text can produce one.

Parity: the server's own pipeline (``edge_runtime.families.vela2.pipeline``: layout, windows,
sorted right-padded batches, numpy head, answers) runs every check request twice, once reading
the ONNX graph with the numpy head, once reading PyTorch (each sequence alone, unpadded) with the
§2.7 head math written here in torch. Option, set and span logits must agree within 1e-5 and the
answers must agree (same choices, selections and spans; numbers within 1e-5), over the §2.12
golden request and generated requests that cover every question type, presets, roles, windows and
truncation. An export outside tolerance is refused.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.errors import ConversionError
from converters.export import ExportResult, PackageIdentity, identity_card, notice_files, sanitize_name
from converters.package_writer import card_start
from converters.progress import Step, log
from converters.vela2_requests import generated_requests, golden_request
from converters.vela2_source import Vela2Source, load_tensors, read_source, write_source_fixture
from edge_runtime.families.vela2.answers import Calibration
from edge_runtime.families.vela2.layout import LayoutConfig, Tokens, pad_batch, strip_markers
from edge_runtime.families.vela2.marker import LN_EPS, NORM_EPS, MarkerHead
from edge_runtime.families.vela2.pipeline import SCAN_INPUTS_CPU, Readout, RequestResult, graph_readout, run_request
from edge_runtime.families.vela2.state import PRESETS
from edge_runtime.packages.golden import npz_bytes
from edge_runtime.packages.manifest import compute_digest

KIND = "vela2"
CONFIG_FORMAT = "vela2-package/1"
QUESTION_TYPES = ("choice", "noul", "score", "set", "span")
#: |onnx+numpy - torch| allowed on any option, set or span logit
LOGIT_TOLERANCE = 1e-5
#: answers' numbers (probabilities, scores, confidences) may differ by at most this much
ANSWER_TOLERANCE = 1e-5
DEFAULT_CHECK_REQUESTS = 50
GOLDEN_SEQUENCES = 3


@dataclass
class Vela2Options(PackageIdentity):
    """What `export --kind vela2` may be told; the rest comes from the source package."""

    check_requests: int = DEFAULT_CHECK_REQUESTS
    seed: int = 0
    #: the parity check's bound on logits and on answers' numbers; looser only for benchmark subjects
    #: of random weights (the card records the bound the package was checked under)
    tolerance: float = LOGIT_TOLERANCE


# ---- PyTorch reference --------------------------------------------------------------------


def load_backbone(source: Vela2Source, backbone: dict[str, Any]) -> Any:
    """HF ``ModernBertModel`` (SDPA, fp32, eval) with the source's backbone, every tensor accounted for."""
    from transformers import ModernBertConfig, ModernBertModel

    from converters.torch_models import load_backbone

    return load_backbone(ModernBertModel, ModernBertConfig, dict(source.config["encoder_config"]), backbone,
                         "model.safetensors (encoder_config)")


def torch_readout(model: Any, head: dict[str, np.ndarray], readout: str, threads: int = 1) -> Readout:
    """The PyTorch reference: each sequence alone through ModernBertModel, then the §2.7 head in torch.

    ``threads``: torch's intra-op threads while a batch is read. One suits the tiny fixtures the
    parity check runs (their matrices are too small to split); a benchmark of a real-sized
    backbone passes the thread count every contestant gets.
    """
    import torch
    import torch.nn.functional as F

    t = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in head.items()}
    hidden_size = t["norm.weight"].shape[0]

    def ln(x: Any) -> Any:
        return F.layer_norm(x, (hidden_size,), t["norm.weight"], t["norm.bias"], eps=LN_EPS)

    def lin(name: str, x: Any) -> Any:
        return F.linear(x, t[f"{name}.weight"], t[f"{name}.bias"])

    def run(feeds: dict[str, np.ndarray], idx: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        b, width = ids.shape
        h = torch.zeros((b, width, hidden_size), dtype=torch.float32)
        before = torch.get_num_threads()
        # one thread by default: fixture matrices are tiny, and on a shared CPU more threads are 10-40x slower
        torch.set_num_threads(threads)
        try:
            return _head(h, ids, mask, idx)
        finally:
            torch.set_num_threads(before)

    def _head(h: Any, ids: np.ndarray, mask: np.ndarray, idx: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        b = ids.shape[0]
        with torch.no_grad():
            for r in range(b):
                n = int(mask[r].sum())
                out = model(input_ids=torch.from_numpy(ids[r: r + 1, :n]),
                            attention_mask=torch.ones((1, n), dtype=torch.long)).last_hidden_state
                h[r, :n] = out[0]
            q = torch.from_numpy(idx["q_index"])
            o = torch.from_numpy(idx["opt_index"])
            u = torch.from_numpy(idx["unit_index"])
            e = torch.from_numpy(idx["ent_index"])
            marker = h[o[:, 0], o[:, 1]]
            owner = o[:, 2]
            logits = torch.zeros(o.shape[0])
            if readout in ("cosine", "both"):
                pooled = torch.stack([h[int(r), int(a): int(z)].mean(0) for r, _, a, z in q.tolist()])
                part = F.normalize(lin("w_p", ln(pooled)), dim=-1, eps=NORM_EPS)
                question = lin("w_q", ln(h[q[:, 0], q[:, 1]]))
                option = F.normalize(lin("w_o", ln(marker)) + question[owner], dim=-1, eps=NORM_EPS)
                logits = logits + (option * part[owner]).sum(-1) / t["log_tau"].exp()
            if readout in ("mlp", "both"):
                z = F.relu(F.linear(marker, t["cls_mlp.0.weight"], t["cls_mlp.0.bias"]))
                logits = logits + F.linear(z, t["cls_mlp.3.weight"], t["cls_mlp.3.bias"]).squeeze(-1)
            words = F.normalize(lin("w_t", ln(h[u[:, 0], u[:, 1]])), dim=-1, eps=NORM_EPS)
            labels = F.normalize(lin("w_e", ln(h[e[:, 0], e[:, 1]])), dim=-1, eps=NORM_EPS)
            span = (words @ labels.T) / t["log_tau_span"].exp()
        return logits.numpy(), span.numpy()

    return run


def onnx_hidden(session: Any) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """feeds -> last_hidden_state from an ONNX Runtime session of the exported backbone."""
    names = [i.name for i in session.get_inputs()]

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return session.run(["last_hidden_state"], {n: feeds[n] for n in names})[0]

    return run


# ---- parity -------------------------------------------------------------------------------


@dataclass
class Vela2Parity:
    """Largest differences between the package path and the PyTorch reference."""

    option: float = 0.0
    set: float = 0.0
    span: float = 0.0
    requests: int = 0
    sequences: int = 0
    windowed_rows: int = 0
    truncated_rows: int = 0
    question_types: dict[str, int] = field(default_factory=dict)

    @property
    def worst(self) -> float:
        return max(self.option, self.set, self.span)


def _compare_answers(a: Any, b: Any, where: str, tolerance: float = ANSWER_TOLERANCE) -> None:
    """Same structure and discrete values; numbers within ``tolerance``."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            raise ConversionError(f"parity: answers differ at {where}: keys {list(a)} vs {list(b)}")
        for k in a:
            _compare_answers(a[k], b[k], f"{where}.{k}", tolerance)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            raise ConversionError(f"parity: answers differ at {where}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b)):
            _compare_answers(x, y, f"{where}[{i}]", tolerance)
    elif isinstance(a, float) and isinstance(b, float):
        if not abs(a - b) <= tolerance:
            raise ConversionError(f"parity: answers differ at {where}: {a!r} vs {b!r}")
    elif a != b:
        raise ConversionError(f"parity: answers differ at {where}: {a!r} vs {b!r}")


def compare(got: RequestResult, ref: RequestResult, report: Vela2Parity, where: str,
            tolerance: float = ANSWER_TOLERANCE) -> None:
    """Fold one request's logit differences into ``report``; ConversionError when answers differ."""
    _compare_answers(got.body, ref.body, where, tolerance)
    for row, a, b, seqs in zip(got.rows, got.raws, ref.raws, got.sequences):
        if a is None or b is None:
            continue
        report.sequences += len(seqs)
        report.windowed_rows += 1 if len(seqs) > 1 else 0
        budget = seqs[0].budget
        report.truncated_rows += 1 if budget and (budget.shrink_cut or budget.protected_cut) else 0
        for q in row.questions:
            report.question_types[q.kind] = report.question_types.get(q.kind, 0) + 1
            if q.type == "span":
                assert a.span is not None and b.span is not None
                if a.span.logits.size:
                    report.span = max(report.span, float(np.max(np.abs(a.span.logits - b.span.logits))))
                continue
            d = float(np.max(np.abs(a.logits[q.id].astype(np.float64) - b.logits[q.id])))
            if q.type == "set":
                report.set = max(report.set, d)
            else:
                report.option = max(report.option, d)
    report.requests += 1


def check_parity(requests: Sequence[tuple[Any, dict[str, Any]]], *, tokens: Tokens, layout: LayoutConfig,
                 calibration: Calibration, package: Readout, reference: Readout,
                 tolerance: float = LOGIT_TOLERANCE) -> Vela2Parity:
    """Run every request through both readouts; ConversionError beyond ``tolerance`` (logits and answers)."""
    report = Vela2Parity()
    for i, (state, questions) in enumerate(requests):
        got = run_request(state, questions, readout=package, tokens=tokens, layout=layout, calibration=calibration)
        ref = run_request(state, questions, readout=reference, tokens=tokens, layout=layout, calibration=calibration)
        compare(got, ref, report, f"request {i}", tolerance)
    if not report.worst <= tolerance:
        raise ConversionError(f"parity check failed: max |package - torch| logit = {report.worst:.3g} "
                              f"(option {report.option:.3g}, set {report.set:.3g}, span {report.span:.3g}) "
                              f"exceeds {tolerance:g}; no package written")
    return report


# ---- export -------------------------------------------------------------------------------


def package_config(source: Vela2Source) -> dict[str, Any]:
    """decision_config.json of a vela2 package: layout, head mode and calibration, by value."""
    c = source.config
    return {
        "format": CONFIG_FORMAT,
        "layout": {k: c[k] for k in ("marker_ids", "bos_token_id", "eos_token_id", "pad_token_id", "max_length",
                                     "window_overlap")},
        "readout": c["readout"],
        "proj_dim": int(c["proj_dim"]),
        "hidden_size": int(c["encoder_config"]["hidden_size"]),
        "calibration": source.calibration,
        "source": {"identity": source.identity, "files_sha256": dict(sorted(source.sha256.items())),
                   "model_name": c.get("model_name")},
    }


def _goldens(session: Any, seqs: Sequence[Any]) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    cases = []
    for s in seqs:
        feeds = pad_batch([s], 0)
        cases.append((feeds, {"last_hidden_state": onnx_hidden(session)(feeds)}))
    return cases


def export_vela2(src: str | Path, out: Path, opts: Vela2Options) -> ExportResult:
    """Convert the upstream package at ``src`` into an edge-runtime package at ``out``."""
    from converters.package_writer import check_replaceable

    try:
        check_replaceable(Path(out))
    except ValueError as e:
        raise ConversionError(str(e)) from None
    timings: dict[str, float] = {}
    src_dir = Path(src)
    with Step(f"reading and verifying {src_dir}") as s:
        source = read_source(src_dir)
    timings["read"] = s.seconds
    with Step("loading PyTorch, transformers and Optimum") as s:
        import torch
        import transformers
        from transformers.utils import logging as hf_logging

        from converters import onnx_export, verify
        hf_logging.set_verbosity_error()
    timings["imports"] = s.seconds
    with Step("loading the backbone into ModernBertModel") as s:
        backbone, head_arrays = load_tensors(source)
        model = load_backbone(source, backbone)
        try:
            head = MarkerHead.from_arrays(head_arrays, source.config["readout"])
            layout = LayoutConfig.from_config(source.config)
        except ValueError as e:
            raise ConversionError(f"model.safetensors: {e}") from None
        from tokenizers import Tokenizer

        stripped = strip_markers(source.tokenizer_json)
        tok = Tokenizer.from_str(json.dumps(stripped))
        tokens = Tokens(tok)
        calibration = Calibration(source.calibration)
        leaked = [m for m in layout.marker_ids if set(tokens.ids(m)) & set(layout.marker_ids.values())]
        if leaked:
            raise ConversionError(f"tokenizer.json still produces marker ids for {leaked} after stripping")
    timings["load"] = s.seconds
    name = sanitize_name(opts.name or source.config.get("model_name") or src_dir.name)
    stamp = compute_digest(source.sha256)

    with tempfile.TemporaryDirectory(prefix="er-vela2-") as tmp:
        work = Path(tmp)
        with Step(f"exporting the ModernBERT backbone to ONNX (opset {onnx_export.OPSET})") as s:
            graph = onnx_export.export_onnx(model, "embedding", work / "onnx")
            import onnx

            g = onnx.load(str(graph), load_external_data=False)
            inputs, outputs = [i.name for i in g.graph.input], [o.name for o in g.graph.output]
            if "last_hidden_state" not in outputs or inputs[:2] != ["input_ids", "attention_mask"]:
                raise ConversionError(f"unexpected graph signature: inputs {inputs}, outputs {outputs}")
        timings["export"] = s.seconds
        session = verify.create_session(graph)
        # long parts of about 3.5 characters per token of max_length: windows and cuts get exercised
        requests = [golden_request(), *generated_requests(opts.check_requests, seed=opts.seed,
                                                          long_chars=int(layout.max_length * 3.5))]
        with Step(f"checking parity against PyTorch on {len(requests)} requests") as s:
            parity = check_parity(requests, tokens=tokens, layout=layout, calibration=calibration,
                                  package=graph_readout(onnx_hidden(session), head),
                                  reference=torch_readout(model, head_arrays, source.config["readout"]),
                                  tolerance=opts.tolerance)
        timings["parity"] = s.seconds
        log(f"parity: max |package - torch| option {parity.option:.3g}, set {parity.set:.3g}, span "
            f"{parity.span:.3g} over {parity.requests} requests ({parity.sequences} sequences, "
            f"{parity.windowed_rows} windowed rows, {parity.truncated_rows} truncated rows)")
        state, questions = golden_request()
        golden_seqs = [s for seqs in run_request(
            state, questions, tokens=tokens, layout=layout, calibration=calibration,
            readout=graph_readout(onnx_hidden(session), head)).sequences for s in seqs][:GOLDEN_SEQUENCES]
        files: dict[str, Path | bytes] = {
            "model.onnx": graph,
            "tokenizer.json": json.dumps(stripped, ensure_ascii=False).encode("utf-8"),
            "head.npz": npz_bytes({k: np.asarray(v, dtype=np.float32) for k, v in head_arrays.items()}),
            "decision_config.json": (json.dumps(package_config(source), sort_keys=True, indent=2,
                                                ensure_ascii=False) + "\n").encode("utf-8"),
        }
        files.update(notice_files(src_dir, opts))
        architecture = "Vela2Model (ModernBERT + marker head)"
        card = {
            **card_start(name, KIND, KIND, identity_card(
                opts, src_dir, source_name=opts.source_name or source.config.get("model_name") or src_dir.name,
                architecture=architecture, stamp=stamp,
                description=f"Vela 2.0 encoder decision model converted from {src_dir.name}")),
            "head": {"output": "last_hidden_state", "readout": "marker", "mode": source.config["readout"],
                     "weights": "head.npz", "proj_dim": int(source.config["proj_dim"]),
                     "hidden_size": head.hidden},
            # the scan budget on CPU: four model inputs (docs/reference/upstream-formats.md §2.4)
            "limits": {"max_input_tokens": layout.max_length, "max_scan_tokens": SCAN_INPUTS_CPU * layout.max_length},
            "graph": {"inputs": inputs, "outputs": outputs, "opset": onnx_export.OPSET},
            "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32"}},
            "verification": {
                "reference": (f"PyTorch {torch.__version__.split('+')[0]} / transformers {transformers.__version__} "
                              f"ModernBertModel (sdpa) + marker head in torch, each sequence alone"),
                "max_abs_diff": float(f"{parity.worst:.3g}"), "tolerance": opts.tolerance,
                "cases": parity.requests,
                "outputs": {"option_logits": float(f"{parity.option:.3g}"), "set_logits": float(f"{parity.set:.3g}"),
                            "span_logits": float(f"{parity.span:.3g}")},
                "sequences": parity.sequences, "windowed_rows": parity.windowed_rows,
                "truncated_rows": parity.truncated_rows,
            },
            "build": {"converter_version": CONVERTER_VERSION, "source_stamp": stamp,
                      "options": {"kind": KIND, "check_requests": opts.check_requests, "seed": opts.seed}},
            "question_types": list(QUESTION_TYPES),
            "presets": [p for p in PRESETS if isinstance(source.calibration.get(f"{p}_schema"), dict)],
        }
        with Step(f"writing package {out}") as s:
            from converters.package_writer import write_package

            digest = write_package(Path(out), card, files, {"fp32": _goldens(session, golden_seqs)})
        timings["write"] = s.seconds
    from edge_runtime.families.registry import read_package

    log(f"package {name} written to {out} (digest {digest[:16]}...)")
    return ExportResult(path=Path(out), digest=digest, card=read_package(Path(out)).card.raw, timings=timings)


# ---- fixtures -----------------------------------------------------------------------------

FIXTURE_RELEASE_DATE = "2025-01-01"


def build_vela2_fixture_result(out: Path, seed: int = 0, check_requests: int = DEFAULT_CHECK_REQUESTS,
                               **source_options: Any) -> ExportResult:
    """A converted vela2 fixture: the upstream-format fixture written to a temp dir, then exported."""
    with tempfile.TemporaryDirectory(prefix="er-vela2-src-") as tmp:
        src = write_source_fixture(Path(tmp) / "vela2-tiny", seed=seed, **source_options)
        opts = Vela2Options(name="fixture-vela2", description=f"Tiny random-weight Vela 2.0 fixture (seed {seed}); "
                            "for tests, not a real model", version="0.0.1", release_date=FIXTURE_RELEASE_DATE,
                            license="Apache-2.0", source_name=f"edge-runtime fixture vela2-tiny (seed {seed})",
                            check_requests=check_requests, seed=seed)
        return export_vela2(src, Path(out), opts)
