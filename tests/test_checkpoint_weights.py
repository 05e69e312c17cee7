"""A converter refuses a checkpoint whose head or backbone weights were not all loaded from it: Transformers
would initialise the missing ones at random and the package would answer noise (issue 37 item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from converters.encoder.export import ExportOptions, export_model
from converters.encoder.fixture import build_source
from converters.errors import ConversionError


def _drop(src: Path, prefix: str) -> None:
    weights = load_file(src / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith(prefix)}, src / "model.safetensors",
              metadata={"format": "pt"})


def test_a_missing_head_weight_is_refused_by_name(tmp_path: Path) -> None:
    src = build_source("sequence-classification", tmp_path / "src")
    _drop(src, "classifier.weight")
    with pytest.raises(ConversionError, match=r"newly initialised, not in the checkpoint: classifier\.weight"):
        export_model(src, tmp_path / "out", ExportOptions(kind="sequence-classification"))
    assert not (tmp_path / "out").exists()


def test_a_backbone_checkpoint_is_no_classifier(tmp_path: Path) -> None:
    """The Vela Reranker's case: a bare encoder converted as a classifier gets a random head."""
    src = build_source("embedding", tmp_path / "src")
    with pytest.raises(ConversionError, match=r"classifier\.bias, classifier\.weight"):
        export_model(src, tmp_path / "out", ExportOptions(kind="rerank"))


def test_a_missing_backbone_weight_is_refused(tmp_path: Path) -> None:
    src = build_source("token-classification", tmp_path / "src")
    _drop(src, "bert.encoder.layer.1.output.dense")
    with pytest.raises(ConversionError, match=r"bert\.encoder\.layer\.1\.output\.dense\.bias"):
        export_model(src, tmp_path / "out", ExportOptions(kind="token-classification"))


def test_a_token_classifier_is_no_sequence_classifier(tmp_path: Path) -> None:
    """BERT's sequence head reads the pooler, which a token classifier's checkpoint does not hold."""
    src = build_source("token-classification", tmp_path / "src")
    with pytest.raises(ConversionError, match=r"bert\.pooler\.dense\.bias, bert\.pooler\.dense\.weight"):
        export_model(src, tmp_path / "out", ExportOptions(kind="multi-label"))


def test_an_embedding_drops_a_task_head_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = build_source("token-classification", tmp_path / "src")
    export_model(src, tmp_path / "out", ExportOptions(kind="embedding"))
    assert "not exported (no part of BertModel): classifier.bias, classifier.weight" in capsys.readouterr().err
