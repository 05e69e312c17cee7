"""Multimodal embeddings (issue 12): media decoding, numpy preprocessing, tower parity, the HTTP surface.

Tiny random-weight SigLIP, CLIP and Whisper sources are built once per session, exported with the
converter, and served by one real server; parity compares the server's vectors with Transformers
run on the same sources.
"""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from edge_runtime.api.schema import request_validator, validate_response
from edge_runtime.families.multimodal_embedding.features import image_pixels, log_mel, whisper_real_positions
from edge_runtime.media.audio import AudioLimits, decode_audio
from edge_runtime.media.errors import MediaError
from edge_runtime.media.image import ImageLimits, decode_image
from tests.support.media_samples import audio_part, data_url, encode_audio, image_bytes, image_part, picture, tone
from tests.support.server_harness import Server, embed, write_models_file

PARITY = 1e-5
ARCHS = ("siglip", "clip", "whisper", "clap")

# ---- media decoding, without a server ----------------------------------------------------------

LIMITS = ImageLimits(max_bytes=1 << 20, source_max_pixels=1_000_000)


def _refused(call: Any) -> MediaError:
    with pytest.raises(MediaError) as info:
        call()
    return info.value


@pytest.mark.parametrize("fmt,mime", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_images_decode_in_each_format(fmt: str, mime: str) -> None:
    image = decode_image(image_bytes(picture(40, 30, 1), fmt), LIMITS, mime)
    assert image.size == (40, 30) and image.format == fmt


def test_hostile_images_are_refused_with_fixed_reasons() -> None:
    # A decompression bomb: a tiny file whose header claims 3000 x 2000 pixels; refused from the header.
    bomb = image_bytes(Image.new("L", (3000, 2000)), "PNG")
    assert len(bomb) < 20_000
    err = _refused(lambda: decode_image(bomb, LIMITS, "image/png"))
    assert (err.reason, err.limit) == ("image_too_large", 1_000_000)
    err = _refused(lambda: decode_image(b"x" * (LIMITS.max_bytes + 1), LIMITS))
    assert (err.reason, err.limit) == ("image_too_large", LIMITS.max_bytes)
    png = image_bytes(picture(64, 64, 2), "PNG")
    assert _refused(lambda: decode_image(png[: len(png) // 2], LIMITS)).reason == "image_malformed"
    assert _refused(lambda: decode_image(b"not an image at all", LIMITS)).reason == "image_malformed"
    assert _refused(lambda: decode_image(png, LIMITS, "image/jpeg")).reason == "image_format_mismatch"
    gif = image_bytes(picture(8, 8, 3), "GIF")
    assert _refused(lambda: decode_image(gif, LIMITS)).reason == "image_format_unsupported"
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"  # never handed to Ghostscript
    assert _refused(lambda: decode_image(eps, LIMITS)).reason == "image_malformed"
    frames = [picture(16, 16, s) for s in (4, 5)]
    buf = io.BytesIO()
    frames[0].save(buf, format="PNG", save_all=True, append_images=frames[1:])
    assert _refused(lambda: decode_image(buf.getvalue(), LIMITS, "image/png")).reason == "image_animated"


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "ogg"])
def test_audio_decodes_to_mono_at_the_tower_rate(fmt: str) -> None:
    clip = tone(1.0, 22050)
    samples = decode_audio(encode_audio(clip, 22050, fmt, channels=2), AudioLimits(1 << 20, 5), 16000, fmt)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(len(samples) - 16000) < 1200  # codec priming and padding differ by format
    if fmt in ("wav", "flac"):  # lossless: resampled 22.05 -> 16 kHz, the tone keeps its level
        assert abs(float(np.sqrt(np.mean(samples[1000:15000] ** 2))) - 0.3 / np.sqrt(2)) < 0.02


def test_hostile_audio_is_refused_with_fixed_reasons() -> None:
    limits = AudioLimits(max_bytes=1 << 20, max_seconds=2)
    long_wav = encode_audio(tone(3.0, 8000), 8000, "wav")
    err = _refused(lambda: decode_audio(long_wav, limits, 16000, "wav"))
    assert (err.reason, err.limit) == ("audio_too_long", 2)
    # An audio bomb: a minute of silence compresses to a few kB; refused from the container's duration.
    silence = encode_audio(np.zeros(60 * 16000, dtype=np.float32), 16000, "flac")
    assert len(silence) < 50_000
    err = _refused(lambda: decode_audio(silence, limits, 16000, "flac"))
    assert (err.reason, err.limit) == ("audio_too_long", 2)
    wav = encode_audio(tone(0.5, 16000), 16000, "wav")
    assert _refused(lambda: decode_audio(wav, limits, 16000, "mp3")).reason == "audio_format_mismatch"
    assert _refused(lambda: decode_audio(b"\x00garbage" * 50, limits, 16000, "wav")).reason == "audio_malformed"
    assert _refused(lambda: decode_audio(wav, AudioLimits(100, 2), 16000, "wav")).reason == "audio_too_large"
    png = image_bytes(picture(8, 8, 1), "PNG")
    assert _refused(lambda: decode_audio(png, limits, 16000, "wav")).reason in ("audio_malformed",
                                                                                 "audio_format_unsupported")


# ---- numpy preprocessing equals the reference processors --------------------------------------


def test_image_preprocessing_equals_the_transformers_processors() -> None:
    from transformers import CLIPImageProcessor, SiglipImageProcessor

    siglip = SiglipImageProcessor(size={"height": 48, "width": 48})
    clip = CLIPImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 36, "width": 36})
    specs = [(siglip, {"resize": {"height": 48, "width": 48}, "resample": 3, "rescale": 1 / 255,
                       "mean": [0.5] * 3, "std": [0.5] * 3}),
             (clip, {"resize": {"shortest_edge": 40}, "crop": {"height": 36, "width": 36}, "resample": 3,
                     "rescale": 1 / 255, "mean": list(clip.image_mean), "std": list(clip.image_std)})]
    for image in (picture(50, 37, 1), picture(20, 71, 2), picture(33, 33, 3, "L"), picture(90, 12, 4, "RGBA")):
        for proc, spec in specs:
            want = proc(image.convert("RGB"), return_tensors="np")["pixel_values"][0]
            np.testing.assert_array_equal(image_pixels(image, spec), want)


