"""The loaders of the converters' PyTorch reference models, every tensor accounted for: a Transformers
model class built from a source's config with the source's tensors (load_backbone), or a checkpoint
directory read by Transformers itself (load_pretrained)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from converters.errors import ConversionError


def load_backbone(model_class: Any, config_class: Any, config: Mapping[str, Any], weights: Mapping[str, Any],
                  where: str) -> Any:
    """``model_class(config_class(**config))`` in fp32 eval mode with ``weights`` loaded; a config
    the class refuses, or a tensor missing or left over, is a ConversionError naming ``where``."""
    try:
        cfg = config_class(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    except (TypeError, ValueError) as e:
        raise ConversionError(f"{where}: not a {config_class.__name__}: {e}") from None
    cfg._attn_implementation = "sdpa"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Transformers' notices about the attention implementation
        model = model_class(cfg).float().eval()
    missing, unexpected = model.load_state_dict(dict(weights), strict=False)
    if missing or unexpected:
        raise ConversionError(f"{where}: backbone tensors do not match {model_class.__name__} "
                              f"(missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]})")
    return model


def load_pretrained(model_class: Any, model_dir: Any, where: str, *, unused: tuple[str, ...] = (),
                    discard_unexpected: bool = False, **kwargs: Any) -> Any:
    """``model_class.from_pretrained(model_dir)`` in fp32 eval mode, refused unless every weight the model
    computes with came from the checkpoint.

    Transformers initialises whatever the checkpoint lacks (``missing``), or holds at another shape
    (``mismatched``), at random and says so only in a warning: a head converted that way answers
    noise. Those keys are a ConversionError naming them, except under ``unused`` prefixes (modules the
    export never runs, such as BERT's pooler beneath an embedding). Checkpoint tensors the class has no
    place for (``unexpected``: another task's head, a second scorer) are refused too, unless
    ``discard_unexpected`` (an embedding drops a task head on purpose; the log says which).
    """
    import torch

    from converters.errors import first_line
    from converters.progress import log

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the random-init warning is replaced by the check below
            model, info = model_class.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True,
                                                      **kwargs)
    except Exception as e:  # noqa: BLE001 - any loading failure is reported the same way
        raise ConversionError(f"{where}: cannot load as {model_class.__name__}: {first_line(e)}") from None
    missing = sorted(k for k in info.get("missing_keys", []) if not k.startswith(unused))
    mismatched = sorted(str(m[0] if isinstance(m, tuple) else m) for m in info.get("mismatched_keys", []))
    unexpected = sorted(info.get("unexpected_keys", []))
    problems = []
    if missing or mismatched:
        problems.append(f"newly initialised, not in the checkpoint: {_names(missing + mismatched)}")
    if unexpected and not discard_unexpected:
        problems.append(f"in the checkpoint but not loaded: {_names(unexpected)}")
    if problems:
        name = type(model).__name__
        raise ConversionError(f"{where}: not every weight of {name} was loaded from the checkpoint ("
                              f"{'; '.join(problems)}); is it a {name} checkpoint? (pass the right --kind)")
    if unexpected:
        log(f"not exported (no part of {type(model).__name__}): {_names(unexpected)}")
    return model.eval()


def _names(keys: list[str], shown: int = 6) -> str:
    """Up to ``shown`` tensor names, then how many more."""
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more
