"""An in-process contestant in its own process: `python -m bench.contestant KIND --threads N ...`.

KIND is `sentence-transformers` (PyTorch), `optimum` (ORTModelForFeatureExtraction on the package's
model.onnx) or `onnxruntime` (a bare ONNX Runtime session on --onnx with the package's tokenizer.json,
mean pooling in numpy: fp32 ONNX Runtime in-process, nothing between the caller and the graph).
It prints one JSON line when loaded, then answers one JSON line per command line on stdin:

    {"op": "embed", "texts": [...]}            -> {"embeddings": [[float]]}   (L2-normalised, fp32)
    {"op": "time", "texts": [...], "n": 20}    -> {"seconds": [float]}        (n timed calls, in-process)
    {"op": "quit"}                             -> exits

Timing happens here, around the library call, so the pipe costs nothing. This module imports torch:
never import it into the harness's own process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.harness.stats import timed

MAX_SEQ_LENGTH = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2, and the package's limit


def _pin_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)


def load_sentence_transformers(source: Path, threads: int, device: str = "cpu") -> Callable[[list[str]], Any]:
    """sentence-transformers on PyTorch, as its documentation uses it: encode(..., normalize), on
    ``device`` (encode returns numpy, so a CUDA call is timed to its last kernel)."""
    _pin_threads(threads)
    import torch
    from sentence_transformers import SentenceTransformer

    if device == "cuda":  # full fp32 matmuls, as our server's CUDA provider runs them (use_tf32 0)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = SentenceTransformer(str(source), device=device)
    model.max_seq_length = MAX_SEQ_LENGTH

    def embed(texts: list[str]) -> Any:
        return model.encode(texts, batch_size=len(texts), convert_to_numpy=True,
                            normalize_embeddings=True, show_progress_bar=False)

    return embed


def load_optimum(source: Path, onnx_file: Path, threads: int, workdir: Path) -> Callable[[list[str]], Any]:
    """Optimum's ORTModelForFeatureExtraction on the package's graph, mean pooling and L2 in torch."""
    _pin_threads(threads)
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForFeatureExtraction
    from transformers import AutoTokenizer

    # Optimum wants config.json beside model.onnx; link the package's graph next to the source's config.
    model_dir = workdir / "optimum-model"
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "config.json", model_dir / "config.json")
    link = model_dir / "model.onnx"
    if not link.exists():
        link.symlink_to(onnx_file.resolve())
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    model = ORTModelForFeatureExtraction.from_pretrained(
        model_dir, file_name="model.onnx", provider="CPUExecutionProvider", session_options=options,
        local_files_only=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(source))

    def embed(texts: list[str]) -> Any:
        with torch.inference_mode():
            enc = tokenizer(texts, padding=True, truncation=True, max_length=MAX_SEQ_LENGTH, return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()

    return embed


def load_onnxruntime(onnx_file: Path, threads: int,
                     thread_plan: Sequence[tuple[int, int]] = ()) -> Callable[[list[str]], Any]:
    """ONNX Runtime alone: the package's tokenizer (right padding), one session run, numpy pooling.

    The same pinned settings as the server (ORT_ENABLE_ALL, sequential, one inter-op thread), so the
    gap to our HTTP numbers is what the server adds. ``thread_plan`` ((most tokens, threads) pairs, the
    plan a server measured and reports in /v1/models): a session per count, each forward at its size's
    count as the server runs it; without it, one session at ``threads``.
    """
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from edge_runtime.engine.session import planned_threads  # the server's rule for which count serves a size

    def session_at(n: int) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = n
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(str(onnx_file), sess_options=options, providers=["CPUExecutionProvider"])

    sessions = {n: session_at(n) for n in {threads, *(t for _, t in thread_plan)}}

    def session_for(tokens: int) -> Any:
        return sessions[planned_threads(thread_plan, tokens, threads)]

    names = [i.name for i in sessions[threads].get_inputs()]
    tokenizer = Tokenizer.from_file(str(onnx_file.parent / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_SEQ_LENGTH)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    def embed(texts: list[str]) -> Any:
        encs = tokenizer.encode_batch(texts)
        feeds = {"input_ids": np.array([e.ids for e in encs], dtype=np.int64),
                 "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64),
                 "token_type_ids": np.array([e.type_ids for e in encs], dtype=np.int64)}
        session = session_for(feeds["input_ids"].size)
        hidden = session.run(["last_hidden_state"], {n: feeds[n] for n in names})[0]
        mask = feeds["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return embed


def _thread_plan(text: str) -> tuple[tuple[int, int], ...]:
    """``MOST:THREADS,...`` as (most tokens, threads) pairs, ascending."""
    try:
        plan = tuple((int(most), int(threads)) for most, threads in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MOST:THREADS,..., got {text!r}") from None
    return tuple(sorted(plan))


def serve(embed: Callable[[list[str]], Any], stdin: Any, stdout: Any) -> None:
    """Answer commands until quit or end of input."""
    for line in stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "quit":
            return
        if op == "embed":
            reply: dict[str, Any] = {"embeddings": [[float(x) for x in row] for row in embed(cmd["texts"])]}
        elif op == "time":
            reply = {"seconds": timed(lambda texts=cmd["texts"]: embed(texts), int(cmd["n"]))}
        else:
            reply = {"error": f"unknown op {op!r}"}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.contestant")
    parser.add_argument("kind", choices=["sentence-transformers", "optimum", "onnxruntime"])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--source", type=Path, required=True, help="the Hugging Face model directory")
    parser.add_argument("--onnx", type=Path, help="optimum, onnxruntime: the graph to load (the package's model.onnx)")
    parser.add_argument("--thread-plan", type=_thread_plan, default=(),
                        help="onnxruntime only: MOST:THREADS,... (a server's measured plan from /v1/models)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="sentence-transformers only: torch's device (bench/gpu.py)")
    args = parser.parse_args(argv)
    if args.device != "cpu" and args.kind != "sentence-transformers":
        parser.error(f"--device {args.device} is for sentence-transformers only")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # The protocol gets a private copy of stdout; fd 1 itself now points at stderr, so whatever a library
    # prints (Python or C) cannot corrupt the reply lines.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-contestant-") as tmp:
        if args.kind == "sentence-transformers":
            embed = load_sentence_transformers(args.source, args.threads, args.device)
        elif args.kind == "onnxruntime":
            if args.onnx is None:
                parser.error("onnxruntime needs --onnx")
            embed = load_onnxruntime(args.onnx, args.threads, args.thread_plan)
        else:
            if args.onnx is None:
                parser.error("optimum needs --onnx")
            embed = load_optimum(args.source, args.onnx, args.threads, Path(tmp))
        protocol.write(json.dumps({"ready": True, "load_s": time.perf_counter() - started}) + "\n")
        protocol.flush()
        serve(embed, sys.stdin, protocol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
