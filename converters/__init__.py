"""Converters: turn Hugging Face models into edge-runtime packages (``python -m converters``).

This package may import torch, transformers and optimum; the server never imports it.
"""

CONVERTER_VERSION = "0.1.0"
