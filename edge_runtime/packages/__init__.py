"""Model packages: the reader and verifier the server runs before it loads anything.

See docs/packages.md for the format. This package imports neither onnxruntime nor torch, and names no
family: the family registry hands the reader each family's card rules (:class:`CardRules`).
"""

from edge_runtime.packages.card import (
    CARD_FILE,
    CARD_FORMAT,
    DECISION_CONFIG_FILE,
    TOKENIZER_FILE,
    Card,
    CardRules,
    FamilyCard,
    Variant,
    decision_files,
    parse_card,
    schema_fragment,
    tokenizer_files,
    validate_card,
)
from edge_runtime.packages.errors import PackageError
from edge_runtime.packages.golden import GoldenCase, golden_bytes, read_golden
from edge_runtime.packages.manifest import MANIFEST_FORMAT, build_manifest, compute_digest, file_sha256
from edge_runtime.packages.reader import Package, read_package

__all__ = [
    "CARD_FILE", "CARD_FORMAT", "DECISION_CONFIG_FILE", "MANIFEST_FORMAT", "TOKENIZER_FILE", "Card", "CardRules",
    "FamilyCard", "GoldenCase", "Package", "PackageError", "Variant", "build_manifest", "compute_digest",
    "decision_files", "file_sha256", "golden_bytes", "parse_card", "read_golden", "read_package",
    "schema_fragment", "tokenizer_files", "validate_card",
]
