"""Converters: turn Hugging Face models into edge-runtime packages (``python -m converters``).

This package may import torch, transformers and optimum; the server never imports it.
"""

#: 0.2.0: the "int8" variant is per-token (exact); the dynamic one is "int8-dynamic".
CONVERTER_VERSION = "0.2.0"
