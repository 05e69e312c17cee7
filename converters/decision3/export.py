"""ONNX export of the decision3 text core, and the bridge to the Transformers 5 reference.

:func:`export_text_core` traces :class:`converters.decision3.backbone.Qwen35TextCore` with the
TorchScript exporter at opset 18 (the chunk loop is a scripted loop, so the graph holds an ONNX Loop and
serves every length) and writes ``model.onnx`` with the exact names and dynamic axes of docs/decision3.md;
past 1.8 GB the weights go to one ``model.onnx.data`` beside it (converters/graph_files.py).

:func:`reference_hidden` runs converters/decision3/reference.py in the reference environment
(``EDGE_RUNTIME_REFERENCE_PYTHON``, default ``<repo>/.venv-ref/bin/python``) and returns Transformers'
own last hidden states.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError
from converters.graph_files import EXTERNAL_DATA_BYTES, gather_graph
from edge_runtime.engine.causal import ATTENTION_MASK, HIDDEN, POSITION_IDS
from edge_runtime.engine.recurrent import INPUTS_EMBEDS

from .backbone import (
    LINEAR,
    build_text_core,
    graph_input_names,
    graph_output_names,
    state_shapes,
)

OPSET = 18
REFERENCE_ENV_VAR = "EDGE_RUNTIME_REFERENCE_PYTHON"
REPO_ROOT = Path(__file__).resolve().parents[2]


def dynamic_axes(layer_types: Sequence[str]) -> dict[str, dict[int, str]]:
    """Batch, q and past are dynamic; GDN states have fixed shapes after the batch."""
    axes: dict[str, dict[int, str]] = {
        INPUTS_EMBEDS: {0: "batch", 1: "q"}, ATTENTION_MASK: {0: "batch", 1: "past_plus_q"},
        POSITION_IDS: {0: "batch", 2: "q"}, HIDDEN: {0: "batch", 1: "q"}}
    for i, kind in enumerate(layer_types):
        if kind == LINEAR:
            for name in (f"past_conv.{i}", f"past_recurrent.{i}", f"present_conv.{i}", f"present_recurrent.{i}"):
                axes[name] = {0: "batch"}
        else:
            for t in ("key", "value"):
                axes[f"past_key_values.{i}.{t}"] = {0: "batch", 2: "past"}
                axes[f"present.{i}.{t}"] = {0: "batch", 2: "past_plus_q"}
    return axes


def example_inputs(text_config: Mapping[str, Any], batch: int = 2, q: int = 5, past: int = 3,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds in graph input order: random embeds and states, row 1 right-padded by 2, a non-empty past."""
    rng = np.random.default_rng(seed)
    hidden = int(text_config["hidden_size"])
    mask = np.ones((batch, past + q), dtype=np.int64)
    if batch > 1:
        mask[1, past + q - 2:] = 0
    feeds: dict[str, np.ndarray] = {INPUTS_EMBEDS: rng.standard_normal((batch, q, hidden)).astype(np.float32),
             ATTENTION_MASK: mask,
             POSITION_IDS: np.broadcast_to(past + np.arange(q, dtype=np.int64), (batch, 3, q)).copy()}
    for name, shape in state_shapes(text_config).items():
        full = tuple(past if (name.startswith("past_key_values.") and k == 1) else d for k, d in enumerate(shape))
        feeds[name] = (rng.standard_normal((batch, *full)) * 0.1).astype(np.float32)
    return feeds


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote and what it took."""

    files: list[Path]
    seconds: float
    input_names: list[str]
    output_names: list[str]


def export_text_core(weights: Mapping[str, Any], text_config: Mapping[str, Any], attention_mode: str,
                     path: str | Path, *, external_data_above: int = EXTERNAL_DATA_BYTES) -> ExportReport:
    """Export the text core of ``weights`` (HF ``Qwen3_5TextModel`` names, no ``language_model.``
    prefix) for ``attention_mode`` to ``path`` (model.onnx); returns the files written, graph first.

    The graph is checked by the caller against Transformers (:func:`reference_hidden`) and the stress test
    (converters/decision3/stress.py); this function only writes it.
    """
    import torch

    started = time.perf_counter()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        core = build_text_core(weights, text_config, attention_mode)
    except (KeyError, ValueError) as e:
        raise ConversionError(f"cannot build the Qwen3.5 text core: {e}") from None
    layer_types = core.layer_types
    inputs, outputs = graph_input_names(layer_types), graph_output_names(layer_types)
    feeds = example_inputs(text_config)
    args = tuple(torch.from_numpy(feeds[n]) for n in inputs)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings about shape arithmetic: the graph keeps it dynamic
        torch.onnx.export(core, args, str(path), dynamo=False, opset_version=OPSET, input_names=inputs,
                          output_names=outputs, dynamic_axes=dynamic_axes(layer_types), do_constant_folding=True)
    files = gather_graph(path, external_data_above)
    return ExportReport(files, time.perf_counter() - started, inputs, outputs)


# ---- the Transformers 5 reference -------------------------------------------------------------


def reference_python() -> Path:
    """The reference environment's interpreter; a ConversionError naming scripts/reference_env.sh if absent."""
    configured = os.environ.get(REFERENCE_ENV_VAR)
    python = Path(configured) if configured else REPO_ROOT / ".venv-ref" / "bin" / "python"
    if not python.exists():
        raise ConversionError(
            f"the Transformers 5 reference environment is missing ({python}): build it with "
            f"scripts/reference_env.sh, point {REFERENCE_ENV_VAR} at its python, or convert with --no-reference")
    return python


