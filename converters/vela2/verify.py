"""Verification of a Vela 2.0 export: the PyTorch reference readout, and every request's answers through
the server's pipeline (ONNX graph and numpy head) against it, logit by logit and answer by answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from converters.errors import ConversionError
from edge_runtime.families.vela2.answers import Calibration
from edge_runtime.families.vela2.layout import LayoutConfig, Tokens
from edge_runtime.families.vela2.marker import LN_EPS, NORM_EPS
from edge_runtime.families.vela2.pipeline import Readout, RequestResult, run_request

#: |onnx+numpy - torch| allowed on any option, set or span logit
LOGIT_TOLERANCE = 1e-5


#: answers' numbers (probabilities, scores, confidences) may differ by at most this much
ANSWER_TOLERANCE = 1e-5


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
    _fold_logits(got, ref, report)


def _fold_logits(got: RequestResult, ref: RequestResult, report: Vela2Parity) -> None:
    """Fold one request's option, set and span logit differences (and its rows' counts) into ``report``."""
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


@dataclass
class _AnswerAgreement:
    """Questions whose every discrete value (choice, selection, span, refusal) is the same, and the largest
    difference of their numbers (probabilities, scores, confidences)."""

    questions: int = 0
    agreeing: int = 0
    max_abs_dp: float = 0.0

    def fold(self, a: Any, b: Any) -> bool:
        """Whether ``a`` and ``b`` have the same structure and discrete values; numbers' |a - b| kept."""
        if isinstance(a, dict) and isinstance(b, dict):
            return list(a) == list(b) and all([self.fold(a[k], b[k]) for k in a])
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all([self.fold(x, y) for x, y in zip(a, b)])
        if isinstance(a, float) and isinstance(b, float):
            self.max_abs_dp = max(self.max_abs_dp, abs(a - b))
            return True
        return bool(a == b)


def run_requests(requests: Sequence[tuple[Any, dict[str, Any]]], readout: Readout, *, tokens: Tokens,
                 layout: LayoutConfig, calibration: Calibration) -> list[RequestResult]:
    """Every request read through the server's pipeline (layout, windows, numpy head, answers) with ``readout``."""
    return [run_request(state, questions, readout=readout, tokens=tokens, layout=layout, calibration=calibration)
            for state, questions in requests]


def int8_agreement(int8: Sequence[RequestResult], fp32: Sequence[RequestResult]) -> dict[str, Any]:
    """The exact int8's answers against fp32's on the same requests (see run_requests): the share of
    questions answered alike (every choice, selection and span the same), the largest |dp| of their
    numbers, and the largest logit differences by kind."""
    logits, answers = Vela2Parity(), _AnswerAgreement()
    for got, ref in zip(int8, fp32, strict=True):
        _fold_logits(got, ref, logits)
        mine, theirs = got.body.get("answers", {}), ref.body.get("answers", {})
        for qid in theirs:
            answers.questions += 1
            answers.agreeing += answers.fold(mine.get(qid), theirs[qid])
    return {"metric": "decision answers", "cases": len(fp32), "questions": answers.questions,
            "answer_agreement": round(answers.agreeing / max(answers.questions, 1), 6),
            "max_abs_dp": round(answers.max_abs_dp, 6),
            "max_abs_dlogit": {"option": round(logits.option, 6), "set": round(logits.set, 6),
                               "span": round(logits.span, 6)}}