def test_log_mel_equals_whisper_feature_extractor_numpy_path() -> None:
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=80, chunk_length=2)
    spec = {"sampling_rate": 16000, "n_fft": 400, "hop_length": 160, "n_mels": 80, "chunk_length": 2}
    for seconds in (0.3, 1.7, 2.6):  # shorter than, and longer than, the window (first window read)
        clip = tone(seconds, 16000, seed=int(seconds * 10))
        window = np.zeros(fe.n_samples, dtype=np.float32)
        window[: min(len(clip), fe.n_samples)] = clip[: fe.n_samples]
        np.testing.assert_array_equal(log_mel(clip, spec), fe._np_extract_fbank_features(window[None], "cpu")[0])
        mask = fe([clip], sampling_rate=16000, return_attention_mask=True, return_tensors="np")["attention_mask"]
        want = (int(mask.sum()) - 1) // 2 + 1  # WhisperEncoder._get_feat_extract_output_lengths
        assert whisper_real_positions(len(clip), spec, 100) == want


# ---- the packages and the server ---------------------------------------------------------------


@pytest.fixture(scope="session")
def mm_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """(HF source, package) per architecture, built once per session."""
    from converters.multimodal.fixture import build_multimodal_fixture

    root = tmp_path_factory.mktemp("multimodal")
    out: dict[str, tuple[Path, Path]] = {}
    for arch in ARCHS:
        result = build_multimodal_fixture(arch, root / f"{arch}-pkg", source_dir=root / f"{arch}-src")
        out[arch] = (root / f"{arch}-src", result.path)
    return out