def reference_hidden(weight_files: Sequence[str | Path], config: Mapping[str, Any], inputs: Mapping[str, np.ndarray],
                     attention_mode: str, dtypes: Sequence[str] = ("float32",), *, threads: int = 0,
                     timeout_s: float = 3600.0) -> dict[str, np.ndarray]:
    """Transformers 5's ``Qwen3_5TextModel`` last hidden states ``[B, q, H]`` per dtype ("float32",
    "bfloat16") on ``inputs`` (``inputs_embeds`` or ``input_ids``, ``attention_mask``, optional
    ``position_ids [B, 3, q]`` and ``prefix_len``), run in the reference environment.

    ``weight_files`` are safetensors files (text tensors with or without the ``language_model.`` prefix;
    other towers are ignored); ``config`` is the checkpoint's config (with ``text_config``) or the text
    config itself.
    """
    command = ["--attention-mode", attention_mode, "--threads", str(threads)]
    for dtype in dtypes:
        command += ["--dtype", dtype]
    return run_reference(weight_files, config, inputs, command, timeout_s)


def run_reference(weight_files: Sequence[str | Path], config: Mapping[str, Any], inputs: Mapping[str, np.ndarray],
                   options: Sequence[str], timeout_s: float) -> dict[str, np.ndarray]:
    """converters/decision3/reference.py in the reference environment; its output npz as arrays."""
    python = reference_python()
    with tempfile.TemporaryDirectory(prefix="d3-reference-") as tmp:
        work = Path(tmp)
        (work / "config.json").write_text(json.dumps(dict(config)))
        save: Any = np.savez  # numpy's stub types **kwds as its own flags
        save(work / "inputs.npz", **{k: np.asarray(v) for k, v in inputs.items()})
        command = [str(python), "-m", "converters.decision3.reference", "--config", str(work / "config.json"),
                   "--weights", *(str(Path(f).resolve()) for f in weight_files), "--inputs", str(work / "inputs.npz"),
                   "--out", str(work / "out.npz"), *options]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TRANSFORMERS_VERBOSITY": "error"}
        try:
            done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ConversionError(f"the Transformers reference ran past {timeout_s:.0f} s") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ConversionError(f"the Transformers reference failed (exit {done.returncode}): {tail[0]}")
        with np.load(work / "out.npz") as out:
            return {k: np.array(out[k]) for k in out.files}


__all__ = ["ExportReport", "OPSET", "REFERENCE_ENV_VAR", "dynamic_axes", "example_inputs", "export_text_core",
           "reference_hidden", "reference_python", "run_reference"]
