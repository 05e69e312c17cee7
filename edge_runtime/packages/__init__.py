"""Model packages: the reader and verifier the server runs before it loads anything.

See docs/packages.md for the format. This package imports neither onnxruntime nor torch.
"""

from edge_runtime.packages.card import CARD_FORMAT, KIND_SURFACES, Card, Variant, parse_card, validate_card
from edge_runtime.packages.errors import PackageError
from edge_runtime.packages.golden import GoldenCase, golden_bytes, read_golden
from edge_runtime.packages.manifest import MANIFEST_FORMAT, build_manifest, compute_digest, file_sha256
from edge_runtime.packages.reader import Package, read_package

__all__ = [
    "CARD_FORMAT", "KIND_SURFACES", "MANIFEST_FORMAT", "Card", "GoldenCase", "Package", "PackageError",
    "Variant", "build_manifest", "compute_digest", "file_sha256", "golden_bytes", "parse_card",
    "read_golden", "read_package", "validate_card",
]
