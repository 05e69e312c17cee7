"""What the converters of causal-LM decision packages share (decision-codes, decision-vision, decision2):
single-token codes, the chat markup around the user turn, the LM-head rows of chosen tokens, the stamp
of a weights directory, and Optimum's export of a backbone without its LM head.

Codes: ``A``..``Z``, then ``AA``, ``AB``, ... ``ZZ``; the first 255 that the tokenizer reads as one
token each. The chat markup is rendered once, here, from the source's own chat template (the server
never runs a template); a model without one reads a plain prompt.
"""

from __future__ import annotations

import itertools
import string
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError
from edge_runtime.families.code_options import SYSTEM
from edge_runtime.packages.manifest import compute_digest, file_sha256

OPSET = 18
MAX_CODES = 255
_USER_MARK = "@@EDGE_RUNTIME_USER_TURN@@"
_PLAIN_AFTER = "\n\nAnswer:\n"
_STAMPED_SUFFIXES = (".json", ".safetensors", ".bin", ".jinja", ".model", ".txt")


def code_candidates() -> list[str]:
    """A..Z, then AA, AB, ..., ZZ."""
    letters = string.ascii_uppercase
    return [*letters, *("".join(p) for p in itertools.product(letters, repeat=2))]


def choose_codes(prompt_tokenizer: Any, given: Sequence[str] | None = None) -> tuple[list[str], list[int]]:
    """The codes and their token ids; ``given`` codes must each be one token, else the alphabet's first 255 that are."""
    def single(code: str) -> int | None:
        ids = prompt_tokenizer.encode(code, add_special_tokens=False).ids
        return ids[0] if len(ids) == 1 else None

    if given is not None:
        found = {c: single(c) for c in given}
        bad = [c for c, i in found.items() if i is None]
        if bad:
            raise ConversionError(f"codes {bad[:5]} are not single tokens of the tokenizer; every code must be one")
        given_ids = [i for i in found.values() if i is not None]
        if len(set(given_ids)) != len(given_ids) or len(found) != len(given):
            raise ConversionError("two codes read as the same token")
        return list(given), given_ids
    codes: list[str] = []
    ids: list[int] = []
    for code in code_candidates():
        tid = single(code)
        if tid is not None and tid not in ids:
            codes.append(code)
            ids.append(tid)
        if len(codes) == MAX_CODES:
            break
    if len(codes) < 26:
        raise ConversionError(f"only {len(codes)} of the codes A..Z, AA..ZZ are single tokens of this tokenizer")
    return codes, ids


def chat_markup(model_dir: Path) -> tuple[str, str, str]:
    """(before, after, how): the chat markup around the user turn, from the source's chat template."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(model_dir)
    except Exception:  # noqa: BLE001 - a model without a loadable tokenizer config reads the plain prompt
        hf = None
    template = getattr(hf, "chat_template", None) if hf is not None else None
    if template:
        attempts = ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": _USER_MARK}],
                    [{"role": "user", "content": f"{SYSTEM}\n\n{_USER_MARK}"}])  # templates without a system role
        for messages in attempts:
            try:
                text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                              enable_thinking=False)
            except Exception:  # noqa: BLE001 - the template refused this shape; try the next
                continue
            if isinstance(text, str) and text.count(_USER_MARK) == 1:
                before, after = text.split(_USER_MARK)
                return before, after, "chat_template"
        raise ConversionError(f"{model_dir}: the chat template renders no single user turn")
    bos = getattr(hf, "bos_token", None) if hf is not None and getattr(hf, "add_bos_token", False) else None
    return f"{bos or ''}{SYSTEM}\n\n", _PLAIN_AFTER, "plain"


def text_tokenizer(tok: Any) -> Any:
    """A copy of ``tok`` that reads special tokens as text, as the server reads request text."""
    from tokenizers import Tokenizer

    text = Tokenizer.from_str(tok.to_str())
    text.encode_special_tokens = True
    return text


def lm_head_rows(lm: Any, token_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
    """The LM head's weight rows (and bias entries, if it has a bias) of ``token_ids``, float32."""
    head = lm.get_output_embeddings()
    if head is None:
        raise ConversionError("the model has no LM head to take the code rows from, and the source no readout")
    weight = head.weight.detach().float().numpy()[list(token_ids)]
    bias = getattr(head, "bias", None)
    return np.ascontiguousarray(weight), None if bias is None else bias.detach().float().numpy()[list(token_ids)]


def weights_stamp(src: Path) -> str:
    """The digest of a model directory's configuration, tokenizer and weight files (its source stamp)."""
    files = {p.name: file_sha256(p) for p in sorted(src.iterdir())
             if p.is_file() and p.suffix in _STAMPED_SUFFIXES and not p.name.startswith(".")}
    if not any(n.endswith((".safetensors", ".bin")) for n in files):
        raise ConversionError(f"{src}: no *.safetensors or *.bin weights")
    return compute_digest(files)


def export_backbone(base: Any, attention_mode: str, work: Path) -> Path:
    """Export a causal LM's backbone (no LM head) with Optimum: ``last_hidden_state``, with past key/values
    for attention mode prefix_causal."""
    import optimum.exporters.onnx.model_configs  # noqa: F401 - fills the task registry (docs/reference/feasibility-notes.md B.3.1)
    from optimum.exporters.onnx import onnx_export_from_model
    from optimum.exporters.tasks import TasksManager

    custom = None
    task = "feature-extraction"
    if attention_mode == "prefix_causal":
        task = "text-generation-with-past"
        try:
            ctor = TasksManager.get_exporter_config_constructor(
                exporter="onnx", model=base, task=task, library_name="transformers")
        except Exception as e:  # noqa: BLE001
            raise ConversionError(f"Optimum has no {task} export for {base.config.model_type}: {e}") from None
        base_cls = type(ctor(base.config, int_dtype="int64", float_dtype="fp32"))

        def outputs(self: Any) -> dict[str, dict[int, str]]:
            named: dict[str, dict[int, str]] = OrderedDict(last_hidden_state={0: "batch_size", 1: "sequence_length"})
            self.add_past_key_values(named, direction="outputs")
            return named

        cls = type(f"{base_cls.__name__}HiddenWithPast", (base_cls,), {"outputs": property(outputs)})
        # task text-generation inside the config: traced with a past and a past+seq mask (notes B.1)
        custom = {"model": cls(base.config, task="text-generation", use_past=True, use_past_in_inputs=True,
                               int_dtype="int64", float_dtype="fp32")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings: noise, the verification below is the judge
        try:
            onnx_export_from_model(base, output=work, task=task, opset=OPSET, do_validation=False,
                                   custom_onnx_configs=custom, preprocessors=[])
        except Exception as e:  # noqa: BLE001
            raise ConversionError(f"Optimum could not export {base.config.model_type} ({task}): "
                                  f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    path = work / "model.onnx"
    if not path.is_file():
        raise ConversionError(f"Optimum wrote no model.onnx into {work}")
    return path


__all__ = ["MAX_CODES", "OPSET", "chat_markup", "choose_codes", "code_candidates", "export_backbone",
           "lm_head_rows", "text_tokenizer", "weights_stamp"]
