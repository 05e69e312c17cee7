"""bench/modernbert_int8.py plants outliers without changing what the model computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.modernbert_int8 import plant


def test_planting_keeps_the_function_and_plants_the_channels(tmp_path: Path) -> None:
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForSequenceClassification

    from converters.task_heads.fixture import write_source

    source = write_source("domain", tmp_path / "domain")
    before_weights = load_file(str(source / "model.safetensors"))
    ids = torch.tensor([[2, 40, 41, 42, 43, 44, 1]])
    with torch.no_grad():
        before = AutoModelForSequenceClassification.from_pretrained(source).eval()(input_ids=ids).logits.numpy()
    plant(source, 100.0, [3, 17])
    after_weights = load_file(str(source / "model.safetensors"))
    with torch.no_grad():
        after = AutoModelForSequenceClassification.from_pretrained(source).eval()(input_ids=ids).logits.numpy()
    assert np.abs(after - before).max() < 1e-4
    norm = "model.layers.1.mlp_norm.weight"
    assert np.allclose(after_weights[norm][[3, 17]], 100 * before_weights[norm][[3, 17]])
    assert np.array_equal(after_weights[norm][[0, 1, 2]], before_weights[norm][[0, 1, 2]])
    wi = "model.layers.1.mlp.Wi.weight"
    assert np.allclose(after_weights[wi][:, 3], before_weights[wi][:, 3] / 100)
