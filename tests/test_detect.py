"""``export SRC`` without ``--kind``: every layout is recognised from its own files (converters/detect.py),
the choice is printed with its reason, and ``--kind`` still overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from converters.__main__ import main
from converters.detect import detect
from converters.errors import ConversionError


def _config(d: Path, **config: object) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return d


@pytest.mark.parametrize("config, files, kind", [
    ({"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"0": "a", "1": "b"}},
     {}, "sequence-classification"),
    ({"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"0": "a", "1": "b"},
      "problem_type": "multi_label_classification"}, {}, "multi-label"),
    ({"model_type": "xlm-roberta", "architectures": ["XLMRobertaForSequenceClassification"],
      "id2label": {"0": "LABEL_0"}}, {}, "rerank"),
    ({"model_type": "bert", "architectures": ["BertForTokenClassification"]}, {}, "token-classification"),
    ({"model_type": "bert", "architectures": ["BertModel"]}, {"modules.json": []}, "embedding"),
    ({"model_type": "xlm-roberta", "architectures": ["XLMRobertaModel"]}, {}, "embedding"),
    ({"model_type": "siglip", "architectures": ["SiglipModel"]}, {}, "image-text-embedding"),
    ({"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]}, {}, "audio-embedding"),
    ({"model_type": "vela2-unified", "format_version": 1}, {}, "vela2"),
])
def test_layouts_are_detected_from_their_files(tmp_path: Path, config: dict, files: dict, kind: str) -> None:
    src = _config(tmp_path / "src", **config)
    for rel, value in files.items():
        (src / rel).write_text(json.dumps(value), encoding="utf-8")
    found = detect(src)
    assert found.kind == kind
    assert "config.json" in found.reason


def test_an_unknown_layout_asks_for_kind(tmp_path: Path) -> None:
    src = _config(tmp_path / "src", model_type="llama", architectures=["LlamaForCausalLM"])
    with pytest.raises(ConversionError, match="--kind is required"):
        detect(src)


def test_the_cli_prints_its_choice_and_kind_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _config(tmp_path / "src", model_type="bert", architectures=["BertForTokenClassification"])
    # no weights: the conversion itself fails after the choice was printed
    assert main(["export", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "detected --kind token-classification: config.json model_type bert" in err
    assert main(["export", str(src), "--kind", "embedding", "--out", str(tmp_path / "out")]) == 2
    assert "detected" not in capsys.readouterr().err
