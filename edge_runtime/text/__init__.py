"""Tokenizer loading, the budget cut for long inputs, windows and pairs.

``TextEncoder.encode`` turns a text (or a pair) into token rows within a budget; long texts are
tokenized only as far as the budget decides (see edge_runtime.text.bounds).
"""

from edge_runtime.text.encoder import TextEncoder
from edge_runtime.text.probe import ProbeReport
from edge_runtime.text.tokenizer import load_tokenizer
from edge_runtime.text.types import (
    MAX_LENGTH_EXCEEDED,
    SCAN_BUDGET_EXCEEDED,
    Encoded,
    EncodedRow,
    InputError,
    Window,
)

__all__ = [
    "MAX_LENGTH_EXCEEDED",
    "SCAN_BUDGET_EXCEEDED",
    "Encoded",
    "EncodedRow",
    "InputError",
    "ProbeReport",
    "TextEncoder",
    "Window",
    "load_tokenizer",
]