@pytest.fixture(scope="session")
def mm_server(mm_sources: dict[str, tuple[Path, Path]], fixture_package: Any,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = [{"name": arch, "package": str(pkg), "device": "cpu", "threads": 1}
              for arch, (_, pkg) in mm_sources.items()]
    models.append({"name": "emb", "package": str(fixture_package("embedding")), "device": "cpu", "threads": 1})
    srv = Server(write_models_file(tmp_path_factory.mktemp("mm-server") / "models.yaml", models),
                 "--max-request-bytes", str(8 << 20))
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def _unit(v: Any) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    return v / np.linalg.norm(v)


def test_the_contract_admits_the_content_parts_and_nothing_else() -> None:
    import jsonschema

    validator = request_validator("/v1/embeddings")
    good = ["text", {"type": "text", "text": "t"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            {"type": "input_audio", "input_audio": {"data": "AA==", "format": "flac"}}]
    validator.validate({"input": good})
    for part in good[1:]:
        validator.validate({"input": part})
    for bad in ({"type": "video_url", "video_url": {"url": "x"}}, {"type": "input_audio", "input_audio": {"data": "A"}},
                {"type": "input_audio", "input_audio": {"data": "A", "format": "aac"}}, {"type": "text"}):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate({"input": [bad]})


def test_bundle_tasks_embed_images(mm_server: Server) -> None:
    body = {"tasks": [{"id": "img", "embeddings": {"model": "siglip", "input": [image_part(picture(24, 24, 8)), "x"]}},
                      {"id": "snd", "embeddings": {"model": "whisper", "input": image_part(picture(8, 8, 1))}}]}
    response = mm_server.client.post("/v1/bundle", json=body)
    validate_response("/v1/bundle", "post", response.status_code, response.json())
    results = {r["id"]: r for r in response.json()["results"]}
    assert results["img"]["status"] == 200 and len(results["img"]["embeddings"]["data"]) == 2
    assert results["snd"]["status"] == 400 and results["snd"]["error"]["reason"] == "modality_unsupported"


def test_card_records_parity_and_the_long_audio_rule(mm_sources: dict[str, tuple[Path, Path]]) -> None:
    from edge_runtime.families.registry import read_package

    for _, pkg in mm_sources.values():
        card = read_package(pkg).card.raw
        towers = card["verification"]["towers"]
        assert set(towers) == set(card["towers"]) and card["verification"]["max_abs_diff"] <= PARITY
        assert all(t["preprocess_max_abs_diff"] == 0.0 for n, t in towers.items() if n != "text")
    audio = read_package(mm_sources["whisper"][1]).card.raw["towers"]["audio"]
    assert audio["long_audio"] == "windows" and audio["pooling"] == "mean_real_frames"


@pytest.mark.parametrize("arch", ["siglip", "clip"])
def test_image_text_parity_with_transformers(mm_server: Server, mm_sources: dict[str, tuple[Path, Path]],
                                             arch: str) -> None:
    import torch
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    src = mm_sources[arch][0]
    model = AutoModel.from_pretrained(src, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(src)
    processor = AutoImageProcessor.from_pretrained(src, use_fast=False)
    texts = ["a photo of a cat", "two dogs in the snow"]
    images = [picture(64, 48, 11), picture(30, 90, 12)]
    answer = embed(mm_server, {"model": arch, "input": [*texts, *(image_part(i) for i in images)]})
    got = [np.asarray(d["embedding"]) for d in answer["data"]]
    # SigLIP was trained on text padded to its full length, CLIP reads a mask: as their model cards say.
    padding = {"padding": "max_length", "max_length": 16} if arch == "siglip" else {}
    with torch.no_grad():
        for i, text in enumerate(texts):
            enc = tokenizer(text, return_tensors="pt", **padding)
            kwargs = {"input_ids": enc["input_ids"]} if arch == "siglip" else dict(enc)
            kwargs.pop("token_type_ids", None)
            want = _unit(model.get_text_features(**kwargs).numpy())
            assert np.max(np.abs(got[i] - want)) <= PARITY
        for j, image in enumerate(images):
            pixels = torch.from_numpy(processor(image, return_tensors="np")["pixel_values"])
            want = _unit(model.get_image_features(pixel_values=pixels).numpy())
            assert np.max(np.abs(got[len(texts) + j] - want)) <= PARITY


def _wav_samples(clip: bytes) -> np.ndarray:
    """The WAV's samples read by the reference itself, not through PyAV."""
    with wave.open(io.BytesIO(clip)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0


def test_whisper_parity_with_transformers(mm_server: Server, mm_sources: dict[str, tuple[Path, Path]]) -> None:
    import torch
    from transformers import AutoModel, WhisperFeatureExtractor

    src = mm_sources["whisper"][0]
    encoder = AutoModel.from_pretrained(src, attn_implementation="eager").eval().get_encoder()
    fe = WhisperFeatureExtractor.from_pretrained(src)
    clips = [encode_audio(tone(s, 16000, f, seed=int(f)), 16000, "wav") for s, f in ((0.45, 300.0), (1.3, 700.0))]
    answer = embed(mm_server, {"model": "whisper", "input": [audio_part(c) for c in clips]})
    for clip, item in zip(clips, answer["data"]):
        samples = _wav_samples(clip)
        window = np.zeros(fe.n_samples, dtype=np.float32)
        window[: len(samples)] = samples
        features = torch.from_numpy(fe._np_extract_fbank_features(window[None], "cpu"))
        mask = fe([samples], sampling_rate=16000, return_attention_mask=True, return_tensors="pt")["attention_mask"]
        real = int(encoder._get_feat_extract_output_lengths(mask.sum(-1))[0])
        with torch.no_grad():
            hidden = encoder(input_features=features).last_hidden_state[0, :real]
        want = _unit(hidden.double().mean(0).numpy())
        assert np.max(np.abs(np.asarray(item["embedding"]) - want)) <= PARITY
    assert answer["usage"]["prompt_tokens"] > 0


def test_clap_parity_with_transformers(mm_server: Server, mm_sources: dict[str, tuple[Path, Path]]) -> None:
    """CLAP (unfused): text and audio in one space; clips shorter than the window are repeat-padded."""
    import torch
    from transformers import AutoModel, AutoTokenizer, ClapFeatureExtractor

    src = mm_sources["clap"][0]
    model = AutoModel.from_pretrained(src).eval()
    tokenizer = AutoTokenizer.from_pretrained(src)
    fe = ClapFeatureExtractor.from_pretrained(src)
    clips = [encode_audio(tone(s, 16000, f, seed=int(f)), 16000, "wav") for s, f in ((0.6, 500.0), (1.5, 900.0))]
    answer = embed(mm_server, {"model": "clap", "input": ["a dog barking", *(audio_part(c) for c in clips)],
                               "options": {"return_meta": True}})
    got = [np.asarray(d["embedding"]) for d in answer["data"]]
    assert answer["meta"]["representation"]["space"] == "audio-text"
    with torch.no_grad():
        enc = tokenizer("a dog barking", return_tensors="pt")
        want = _unit(model.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]))
        assert np.max(np.abs(got[0] - want)) <= PARITY
        for clip, vector in zip(clips, got[1:]):
            features = fe(_wav_samples(clip), sampling_rate=16000, return_tensors="pt")["input_features"]
            want = _unit(model.get_audio_features(input_features=features).numpy())
            assert np.max(np.abs(vector - want)) <= PARITY


def test_long_clips_are_read_in_windows_and_pooled(mm_server: Server, mm_sources: dict[str, tuple[Path, Path]]) -> None:
    """A clip longer than the tower's window (2 s in the fixtures) is read window by window, each as
    Transformers reads a clip of that length, and pooled: Whisper over every real encoder position,
    CLAP's vectors weighted by seconds; past the card's budget (8 s) it is refused."""
    import torch
    from transformers import AutoModel, ClapFeatureExtractor, WhisperFeatureExtractor

    clip = encode_audio(tone(5.3, 16000, 620.0, seed=5), 16000, "wav")
    samples = _wav_samples(clip)
    windows = [samples[i: i + 32000] for i in range(0, len(samples), 32000)]
    assert [len(w) for w in windows] == [32000, 32000, 20800]

    src = mm_sources["whisper"][0]
    encoder = AutoModel.from_pretrained(src, attn_implementation="eager").eval().get_encoder()
    fe = WhisperFeatureExtractor.from_pretrained(src)
    hidden = []
    for w in windows:
        padded = np.zeros(fe.n_samples, dtype=np.float32)
        padded[: len(w)] = w
        mask = fe([w], sampling_rate=16000, return_attention_mask=True, return_tensors="pt")["attention_mask"]
        real = int(encoder._get_feat_extract_output_lengths(mask.sum(-1))[0])
        with torch.no_grad():
            features = torch.from_numpy(fe._np_extract_fbank_features(padded[None], "cpu"))
            hidden.append(encoder(input_features=features).last_hidden_state[0, :real].double())
    want = _unit(torch.cat(hidden).mean(0).numpy())
    answer = embed(mm_server, {"model": "whisper", "input": [audio_part(clip)]})
    assert np.max(np.abs(np.asarray(answer["data"][0]["embedding"]) - want)) <= PARITY
    assert answer["data"][0]["input"]["windows"] == 3
    assert answer["usage"]["prompt_tokens"] == sum(len(h) for h in hidden)

    src = mm_sources["clap"][0]
    model = AutoModel.from_pretrained(src).eval()
    fe = ClapFeatureExtractor.from_pretrained(src)
    with torch.no_grad():
        vectors = [model.get_audio_features(input_features=fe(w, sampling_rate=16000, return_tensors="pt")
                                            ["input_features"]).double().numpy()[0] for w in windows]
    want = _unit(np.average(np.stack(vectors), axis=0, weights=[len(w) for w in windows]))
    answer = embed(mm_server, {"model": "clap", "input": [audio_part(clip)]})
    assert np.max(np.abs(np.asarray(answer["data"][0]["embedding"]) - want)) <= PARITY
    assert answer["data"][0]["input"]["windows"] == 3

    too_long = embed(mm_server, {"model": "whisper", "input": [audio_part(encode_audio(tone(8.5, 16000), 16000))]},
                     status=400)["error"]
    assert (too_long["reason"], too_long["limit"]) == ("audio_too_long", 8)


def test_every_input_form_with_the_openai_client(mm_server: Server) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{mm_server.url}/v1", api_key="unused", max_retries=0)
    image = picture(40, 40, 21)
    siglip_inputs: list[Any] = ["plain string", {"type": "text", "text": "a text part"}, image_part(image),
                                image_part(image, "JPEG", "image/jpeg"), image_part(image, "WEBP", "image/webp")]
    whisper_inputs = [audio_part(encode_audio(tone(0.8, 16000), 16000, fmt), fmt)
                      for fmt in ("wav", "mp3", "flac", "ogg")]
    for model, inputs in (("siglip", siglip_inputs), ("clip", siglip_inputs[:3]), ("whisper", whisper_inputs)):
        default = client.embeddings.create(model=model, input=inputs)  # base64, the client's default
        floats = client.embeddings.create(model=model, input=inputs, encoding_format="float")
        assert len(default.data) == len(inputs) == len(floats.data)
        for a, b in zip(default.data, floats.data):
            assert np.array_equal(np.asarray(a.embedding, np.float32), np.asarray(b.embedding, np.float32))
            assert abs(np.linalg.norm(b.embedding) - 1.0) < 1e-5
        small = client.embeddings.create(model=model, input=inputs[:3], dimensions=8, encoding_format="float")
        assert all(len(d.embedding) == 8 for d in small.data)
    # PNG is lossless: the data URL and the same pixels as WebP (lossy) differ, PNG twice does not.
    got = client.embeddings.create(model="siglip", input=[siglip_inputs[2], image_part(image)], encoding_format="float")
    assert got.data[0].embedding == got.data[1].embedding


def test_text_and_image_share_one_space(mm_server: Server) -> None:
    meta = {"options": {"return_meta": True}}
    text = embed(mm_server, {"model": "siglip", "input": "a cat", **meta})
    image = embed(mm_server, {"model": "siglip", "input": image_part(picture(32, 32, 5)), **meta})
    mixed = embed(mm_server, {"model": "siglip", "input": ["a cat", image_part(picture(32, 32, 5))], **meta})
    tag = text["meta"]["representation"]
    assert tag == image["meta"]["representation"] == mixed["meta"]["representation"]
    assert tag["space"] == "image-text" and tag["modality"] == "image+text" and set(tag["towers"]) == {"image", "text"}
    assert len(text["data"][0]["embedding"]) == len(image["data"][0]["embedding"]) == tag["dimension"]
    # The mixed request gives each item what it gets alone.
    assert mixed["data"][0]["embedding"] == text["data"][0]["embedding"]
    assert mixed["data"][1]["embedding"] == image["data"][0]["embedding"]
    small = embed(mm_server, {"model": "siglip", "input": "a cat", "dimensions": 8, **meta})
    assert small["meta"]["representation"]["dimension"] == 8 != tag["dimension"]
    audio = embed(mm_server, {"model": "whisper", "input": audio_part(encode_audio(tone(0.5, 16000), 16000)), **meta})
    assert audio["meta"]["representation"]["model_sha256"] != tag["model_sha256"]
    assert audio["meta"]["representation"]["space"] == "audio"


def test_usage_counts_each_items_tokens(mm_server: Server) -> None:
    text = embed(mm_server, {"model": "siglip", "input": "a cat"})["usage"]["prompt_tokens"]
    image = embed(mm_server, {"model": "siglip", "input": image_part(picture(32, 32, 1))})["usage"]["prompt_tokens"]
    assert image == 16  # 32 x 32 pixels in 8 x 8 patches
    both = embed(mm_server, {"model": "siglip", "input": ["a cat", image_part(picture(32, 32, 1))]})["usage"]
    assert both["prompt_tokens"] == text + image == both["total_tokens"]
    half = embed(mm_server, {"model": "whisper", "input": audio_part(encode_audio(tone(0.5, 16000), 16000))})
    assert half["usage"]["prompt_tokens"] == 25  # 0.5 s: 50 mel frames, 25 encoder positions


def test_batched_media_equal_media_alone(mm_server: Server) -> None:
    """Several images (or clips) in one request share forwards when their tower's probe allowed it;
    every vector must equal the one the item gets alone."""
    images = [image_part(picture(30 + 7 * i, 40, 30 + i)) for i in range(4)]
    together = embed(mm_server, {"model": "clip", "input": images})["data"]
    for i, part in enumerate(images):
        assert embed(mm_server, {"model": "clip", "input": part})["data"][0]["embedding"] == together[i]["embedding"]
    clips = [audio_part(encode_audio(tone(0.3 + 0.4 * i, 16000, seed=i), 16000, "flac"), "flac") for i in range(3)]
    together = embed(mm_server, {"model": "whisper", "input": clips})["data"]
    for i, part in enumerate(clips):
        assert embed(mm_server, {"model": "whisper", "input": part})["data"][0]["embedding"] == together[i]["embedding"]
    info = {m["id"]: m for m in mm_server.client.get("/v1/models").json()["data"]}
    assert info["siglip"]["embedding"]["modalities"] == ["image", "text"]
    assert info["whisper"]["embedding"]["modalities"] == ["audio"]


def test_missing_modality_is_400_naming_the_models_modalities(mm_server: Server) -> None:
    wav = audio_part(encode_audio(tone(0.3, 16000), 16000))
    for model, part, has in (("whisper", "some text", "audio"), ("siglip", wav, "image, text"),
                             ("emb", image_part(picture(8, 8, 1)), "text")):
        error = embed(mm_server, {"model": model, "input": ["x", part] if model != "whisper" else [part]}, 400)["error"]
        assert error["code"] == "invalid_request" and error["reason"] == "modality_unsupported"
        assert has in error["message"]


def test_hostile_media_over_http(mm_server: Server) -> None:
    bomb = {"type": "image_url", "image_url": {"url": data_url(image_bytes(Image.new("L", (3000, 2000)), "PNG"),
                                                                 "image/png")}}
    huge = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * (3 << 20)}}
    mislabelled = image_part(picture(16, 16, 1), "PNG", "image/jpeg")
    cases = [
        ({"model": "siglip", "input": ["ok", bomb]}, "image_too_large", 4_000_000),
        ({"model": "siglip", "input": huge}, "image_too_large", 2 * 1024 * 1024),
        ({"model": "clip", "input": mislabelled}, "image_format_mismatch", None),
        ({"model": "clip", "input": {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}},
         "image_url_unsupported", None),
        ({"model": "whisper", "input": audio_part(encode_audio(tone(9.0, 8000), 8000))}, "audio_too_long", 8),
        ({"model": "whisper", "input": audio_part(encode_audio(tone(0.5, 16000), 16000), "ogg")},
         "audio_format_mismatch", None),
        ({"model": "whisper", "input": audio_part(encode_audio(tone(0.5, 16000), 16000, "flac")[:300], "flac")},
         "audio_malformed", None),
    ]
    for body, reason, limit in cases:
        error = embed(mm_server, body, 400)["error"]
        assert error["code"] == "invalid_request" and error["reason"] == reason, error
        assert error.get("limit") == limit
    aac = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aac"}}
    bad = mm_server.client.post("/v1/embeddings", json={"model": "whisper", "input": aac})
    assert bad.status_code == 400 and bad.json()["error"]["reason"] == "audio_format_unsupported"


