"""The one loader of the converters' PyTorch reference backbones: a Transformers model class built
from a source's config (SDPA attention, fp32, eval) with the source's tensors, every one accounted for."""

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
