"""ONNX export through Optimum, with earlier encoder layers as extra graph outputs when asked.

The graph keeps Optimum's inputs (input_ids, attention_mask, token_type_ids when the model has
them; never position_ids: rows are right-padded, so a decoder's positions are its own 0..n-1) and its
dynamic batch and sequence axes; the opset is pinned to 18.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optimum.exporters.onnx import onnx_export_from_model
from optimum.exporters.onnx.model_patcher import ModelPatcher, override_arguments
from optimum.exporters.tasks import TasksManager

OPSET = 18

#: converter kind -> Optimum task
TASKS: dict[str, str] = {
    "embedding": "feature-extraction",
    "sequence-classification": "text-classification",
    "multi-label": "text-classification",
    "token-classification": "token-classification",
    "rerank": "text-classification",
}


def hidden_state_output(layer: int) -> str:
    """The graph output name of encoder layer ``layer`` (1-based)."""
    return f"hidden_states.{layer}"


class _HiddenStatesPatcher(ModelPatcher):
    """Returns last_hidden_state plus the requested hidden_states[k] as separate named outputs."""

    def __init__(self, config: Any, model: Any, model_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(config, model, model_kwargs)
        layers = tuple(config.EXTRA_LAYERS)

        @functools.wraps(self.orig_forward)
        def patched_forward(*args: Any, **kwargs: Any) -> dict[str, Any]:
            signature = inspect.signature(self.orig_forward)
            args, kwargs = override_arguments(args, kwargs, signature, model_kwargs=self.model_kwargs)
            index = list(signature.parameters).index("output_hidden_states")
            if index < len(args):
                args = (*args[:index], True, *args[index + 1:])
            else:
                kwargs["output_hidden_states"] = True
            out = self.orig_forward(*args, **kwargs)
            # hidden_states[0] is the embedding output, hidden_states[k] the output of layer k
            result = OrderedDict(last_hidden_state=out.last_hidden_state)
            for k in layers:
                result[hidden_state_output(k)] = out.hidden_states[k]
            return result

        self.patched_forward = patched_forward


def _custom_config(model: Any, task: str, layers: Sequence[int]) -> Any | None:
    """Optimum's export config for ``model`` and ``task`` without a ``position_ids`` input (a decoder read
    as an encoder, Qwen3-Embedding: right-padded rows, so positions are 0..n-1, which the model computes
    itself) and with the ``layers`` as extra outputs; None when Optimum's own config is that already."""
    ctor = TasksManager.get_exporter_config_constructor(
        exporter="onnx", model=model, task=task, library_name="transformers")
    base = ctor(model.config, int_dtype="int64", float_dtype="fp32")
    base_cls = type(base)
    if not layers and "position_ids" not in base.inputs:
        return None

    def inputs(self: Any) -> dict[str, dict[int, str]]:
        return OrderedDict((k, v) for k, v in base_cls.inputs.fget(self).items() if k != "position_ids")

    def outputs(self: Any) -> dict[str, dict[int, str]]:
        common = OrderedDict(base_cls.outputs.fget(self))
        for k in self.EXTRA_LAYERS:
            common[hidden_state_output(k)] = {0: "batch_size", 1: "sequence_length"}
        return common

    members: dict[str, Any] = {"inputs": property(inputs)}
    if layers:
        members.update(outputs=property(outputs), _MODEL_PATCHER=_HiddenStatesPatcher, EXTRA_LAYERS=tuple(layers))
    sub = type(f"{base_cls.__name__}ForEdgeRuntime", (base_cls,), members)
    return sub(model.config, task=base.task, int_dtype="int64", float_dtype="fp32")


def export_onnx(model: Any, kind: str, work: Path, layers: Sequence[int] = ()) -> Path:
    """Export ``model`` (a loaded PreTrainedModel, eval mode) for ``kind`` into ``work``; returns model.onnx.

    ``layers`` are 1-based encoder layers below the last one to expose as ``hidden_states.<k>``.
    Optimum's own validation is skipped: the caller verifies the graph against PyTorch itself.
    """
    task = TASKS[kind]
    config = _custom_config(model, task, layers)
    custom = {"model": config} if config is not None else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings and deprecations: noise, not information
        onnx_export_from_model(
            model, output=work, task=task, opset=OPSET, do_validation=False,
            custom_onnx_configs=custom, preprocessors=[],
        )
    path = work / "model.onnx"
    if not path.is_file():
        raise RuntimeError(f"Optimum wrote no model.onnx into {work}")
    return path