def test_text_items_keep_their_own_errors(mm_server: Server) -> None:
    answer = embed(mm_server, {"model": "siglip", "input": ["word " * 100, image_part(picture(16, 16, 2))]})
    assert answer["data"][0]["error"] == "max_length_exceeded" and answer["data"][0]["message"]
    assert answer["data"][1]["embedding"] is not None
    truncated = embed(mm_server, {"model": "siglip", "input": "word " * 100, "options": {"overflow": "truncate"}})
    read = truncated["data"][0]["input"]
    assert truncated["data"][0]["embedding"] is not None and read["processed_tokens"] == 16 and read["truncated"]
    assert truncated["usage"]["prompt_tokens"] == read["tokens"] > 16  # the input's tokens, as the encoders count


def test_base64_vectors_decode_to_the_float_ones(mm_server: Server) -> None:
    body = {"model": "siglip", "input": [image_part(picture(20, 20, 3)), "text"]}
    floats = embed(mm_server, {**body, "encoding_format": "float"})["data"]
    encoded = embed(mm_server, {**body, "encoding_format": "base64"})["data"]
    for f, e in zip(floats, encoded):
        assert np.frombuffer(base64.b64decode(e["embedding"]), dtype="<f4").tolist() == f["embedding"]


def _forwards(server: Server, model: str) -> tuple[float, float]:
    """(forwards, rows) the model has run so far, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    count = rows = 0.0
    for family in text_string_to_metric_families(server.client.get("/metrics").text):
        for sample in family.samples:
            if sample.labels.get("model") == model and sample.name.endswith("batch_rows_count"):
                count = sample.value
            if sample.labels.get("model") == model and sample.name.endswith("batch_rows_sum"):
                rows = sample.value
    return count, rows


def test_clips_of_different_lengths_share_one_forward(mm_server: Server) -> None:
    """A Whisper clip always fills its window: short and long clips plan as equals and share a forward."""
    before = _forwards(mm_server, "whisper")
    parts = [audio_part(encode_audio(tone(s, 16000, seed=9), 16000)) for s in (0.2, 1.9, 0.9)]
    embed(mm_server, {"model": "whisper", "input": parts})
    after = _forwards(mm_server, "whisper")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 3)


def test_multimodal_card_rules(mm_sources: dict[str, tuple[Path, Path]]) -> None:
    import copy

    from edge_runtime.families.multimodal_embedding.card import check_multimodal_card
    from edge_runtime.families.registry import read_package
    from edge_runtime.packages import PackageError

    card = read_package(mm_sources["siglip"][1]).card.raw
    check_multimodal_card(card)

    def space_without_image(c: dict[str, Any]) -> None:
        c["space"]["towers"] = ["text"]

    def other_dimension(c: dict[str, Any]) -> None:
        c["towers"]["image"]["dimension"] = 7

    def two_primaries(c: dict[str, Any]) -> None:
        c["towers"]["image"]["graph"] = "model.onnx"

    def no_pixel_limit(c: dict[str, Any]) -> None:
        del c["limits"]["image_source_max_pixels"]

    for mutate, words in ((space_without_image, "one space"), (other_dimension, "vectors of one size"),
                          (two_primaries, "exactly one tower"), (no_pixel_limit, "image_source_max_pixels")):
        bad = copy.deepcopy(card)
        mutate(bad)
        with pytest.raises(PackageError, match=words):
            check_multimodal_card(bad)


def test_a_tower_whose_golden_cases_disagree_fails_the_load(mm_sources: dict[str, tuple[Path, Path]],
                                                            tmp_path: Path) -> None:
    import json
    import shutil

    from edge_runtime.engine import create_session
    from edge_runtime.families.multimodal_embedding.family import MultimodalEmbeddingModel
    from edge_runtime.families.registry import read_package
    from edge_runtime.packages.golden import golden_bytes, read_golden
    from edge_runtime.packages.manifest import build_manifest

    pkg = tmp_path / "siglip"
    shutil.copytree(mm_sources["siglip"][1], pkg)
    case = read_golden(pkg / "towers" / "image.golden.npz")[0]
    wrong = {k: v + 0.01 for k, v in case.outputs.items()}  # above the 1e-3 tolerance
    (pkg / "towers" / "image.golden.npz").write_bytes(golden_bytes([(case.feeds, wrong)]))
    (pkg / "MANIFEST.json").unlink()
    (pkg / "MANIFEST.json").write_text(json.dumps(build_manifest(pkg)))
    package = read_package(pkg)  # a consistent package: only running the tower can tell
    with pytest.raises(RuntimeError, match="tower:image graph golden outputs differ"):
        MultimodalEmbeddingModel(package, create_session(package.graph("fp32"), "cpu", 1))
