"""PEFT LoRA adapter directories (a Router ``-lora`` repo's layout: converters/encoder/source_fixtures.py):
the base found offline in a Hugging Face cache by the repo id the adapter names, or given with --base;
the adapter merged at conversion, the card naming adapter and base; served over HTTP with probabilities
equal to Transformers running the base with the adapter unmerged, as PEFT computes it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.__main__ import main as converters_main
from converters.encoder.source_fixtures import LORA_BASE, LORA_BASE_COMMIT, LORA_LABELS, LORA_RANK
from tests.support.server_harness import Server, write_models_file

TEXTS = ["Hello world.", "How do I reset my password?",
         "The contract ends on 31 December 2025 unless either party renews it, in writing, before then."]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("lora") / "mmbert32k-intent-classifier-lora"
    assert converters_main(["fixture", "--kind", "lora-source", "--out", str(src)]) == 0
    return src


def _hub(adapter: Path) -> Path:
    return adapter.with_name(adapter.name + "-hub")


def _base_dir(adapter: Path) -> Path:
    return _hub(adapter) / f"models--{LORA_BASE.replace('/', '--')}" / "snapshots" / LORA_BASE_COMMIT


@pytest.fixture(scope="module")
def package(adapter: Path, monkeypatch_module: pytest.MonkeyPatch) -> Path:
    """Converted with the kind detected and the base found through HF_HUB_CACHE."""
    monkeypatch_module.setenv("HF_HUB_CACHE", str(_hub(adapter)))
    out = adapter.with_name("lora-package")
    assert converters_main(["export", str(adapter), "--out", str(out), "--name", "intent-lora",
                            "--max-input-tokens", "128"]) == 0
    return out


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _card(package: Path) -> dict[str, Any]:
    card: dict[str, Any] = json.loads((package / "card.json").read_text(encoding="utf-8"))
    return card


def test_card_records_adapter_and_base(package: Path) -> None:
    card = _card(package)
    assert card["kind"] == "sequence-classification" and card["labels"] == LORA_LABELS
    assert card["source"]["architecture"] == "ModernBertForSequenceClassification"
    record = card["lora"]
    assert record["base"]["name"] == LORA_BASE and record["base"]["revision"] == LORA_BASE_COMMIT
    assert len(record["base"]["sha256"]) == len(record["adapter"]["sha256"]) == 64
    assert record["adapter"]["task_type"] == "SEQ_CLS" and record["adapter"]["rank"] == LORA_RANK
    assert record["adapter"]["target_modules"] == ["Wi", "Wo", "Wqkv"]
    assert record["adapter"]["modules_to_save"] == ["classifier"]
    assert record["merge"]["max_abs_diff"] <= record["merge"]["tolerance"] < record["merge"]["adapter_effect"]


def _peft_reference(adapter: Path, texts: list[str]) -> np.ndarray:
    """Probabilities of the base with the adapter applied unmerged, base(x) + B(A(x)) * alpha / r, in
    Transformers: its classifier from the adapter's saved tensors, its factors through forward hooks."""
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    cfg = json.loads((adapter / "adapter_config.json").read_text())
    model = AutoModelForSequenceClassification.from_pretrained(_base_dir(adapter), num_labels=len(LORA_LABELS),
                                                               dtype=torch.float32).eval()
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    model.load_state_dict({"classifier.weight": tensors["base_model.model.classifier.weight"],
                           "classifier.bias": tensors["base_model.model.classifier.bias"]}, strict=False)
    modules = dict(model.named_modules())
    scaling = cfg["lora_alpha"] / cfg["r"]
    for key in tensors:
        if key.endswith("lora_A.weight"):
            stem = key[len("base_model.model."):-len(".lora_A.weight")]
            a, b = tensors[key], tensors[key.replace("lora_A", "lora_B")]
            modules[stem].register_forward_hook(
                lambda m, i, o, a=a, b=b: o + (i[0] @ a.T @ b.T) * scaling)
    tok = Tokenizer.from_file(str(adapter / "tokenizer.json"))
    with torch.no_grad():
        logits = [model(input_ids=torch.tensor([tok.encode(t).ids])).logits[0] for t in texts]
    return np.stack([torch.softmax(x, -1).numpy() for x in logits])


def test_served_probabilities_match_the_unmerged_adapter(adapter: Path, package: Path,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    models = [{"name": "intent-lora", "package": str(package), "device": "cpu", "threads": 1}]
    server = Server(write_models_file(tmp_path_factory.mktemp("lora-server") / "models.yaml", models))
    try:
        server.wait()
        answer = server.client.post("/v1/classify", json={"model": "intent-lora", "input": TEXTS}).json()
    finally:
        server.stop()
    got = np.asarray([r["probabilities"] for r in answer["results"]])
    assert answer["labels"] == LORA_LABELS
    assert np.abs(got - _peft_reference(adapter, TEXTS)).max() < 1e-5


def test_base_given_with_base_option(adapter: Path, tmp_path: Path) -> None:
    """--base names the base directory; the repo id in adapter_config.json is not looked up."""
    from converters.encoder.adapter import load_adapter
    from converters.encoder.export import model_class

    loaded = load_adapter(adapter, "sequence-classification", model_class("sequence-classification"),
                          _base_dir(adapter), tmp_path / "empty-cache")
    assert loaded.record["base"]["revision"] == LORA_BASE_COMMIT and loaded.record["base"]["name"] == LORA_BASE
    assert loaded.tokenizer_dir == adapter


def _altered(adapter: Path, tmp_path: Path, config: dict[str, Any] | None = None,
             drop: tuple[str, ...] = ()) -> Path:
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "adapter"
    shutil.copytree(adapter, copy)
    if config:
        cfg = json.loads((copy / "adapter_config.json").read_text())
        (copy / "adapter_config.json").write_text(json.dumps({**cfg, **config}))
    if drop:
        tensors = load_file(str(copy / "adapter_model.safetensors"))
        save_file({k: v for k, v in tensors.items() if not k.endswith(drop)}, str(copy / "adapter_model.safetensors"))
    return copy


@pytest.mark.parametrize(("config", "drop", "message"), [
    (None, ("classifier.weight", "classifier.bias"), "must save its classifier"),
    ({"use_dora": True}, (), "use_dora=True is not supported"),
    ({"base_model_name_or_path": "llm-semantic-router/not-cached"}, (), "not in the Hugging Face cache"),
])
def test_refusals(adapter: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict[str, Any] | None,
                  drop: tuple[str, ...], message: str) -> None:
    src = _altered(adapter, tmp_path, config, drop)
    status = converters_main(["export", str(src), "--out", str(tmp_path / "p"), "--cache-dir", str(_hub(adapter))])
    assert status == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_a_head_weight_neither_in_the_base_nor_the_adapter_is_refused(adapter: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Transformers would initialise it at random and say so in a log line; the converter refuses, naming it."""
    from safetensors.torch import load_file, save_file

    hub = tmp_path / "hub"
    shutil.copytree(_hub(adapter), hub)
    weights = hub / _base_dir(adapter).relative_to(_hub(adapter)) / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v for k, v in tensors.items() if k != "head.dense.weight"}, str(weights))
    status = converters_main(["export", str(adapter), "--out", str(tmp_path / "p"), "--cache-dir", str(hub)])
    assert status == 2 and "head.dense.weight" in capsys.readouterr().err
