"""Exact int8 of the multimodal towers (issue 29 item 5): `--quantize int8` converts every tower, the card
states each tower's measured agreement and integer-product check, and the server serves `variant: int8`
with every tower self-checked and probed, close to fp32 and bit-identical alone and batched.

Tiny random-weight SigLIP (image-text), Whisper and CLAP (audio) fixtures, built once per session.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tests.support.media_samples import audio_part, encode_audio, image_part, picture, tone
from tests.support.server_harness import Server, embed, write_models_file

ARCHS = ("siglip", "whisper", "clap")


@pytest.fixture(scope="session")
def int8_packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from converters.multimodal.fixture import build_multimodal_fixture

    root = tmp_path_factory.mktemp("multimodal-int8")
    return {arch: build_multimodal_fixture(arch, root / arch, quantize="int8").path for arch in ARCHS}


@pytest.fixture(scope="session")
def int8_server(int8_packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = []
    for arch, pkg in int8_packages.items():
        models.append({"name": arch, "package": str(pkg), "device": "cpu", "threads": 1})
        models.append({"name": f"{arch}-int8", "package": str(pkg), "variant": "int8", "device": "cpu", "threads": 1})
    srv = Server(write_models_file(tmp_path_factory.mktemp("mm-int8") / "models.yaml", models))
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def _card(pkg: Path) -> dict[str, Any]:
    from edge_runtime.families.registry import read_package

    return read_package(pkg).card.raw


def _ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def test_every_tower_has_an_exact_int8_graph_with_its_measured_agreement(int8_packages: dict[str, Path]) -> None:
    for arch, pkg in int8_packages.items():
        card = _card(pkg)
        variant = card["variants"]["int8"]
        assert variant["file"] == "model.int8.onnx" and variant["numerics"] == "exact"
        assert variant["recipe"]["pair_sum_bound"] <= 32767  # no 16-bit pair sum can saturate
        assert set(variant["agreement"]["towers"]) == set(card["towers"])
        for name, tower in card["towers"].items():
            own = tower["variants"]["int8"]
            agreement, check = own["agreement"], own["integer_products"]
            assert agreement["cases"] >= 12 and agreement["inputs"]
            assert 0.99 <= agreement["min_cosine"] <= agreement["mean_cosine"] <= 1.0, (arch, name, agreement)
            assert check["gemms"] > 0 and check["max_relative_error"] <= 1e-6
            assert own["batch_invariance"]["identical"] and own["batch_invariance"]["rows"] >= 12
            fp32_ops, int8_ops = _ops(pkg / tower["graph"]), _ops(pkg / own["graph"])
            # every constant-weight MatMul/Gemm became an integer GEMM; convolutions (patch embedding,
            # Whisper's front end) stay fp32
            assert int8_ops.count("MatMulIntegerToFloat") == check["gemms"]
            assert int8_ops.count("Conv") == fp32_ops.count("Conv")
        if arch == "siglip":
            # the attention-pooling head's query/key/value weights, sliced out of in_proj_weight inside the
            # fp32 graph, are stored and quantized: the only fp32 MatMuls left multiply two activations
            head = [n for n in onnx.load(str(pkg / "towers" / "image.int8.onnx")).graph.node
                    if n.op_type == "MatMul" and "/head/attention/" in n.name]
            assert len(head) == 2
        towers_agreement = variant["agreement"]["towers"].values()
        assert variant["agreement"]["min_cosine"] == min(t["min_cosine"] for t in towers_agreement)


def test_int8_loads_with_every_tower_self_checked_and_probed(int8_server: Server,
                                                             int8_packages: dict[str, Path]) -> None:
    info = {m["id"]: m for m in int8_server.client.get("/v1/models").json()["data"]}
    for arch, pkg in int8_packages.items():
        served = info[f"{arch}-int8"]
        assert served["ready"] and served["variant"] == "int8" and served["dtype"] == "int8"
        assert served["self_check"]["status"] == "passed"
        towers = _card(pkg)["towers"]
        others = {f"tower:{n}" for n, t in towers.items() if t["graph"] != "model.onnx"}
        assert set(served["self_check"].get("graphs", {})) == others
        assert all(c["status"] == "passed" for c in served["self_check"].get("graphs", {}).values())
        assert set(served["tower_grouping"]) == set(towers)
        assert served["agreement"] == _card(pkg)["variants"]["int8"]["agreement"]
        assert "agreement" not in info[arch]  # fp32 is the reference, not measured against itself


def _vectors(server: Server, model: str, inputs: list[Any]) -> np.ndarray:
    return np.array([d["embedding"] for d in embed(server, {"model": model, "input": inputs})["data"]])


def test_int8_answers_close_to_fp32_and_batched_rows_equal_rows_alone(int8_server: Server,
                                                                      int8_packages: dict[str, Path]) -> None:
    clips = [audio_part(encode_audio(tone(0.3 + 0.5 * i, 16000, seed=i), 16000, "flac"), "flac") for i in range(3)]
    inputs = {"siglip": ["a photo of a cat", "x", *(image_part(picture(20 + 9 * i, 33, 40 + i))
                                                                  for i in range(3))],
              "whisper": clips, "clap": [*clips, "a dog barks"]}
    for arch, parts in inputs.items():
        towers = _card(int8_packages[arch])["towers"]
        floor = min(t["variants"]["int8"]["agreement"]["min_cosine"] for t in towers.values())
        fp32, int8 = _vectors(int8_server, arch, parts), _vectors(int8_server, f"{arch}-int8", parts)
        cos = np.sum(fp32 * int8, axis=1)  # unit vectors
        # new inputs, not the measured ones: allow 0.01 below the recorded floor
        assert np.all(cos >= floor - 0.01), (arch, cos, floor)
        assert not np.array_equal(fp32, int8)  # the int8 graphs answered, not the fp32 ones
        for i, part in enumerate(parts):
            alone = _vectors(int8_server, f"{arch}-int8", [part])[0]
            assert np.array_equal(alone, int8[i]), (arch, i)


def test_int8_keeps_the_contracts_errors(int8_server: Server) -> None:
    error = embed(int8_server, {"model": "whisper-int8", "input": "some text"}, 400)["error"]
    assert error["reason"] == "modality_unsupported"
    long_clip = audio_part(encode_audio(tone(9.0, 8000), 8000))
    error = embed(int8_server, {"model": "clap-int8", "input": long_clip}, 400)["error"]
    assert (error["reason"], error.get("limit")) == ("audio_too_long", 8)
    error = embed(int8_server, {"model": "siglip-int8", "input": "x", "dimensions": 5}, 400)["error"]
    assert error["code"] == "invalid_request"


def test_card_rules_of_a_quantized_variant(int8_packages: dict[str, Path]) -> None:
    from edge_runtime.families.multimodal_embedding.card import check_multimodal_card
    from edge_runtime.packages import PackageError

    card = _card(int8_packages["siglip"])
    check_multimodal_card(card)
    missing = copy.deepcopy(card)
    del missing["towers"]["image"]["variants"]
    with pytest.raises(PackageError, match="every tower has its graph"):
        check_multimodal_card(missing)
    swapped = copy.deepcopy(card)
    swapped["towers"]["image"]["variants"]["int8"]["graph"] = "model.int8.onnx"
    with pytest.raises(PackageError, match="primary"):
        check_multimodal_card(swapped)
    stray = copy.deepcopy(card)
    del stray["variants"]["int8"]
    with pytest.raises(PackageError, match="not variants of the package"):
        check_multimodal_card(stray)


def test_only_exact_int8_is_offered_for_multimodal(tmp_path: Path) -> None:
    import argparse

    from converters.errors import ConversionError
    from converters.multimodal.cli import run

    args = argparse.Namespace(command="export", kind="image-text-embedding", quantize="int8-dynamic", src="x",
                              out=tmp_path / "o")
    with pytest.raises(ConversionError, match="int8"):
        run(args)


def test_a_tower_the_converter_saw_vary_under_batching_runs_alone(int8_packages: dict[str, Path]) -> None:
    """int8 rounding hides most last-bit differences of an fp32 part, so a 3-row probe can pass by chance:
    a tower whose recorded batch check failed is never batched, whatever the probe would say."""
    from edge_runtime.engine import create_session
    from edge_runtime.families.multimodal_embedding.family import MultimodalEmbeddingModel
    from edge_runtime.families.registry import read_package

    package = read_package(int8_packages["siglip"])
    session = create_session(package.graph("int8"), "cpu", 1)
    assert MultimodalEmbeddingModel(package, session).towers["image"].grouping != "alone"
    package.card.raw["towers"]["image"]["variants"]["int8"]["batch_invariance"]["identical"] = False
    model = MultimodalEmbeddingModel(package, session)
    assert model.variant == "int8" and model.towers["image"].grouping == "alone"
    assert model.towers["text"].grouping != "alone"
