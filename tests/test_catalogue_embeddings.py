"""Qwen3-Embedding and EmbeddingGemma as the Router's catalogue ships them (tiny random-weight sources in
their real layouts, converters/encoder/source_fixtures.py): converted without --kind, served over HTTP,
and every vector compared with sentence-transformers in fp32: no input_type (the Router's own calls),
each input_type's prompt, every Matryoshka dimension, rows of several lengths batched together."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.__main__ import main as converters_main
from tests.support.server_harness import Server, embed, write_models_file

MIN_COSINE = 0.99999
TEXTS = ["Hello world.", "How do I reset my password?",
         "The contract ends on 31 December 2025 unless either party renews it, in writing, before then.",
         "今日は天気がいいので、公園を散歩しました。"]
#: model name -> (fixture kind, export options); a short input limit keeps the parity step quick
LAYOUTS = {"qwen3-emb": ("qwen3-embedding-source", []),
           "gemma-emb": ("embeddinggemma-source", ["--dimensions", "512,256,128"])}


#: Qwen3-Embedding-0.6B's graph (2.4 GB) keeps its weights in model.onnx.data; the fixture's does past this
EXTERNAL_ABOVE = 10_000_000


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """model name -> (source, package): EmbeddingGemma converted as `export SRC` (kind detected), Qwen3 in
    process with its weights split out of the graph, as a real one's are."""
    from converters.encoder.export import ExportOptions, export_model

    root = tmp_path_factory.mktemp("catalogue-embeddings")
    out = {}
    for name, (kind, options) in LAYOUTS.items():
        src, package = root / f"{name}-source", root / name
        assert converters_main(["fixture", "--kind", kind, "--out", str(src)]) == 0
        if name == "qwen3-emb":
            export_model(src, package, ExportOptions(kind="embedding", name=name, max_input_tokens=128,
                                                     dimensions=[768, 512, 256, 128],
                                                     external_data_above=EXTERNAL_ABOVE))
        else:
            assert converters_main(["export", str(src), "--out", str(package), "--name", name,
                                    "--max-input-tokens", "128", *options]) == 0
        out[name] = (src, package)
    return out


def test_kind_is_detected(layouts: dict[str, tuple[Path, Path]]) -> None:
    from converters.__main__ import _detect_kind

    assert {_detect_kind(str(src)) for src, _ in layouts.values()} == {"embedding"}


def test_large_graphs_keep_their_weights_beside(layouts: dict[str, tuple[Path, Path]]) -> None:
    package = layouts["qwen3-emb"][1]
    manifest = json.loads((package / "MANIFEST.json").read_text(encoding="utf-8"))["files"]
    assert manifest["model.onnx.data"]["size"] > EXTERNAL_ABOVE > manifest["model.onnx"]["size"]


