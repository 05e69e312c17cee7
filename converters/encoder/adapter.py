"""An encoder source that is a PEFT LoRA adapter directory: its base loaded with the kind's task head,
the adapter's saved modules (the classifier) put in place, its LoRA merged (converters/lora.py), so
that the export, its parity check and its card proceed as for any Hugging Face directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters import lora
from converters.errors import ConversionError
from converters.progress import log
from converters.samples import SAMPLE_TEXTS
from converters.source import package_tokenizer, source_stamp

#: the kinds an adapter of each PEFT task type may be exported as
KINDS_OF_TASK = {"SEQ_CLS": ("sequence-classification", "multi-label", "rerank"),
                 "TOKEN_CLS": ("token-classification",), "FEATURE_EXTRACTION": ("embedding",)}


def is_adapter(src: Path) -> bool:
    """Whether ``src`` is a PEFT adapter directory (adapter_config.json, no model of its own)."""
    return (src / lora.ADAPTER_CONFIG).is_file()


@dataclass(frozen=True)
class LoadedAdapter:
    """The merged model, where its tokenizer is, the source stamp and the card's ``lora`` member."""

    model: Any
    tokenizer_dir: Path
    stamp: str
    record: dict[str, Any]


def load_adapter(src: Path, kind: str, model_class: Any, base: Path | None, cache_dir: Path | None
                 ) -> LoadedAdapter:
    """Read the adapter at ``src``, find its base (``base``, else as adapter_config.json names it, in
    ``cache_dir`` for a repo id), and merge it into the base loaded as ``model_class`` for ``kind``."""
    task = str(lora.task_type(src))
    kinds = KINDS_OF_TASK.get(task, ())
    if kind not in kinds:
        raise ConversionError(f"{src}: a {task} adapter exports as {', '.join(kinds) or 'nothing here'}, not {kind}")
    adapter = lora.read_adapter(src, kind)
    found = lora.find_base(adapter, base, cache_dir)
    log(f"LoRA adapter over {found.name}{f'@{found.revision}' if found.revision else ''} ({found.path})")
    tokenizer_dir = src if (src / "tokenizer.json").is_file() else found.path
    probe = _probe(package_tokenizer(tokenizer_dir))
    model, merge_diff, moved = lora.load_merged(adapter, found, model_class, probe)
    log(f"LoRA merged: merged vs unmerged forward {merge_diff:.3g} (the adapter moves outputs by {moved:.3g})")
    # the package is made from the adapter, its tokenizer and the base's weights
    extra = {f"adapter/{n}": src / n for n in (lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS)}
    extra.update({f"base/{n}": p for n, p in lora.base_files(found.path).items()})
    return LoadedAdapter(model, tokenizer_dir, source_stamp(src, src, extra),
                         lora.card_record(adapter, found, merge_diff, moved))


def _probe(tokenizer: Any) -> dict[str, Any]:
    """The merge check's input: two sample texts, right-padded, as token id and mask tensors."""
    import torch

    encoded = [tokenizer.encode(t).ids for t in SAMPLE_TEXTS[:2]]
    width = max(len(ids) for ids in encoded)
    ids = torch.zeros((len(encoded), width), dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, row in enumerate(encoded):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}