@pytest.fixture(scope="module")
def server(layouts: dict[str, tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = [{"name": name, "package": str(package), "device": "cpu", "threads": 1}
              for name, (_, package) in layouts.items()]
    srv = Server(write_models_file(tmp_path_factory.mktemp("catalogue-server") / "models.yaml", models))
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def _card(package: Path) -> dict[str, Any]:
    card: dict[str, Any] = json.loads((package / "card.json").read_text(encoding="utf-8"))
    return card


@functools.cache
def _sentence_transformer(src: Path) -> Any:
    import torch
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(src), device="cpu", local_files_only=True, model_kwargs={"dtype": torch.float32})


@functools.cache
def _reference(src: Path, prompt_name: str | None) -> np.ndarray:
    """sentence-transformers' full vectors (encode's truncate_dim takes their first channels)."""
    vectors = _sentence_transformer(src).encode(TEXTS, prompt_name=prompt_name, convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float64)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def test_cards_carry_prompts_and_what_the_layout_needs(layouts: dict[str, tuple[Path, Path]]) -> None:
    qwen, gemma = _card(layouts["qwen3-emb"][1]), _card(layouts["gemma-emb"][1])
    # decoders read as encoders: no position_ids input (right-padded rows)
    assert qwen["graph"]["inputs"] == gemma["graph"]["inputs"] == ["input_ids", "attention_mask"]
    assert qwen["head"]["pooling"] == "last" and qwen["head"]["normalize"] is True
    assert set(qwen["head"]["prompts"]) == {"query", "document"} and qwen["head"]["prompts"]["document"] == ""
    assert qwen["sentence_transformers"]["default_prompt_name"] is None
    # every declared prompt is recorded; the ones input_type selects are served
    assert set(gemma["sentence_transformers"]["prompts"]) == {"query", "document", "Clustering", "STS"}
    assert gemma["head"]["dense"] == [{"activation": "identity", "bias": False}] * 2
    assert gemma["head"]["dimensions"] == [768, 512, 256, 128]
    assert "fp32_only" in gemma and list(gemma["variants"]) == ["fp32"]
    for card in (qwen, gemma):
        vectors = card["verification"]["vectors"]
        assert vectors["min_cosine"] >= MIN_COSINE and vectors["input_types"] == ["document", "query"]


def test_input_limit_follows_sentence_transformers(layouts: dict[str, tuple[Path, Path]]) -> None:
    """Qwen3-Embedding's tokenizer declares 131072 over 32768 positions: the limit is 32768, as
    sentence-transformers reads it, where the converter used to refuse the model."""
    from transformers import AutoConfig

    from converters.encoder.export import ExportOptions, _max_input_tokens
    from converters.errors import ConversionError
    from converters.sentence_transformers import read_sentence_transformer

    src = layouts["qwen3-emb"][0]
    st, config = read_sentence_transformer(src), AutoConfig.from_pretrained(src)
    assert json.loads((src / "tokenizer_config.json").read_text())["model_max_length"] == 131072
    assert _max_input_tokens(ExportOptions(kind="embedding"), st, src, config) == 32768
    with pytest.raises(ConversionError, match="max_position_embeddings"):
        _max_input_tokens(ExportOptions(kind="embedding", max_input_tokens=40000), st, src, config)


def test_gemma_window_is_the_models_own(layouts: dict[str, tuple[Path, Path]]) -> None:
    """config.json holds the window as defined (8); Transformers reads it as |i - j| < 8 // 2 + 1 once,
    where a save and reload in 4.57 would have halved it twice."""
    from transformers import AutoConfig

    from converters.encoder.source_fixtures import GEMMA_SLIDING_WINDOW

    src = layouts["gemma-emb"][0]
    assert json.loads((src / "config.json").read_text())["sliding_window"] == GEMMA_SLIDING_WINDOW
    assert AutoConfig.from_pretrained(src).sliding_window == GEMMA_SLIDING_WINDOW // 2 + 1


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_served_vectors_match_sentence_transformers(name: str, layouts: dict[str, tuple[Path, Path]],
                                                    server: Server) -> None:
    src, package = layouts[name]
    card = _card(package)
    info = {m["id"]: m for m in server.client.get("/v1/models").json()["data"]}[name]["embedding"]
    assert info["input_types"] == ["document", "query"] and info["dimensions"] == card["head"]["dimensions"]
    for input_type in (None, "query", "document"):
        for dim in card["head"]["dimensions"]:
            body: dict[str, Any] = {"model": name, "input": TEXTS, "dimensions": dim}
            if input_type is not None:
                body["input_type"] = input_type
            got = np.asarray([d["embedding"] for d in embed(server, body)["data"]], dtype=np.float64)
            cos = _cosines(got, _reference(src, input_type)[:, :dim])
            assert cos.min() >= MIN_COSINE, (input_type, dim, cos)
    # the prompt is read: a query is not its document
    query = embed(server, {"model": name, "input": TEXTS[:1], "input_type": "query"})["data"][0]
    plain = embed(server, {"model": name, "input": TEXTS[:1]})["data"][0]
    assert query["input"]["tokens"] > plain["input"]["tokens"] and query["embedding"] != plain["embedding"]


def test_last_token_is_read_from_the_mask(server: Server) -> None:
    """A short row padded beside long ones pools its own last token: the same vector alone and batched."""
    alone = embed(server, {"model": "qwen3-emb", "input": TEXTS[:1]})["data"][0]["embedding"]
    batched = embed(server, {"model": "qwen3-emb", "input": TEXTS})["data"][0]["embedding"]
    assert np.allclose(alone, batched, atol=1e-6)
