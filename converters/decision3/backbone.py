"""Our own torch forward of the Qwen3.5 text model (Transformers 5's ``Qwen3_5TextModel`` math), built
to export as the decision3 text core (docs/decision3.md: the exact graph interface).

Why not Transformers' forward: it does not export (``linalg_solve_triangular`` and ``aten::diff`` are
unsupported at opset 18, and its chunk loop would be frozen at the traced length), and Transformers 5
is not in the exporter's environment. This module reuses the checkpoint's tensors under their HF
``Qwen3_5TextModel`` names (no ``language_model.`` prefix) and follows the config's ``layer_types``
literally, so pruned, irregular patterns build as written.

- Embeddings are outside the graph: ``inputs_embeds`` in.
- Gated DeltaNet layers: in-projections, a causal depthwise conv1d continuing from ``past_conv``, the
  chunked gated delta rule (chunk 64, Transformers' algorithm and order) continuing from
  ``past_recurrent``, gated RMSNorm, out-projection. The in-chunk unit-triangular solve is an exact
  recursive block inversion (:func:`unit_lower_inverse`), never the nilpotent product series, which
  blows up on correlated keys (converters/decision3/stress.py proves both). The loop over chunks is a
  scripted loop, so the ONNX graph holds a Loop and serves every length.
- Right padding: padded positions get ``g = 0`` and ``beta = 0`` (the recurrent state passes through
  them unchanged) and the new conv state is gathered at each row's last real token, so a padded row's
  outputs and states equal the row run alone.
- Full-attention layers: gated (``q_proj`` holds query and gate per head), zero-centred q/k norms,
  partial interleaved M-RoPE over ``[B, 3, q]`` positions, GQA, keys and values continuing from the
  past. ``causal``: a query sees every real key up to itself; ``noncausal_full_attention``: every real
  key of its row, past included (upstream's hook: the full-attention mask is the padding mask alone).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edge_runtime.engine.causal import ATTENTION_MASK, HIDDEN, POSITION_IDS, PRESENT_PREFIX
from edge_runtime.engine.causal import PAST_PREFIX as KV_PREFIX
from edge_runtime.engine.recurrent import CAUSAL, CONV_PREFIX, INPUTS_EMBEDS, NONCAUSAL, RECURRENT_PREFIX

LINEAR, FULL = "linear_attention", "full_attention"
ATTENTION_MODES: tuple[str, ...] = (CAUSAL, NONCAUSAL)
#: Transformers' chunk size for the chunked gated delta rule; the graph pads each row's q to it.
CHUNK = 64
#: The additive bias of a masked key (float32's lowest, as Transformers' eager masks use): finite, so
#: a fully masked row can never turn into NaN that the GDN layers would then carry.
MASKED = float(np.finfo(np.float32).min)



def _state_names(layer_types: Sequence[str], past: bool) -> list[str]:
    """Each layer's state names in order (past inputs or present outputs), spelled as the engine reads them."""
    names: list[str] = []
    for i, kind in enumerate(layer_types):
        if kind == LINEAR:
            conv, recurrent = (CONV_PREFIX, RECURRENT_PREFIX) if past else ("present_conv.", "present_recurrent.")
            names += [f"{conv}{i}", f"{recurrent}{i}"]
        else:
            kv = KV_PREFIX if past else PRESENT_PREFIX
            names += [f"{kv}{i}.key", f"{kv}{i}.value"]
    return names


def graph_input_names(layer_types: Sequence[str]) -> list[str]:
    """The text core's inputs, in order: embeds, mask, positions, then each layer's past states."""
    return [INPUTS_EMBEDS, ATTENTION_MASK, POSITION_IDS, *_state_names(layer_types, past=True)]


def graph_output_names(layer_types: Sequence[str]) -> list[str]:
    """The text core's outputs, in order: the final-normed hidden states, then each layer's new states."""
    return [HIDDEN, *_state_names(layer_types, past=False)]


# ---- the in-chunk solve ------------------------------------------------------------------------


def block_masks(chunk: int = CHUNK) -> list[Tensor]:
    """E_s for s = 1, 2, ..., chunk/2: ones on the sub-diagonal s x s block of every 2s x 2s diagonal block."""
    if chunk < 2 or chunk & (chunk - 1):
        raise ValueError(f"the chunk size must be a power of two >= 2, not {chunk}")
    i = torch.arange(chunk)[:, None]
    j = torch.arange(chunk)[None, :]
    masks = []
    s = 1
    while s < chunk:
        same = (i // (2 * s)) == (j // (2 * s))
        masks.append((same & ((i // s) % 2 == 1) & ((j // s) % 2 == 0)).float())
        s *= 2
    return masks


def unit_lower_inverse(a: Tensor, masks: Sequence[Tensor]) -> Tensor:
    """(I + A)^-1 for A strictly lower triangular [..., C, C], by exact recursive block inversion.

    D starts as I (the inverse of every 1 x 1 diagonal block); each level joins pairs of diagonal
    blocks: [[D1, 0], [A21, D2]]^-1 = [[D1, 0], [-D2 A21 D1, D2]], i.e. D <- D - D((A * E_s) D).
    log2(C) levels of two matmuls; as exact as substitution (stress.py), unlike the product series.
    """
    size = a.shape[-1]
    d = torch.eye(size, dtype=a.dtype).expand_as(a)
    for e in masks:
        d = d - d @ ((a * e) @ d)
    return d


def _chunk_scan_eager(query: Tensor, key: Tensor, new_values: Tensor, k_cumdecay: Tensor, intra: Tensor,
                chunk_decay: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """The sequential scan over chunks ([B, H, N, C, D] inputs): scripted, so it exports as a Loop."""
    outs: list[Tensor] = []
    for i in range(query.shape[2]):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
        outs.append(query[:, :, i] @ state + intra[:, :, i] @ v_new)
        state = state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new
    return torch.stack(outs, 2), state


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script: the TorchScript exporter needs it
    _chunk_scan = torch.jit.script(_chunk_scan_eager)


def chunk_gated_delta(query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                      masks: Sequence[Tensor], chunk: int = CHUNK,
                      inverse: Callable[[Tensor, Sequence[Tensor]], Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """Transformers' ``torch_chunk_gated_delta_rule`` (l2-normed q/k, fp32) with the block-inverse solve.

    query/key [B, T, H, Dk] (already repeated to the value heads), value [B, T, H, Dv], g/beta [B, T, H],
    state [B, H, Dk, Dv]. Returns the output [B, T, H, Dv] and the state after the last position.
    ``inverse`` replaces the solve (stress.py's negative control); None is :func:`unit_lower_inverse`.
    """
    length = query.shape[1]
    query, key, value, beta, g = (x.transpose(1, 2) for x in (query, key, value, beta, g))
    query = query * torch.rsqrt((query * query).sum(dim=-1, keepdim=True) + 1e-6)
    key = key * torch.rsqrt((key * key).sum(dim=-1, keepdim=True) + 1e-6)
    query = query * (query.shape[-1] ** -0.5)
    pad = (chunk - length % chunk) % chunk
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    b, h = query.shape[0], query.shape[1]
    query, key, k_beta, v_beta = (x.reshape(b, h, -1, chunk, x.shape[-1]) for x in (query, key, k_beta, v_beta))
    g = g.reshape(b, h, -1, chunk)
    upper = torch.ones(chunk, chunk, dtype=torch.bool).triu(1)
    cum = g.cumsum(dim=3)
    pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
    ut_system = (k_beta @ key.transpose(-1, -2)) * pairwise
    intra = (query @ key.transpose(-1, -2)) * pairwise
    decayed_k_beta = k_beta * cum.exp().unsqueeze(-1)
    strictly_lower = ut_system.masked_fill(~torch.ones(chunk, chunk, dtype=torch.bool).tril(-1), 0.0)
    solve = (inverse or unit_lower_inverse)(strictly_lower, masks)
    new_values = solve @ v_beta
    k_cumdecay = solve @ decayed_k_beta
    query = query * cum.exp().unsqueeze(-1)
    key = key * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    out, state = _chunk_scan(query, key, new_values, k_cumdecay, intra, chunk_decay, state)
    out = out.reshape(b, h, -1, out.shape[-1])[:, :, :length]
    return out.transpose(1, 2), state


# ---- layers -------------------------------------------------------------------------------------


def _zero_centred(weight: Tensor) -> Tensor:
    # Qwen3.5's RMSNorm scales by (1 + w), computed in fp32 as Transformers does at run time
    return 1.0 + weight.float()


def _rms(x: Tensor, scale: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale


class _Module(nn.Module):
    def _put(self, name: str, value: Tensor) -> None:
        self.register_buffer(name, value.detach().to(torch.float32).contiguous())

    def _t(self, name: str) -> Tensor:
        value = getattr(self, name)
        assert isinstance(value, Tensor)
        return value


class GatedDeltaNet(_Module):
    """One linear-attention layer: conv state and recurrent state in, output and new states out."""

    def __init__(self, w: Mapping[str, Tensor], cfg: Mapping[str, Any], masks: Sequence[Tensor]) -> None:
        super().__init__()
        self.hk, self.hv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
        self.dk, self.dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
        if self.hv % self.hk:
            raise ValueError(f"linear_num_value_heads {self.hv} is not a multiple of linear_num_key_heads {self.hk}")
        self.kernel = int(cfg["linear_conv_kernel_dim"])
        self.eps = float(cfg["rms_norm_eps"])
        self.masks = list(masks)
        for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
            self._put(name, w[f"{name}.weight"])
        self._put("conv", w["conv1d.weight"])  # [conv_dim, 1, kernel]
        self._put("neg_a", -w["A_log"].float().exp())
        self._put("dt_bias", w["dt_bias"])
        self._put("norm", w["norm.weight"])
        self.conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        if tuple(self._t("conv").shape) != (self.conv_dim, 1, self.kernel):
            raise ValueError(f"conv1d.weight has shape {tuple(self._t('conv').shape)}, "
                             f"expected {(self.conv_dim, 1, self.kernel)}")

    def forward(self, x: Tensor, real: Tensor, lengths: Tensor, past_conv: Tensor,
                past_state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t = x.shape[0], x.shape[1]
        mixed = F.linear(x, self._t("in_proj_qkv")).transpose(1, 2)  # [B, C, T]
        z = F.linear(x, self._t("in_proj_z")).reshape(b, t, self.hv, self.dv)
        beta = torch.sigmoid(F.linear(x, self._t("in_proj_b")))
        a = F.linear(x, self._t("in_proj_a"))
        window = torch.cat([past_conv, mixed], dim=2)  # [B, C, kernel - 1 + T]
        conv = F.conv1d(window, self._t("conv"), groups=self.conv_dim)
        # the last kernel-1 inputs up to each row's last real token (window index lengths .. lengths+k-2)
        taps = lengths[:, None] + torch.arange(self.kernel - 1)[None, :]
        present_conv = torch.gather(window, 2, taps[:, None, :].expand(b, self.conv_dim, self.kernel - 1))
        mixed = F.silu(conv).transpose(1, 2)
        kd = self.hk * self.dk
        query = mixed[..., :kd].reshape(b, t, self.hk, self.dk)
        key = mixed[..., kd:2 * kd].reshape(b, t, self.hk, self.dk)
        value = mixed[..., 2 * kd:].reshape(b, t, self.hv, self.dv)
        g = self._t("neg_a") * F.softplus(a + self._t("dt_bias"))
        # padding: no decay and no write, so the state passes through padded positions unchanged
        g = g * real[:, :, None]
        beta = beta * real[:, :, None]
        if self.hv != self.hk:
            rep = self.hv // self.hk
            query = query[:, :, :, None].expand(b, t, self.hk, rep, self.dk).reshape(b, t, self.hv, self.dk)
            key = key[:, :, :, None].expand(b, t, self.hk, rep, self.dk).reshape(b, t, self.hv, self.dk)
        core, state = chunk_gated_delta(query, key, value, g, beta, past_state, self.masks)
        core = core.reshape(-1, self.dv)
        z = z.reshape(-1, self.dv)
        core = core * torch.rsqrt(core.pow(2).mean(-1, keepdim=True) + self.eps)
        core = self._t("norm") * core
        core = core * F.silu(z)
        out = F.linear(core.reshape(b, t, -1), self._t("out_proj"))
        return out, present_conv, state


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class GatedAttention(_Module):
    """One full-attention layer: keys and values of the past in, output and the grown cache out."""

    def __init__(self, w: Mapping[str, Tensor], cfg: Mapping[str, Any]) -> None:
        super().__init__()
        self.heads, self.kv_heads = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
        self.head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // self.heads)
        self.scaling = self.head_dim ** -0.5
        self.bias = bool(cfg.get("attention_bias", False))
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            self._put(name, w[f"{name}.weight"])
            if self.bias:
                self._put(f"{name}_bias", w[f"{name}.bias"])
        eps = float(cfg["rms_norm_eps"])
        self.eps = eps
        self._put("q_norm", _zero_centred(w["q_norm.weight"]))
        self._put("k_norm", _zero_centred(w["k_norm.weight"]))

    def _linear(self, x: Tensor, name: str) -> Tensor:
        return F.linear(x, self._t(name), self._t(f"{name}_bias") if self.bias else None)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, bias: Tensor, past_key: Tensor,
                past_value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t = x.shape[0], x.shape[1]
        qg = self._linear(x, "q_proj").view(b, t, self.heads, 2 * self.head_dim)
        query, gate = qg[..., :self.head_dim], qg[..., self.head_dim:]
        gate = gate.reshape(b, t, self.heads * self.head_dim)
        query = _rms(query, self._t("q_norm"), self.eps).transpose(1, 2)
        key = _rms(self._linear(x, "k_proj").view(b, t, self.kv_heads, self.head_dim), self._t("k_norm"),
                   self.eps).transpose(1, 2)
        value = self._linear(x, "v_proj").view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        rot = cos.shape[-1]
        c, s = cos[:, None], sin[:, None]
        q_rot, k_rot = query[..., :rot], key[..., :rot]
        query = torch.cat([q_rot * c + _rotate_half(q_rot) * s, query[..., rot:]], dim=-1)
        key = torch.cat([k_rot * c + _rotate_half(k_rot) * s, key[..., rot:]], dim=-1)
        key = torch.cat([past_key, key], dim=2)
        value = torch.cat([past_value, value], dim=2)
        keys = key.shape[2]
        rep = self.heads // self.kv_heads
        k_all = key[:, :, None].expand(b, self.kv_heads, rep, keys, self.head_dim).reshape(b, self.heads, keys,
                                                                                             self.head_dim)
        v_all = value[:, :, None].expand(b, self.kv_heads, rep, keys, self.head_dim).reshape(b, self.heads, keys,
                                                                                               self.head_dim)
        scores = torch.matmul(query, k_all.transpose(2, 3)) * self.scaling + bias
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v_all).transpose(1, 2).reshape(b, t, -1)
        out = out * torch.sigmoid(gate)
        return self._linear(out, "o_proj"), key, value


class Mlp(_Module):
    def __init__(self, w: Mapping[str, Tensor]) -> None:
        super().__init__()
        for name in ("gate_proj", "up_proj", "down_proj"):
            self._put(name, w[f"{name}.weight"])

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(F.silu(F.linear(x, self._t("gate_proj"))) * F.linear(x, self._t("up_proj")),
                        self._t("down_proj"))


class Layer(_Module):
    def __init__(self, kind: str, w: Mapping[str, Tensor], cfg: Mapping[str, Any], masks: Sequence[Tensor]) -> None:
        super().__init__()
        self.kind = kind
        self.eps = float(cfg["rms_norm_eps"])
        self.mixer: nn.Module = (GatedDeltaNet(_sub(w, "linear_attn."), cfg, masks) if kind == LINEAR
                                 else GatedAttention(_sub(w, "self_attn."), cfg))
        self.mlp = Mlp(_sub(w, "mlp."))
        self._put("input_norm", _zero_centred(w["input_layernorm.weight"]))
        self._put("post_norm", _zero_centred(w["post_attention_layernorm.weight"]))


def _sub(w: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}


def _tensor(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach().to(torch.float32)
    return torch.from_numpy(np.asarray(value, dtype=np.float32).copy())


def rope_row_select(cfg: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """(inv_freq [F], the position row (0 t, 1 h, 2 w) each frequency reads [F]) as Transformers 5's
    Qwen3_5TextRotaryEmbedding lays them out: interleaved, h at 1, 4, 7, ... and w at 2, 5, 8, ..."""
    rope = dict(cfg.get("rope_parameters") or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported Qwen3.5 rope type {rope.get('rope_type')!r}")
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
    dim = int(head_dim * partial)
    base = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    section = list(rope.get("mrope_section", [11, 11, 10]))
    rows = torch.zeros(inv_freq.shape[0], dtype=torch.int64)
    for row, offset in ((1, 1), (2, 2)):
        rows[offset:section[row] * 3:3] = row
    return inv_freq, rows


class Qwen35TextCore(_Module):
    """The text core: ``forward(inputs_embeds, attention_mask, position_ids, *pasts)`` returns
    ``(last_hidden_state, *presents)`` in :func:`graph_input_names` / :func:`graph_output_names` order."""

    def __init__(self, weights: Mapping[str, Any], text_config: Mapping[str, Any], attention_mode: str) -> None:
        super().__init__()
        if attention_mode not in ATTENTION_MODES:
            raise ValueError(f"attention_mode must be one of {', '.join(ATTENTION_MODES)}, not {attention_mode!r}")
        self.config = dict(text_config)
        self.layer_types = [str(k) for k in text_config["layer_types"]]
        n = int(text_config.get("num_hidden_layers", len(self.layer_types)))
        if len(self.layer_types) != n:
            raise ValueError(f"layer_types names {len(self.layer_types)} layers; num_hidden_layers is {n}")
        unknown = sorted(set(self.layer_types) - {LINEAR, FULL})
        if unknown:
            raise ValueError(f"unsupported Qwen3.5 layer types {unknown}")
        self.attention_mode = attention_mode
        self.eps = float(text_config["rms_norm_eps"])
        w = {k: _tensor(v) for k, v in weights.items()}
        expected = expected_weight_names(text_config)
        missing = sorted(expected - set(w))
        extra = sorted(set(w) - expected - {"embed_tokens.weight"})
        if missing or extra:
            raise ValueError(f"text weights do not match the config's layers: missing {missing[:4]}, "
                             f"unexpected {extra[:4]}")
        masks = block_masks()
        self.layers = nn.ModuleList([Layer(kind, _sub(w, f"layers.{i}."), text_config, masks)
                                     for i, kind in enumerate(self.layer_types)])
        self._put("norm", _zero_centred(w["norm.weight"]))
        inv_freq, rows = rope_row_select(text_config)
        self._put("inv_freq", inv_freq)
        self.register_buffer("rope_rows", rows)

    def forward(self, inputs_embeds: Tensor, attention_mask: Tensor, position_ids: Tensor,
                *pasts: Tensor) -> tuple[Tensor, ...]:
        h = inputs_embeds
        t = h.shape[1]
        keys = attention_mask.shape[1]
        past = keys - t
        real_mask = attention_mask.narrow(1, past, t)
        real = real_mask.to(torch.float32)
        lengths = real_mask.sum(1)
        allowed = attention_mask.bool()[:, None, None, :]
        if self.attention_mode == CAUSAL:
            visible = torch.arange(keys)[None, :] <= (torch.arange(t) + past)[:, None]
            allowed = allowed & visible[None, None]
        zero = torch.zeros((), dtype=torch.float32)
        bias = torch.where(allowed, zero, torch.full((), MASKED, dtype=torch.float32))
        freqs = position_ids.to(torch.float32).index_select(1, self._t("rope_rows")).transpose(1, 2)
        freqs = freqs * self._t("inv_freq")
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        presents: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Layer)
            first, second = pasts[2 * i], pasts[2 * i + 1]
            x = _rms(h, layer._t("input_norm"), self.eps)
            if layer.kind == LINEAR:
                out, s1, s2 = layer.mixer(x, real, lengths, first, second)
            else:
                out, s1, s2 = layer.mixer(x, cos, sin, bias, first, second)
            presents += [s1, s2]
            h = h + out
            h = h + layer.mlp(_rms(h, layer._t("post_norm"), self.eps))
        return (_rms(h, self._t("norm"), self.eps), *presents)

    def empty_pasts(self, batch: int) -> list[Tensor]:
        """Zero states and empty caches for ``batch`` rows with no past, in input order."""
        return [torch.from_numpy(a) for a in empty_states(self.config, batch)]


def state_shapes(text_config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each past input's shape after its batch axis (the attention past axis as 0)."""
    cfg = text_config
    out: dict[str, tuple[int, ...]] = {}
    hk, hv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
    dk, dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
    conv_dim = 2 * hk * dk + hv * dv
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    for i, kind in enumerate(cfg["layer_types"]):
        if kind == LINEAR:
            out[f"past_conv.{i}"] = (conv_dim, int(cfg["linear_conv_kernel_dim"]) - 1)
            out[f"past_recurrent.{i}"] = (hv, dk, dv)
        else:
            out[f"past_key_values.{i}.key"] = (int(cfg["num_key_value_heads"]), 0, head_dim)
            out[f"past_key_values.{i}.value"] = (int(cfg["num_key_value_heads"]), 0, head_dim)
    return out


def empty_states(text_config: Mapping[str, Any], batch: int) -> list[np.ndarray]:
    """Numpy zeros for every past input (no past), in input order."""
    return [np.zeros((batch, *shape), dtype=np.float32) for shape in state_shapes(text_config).values()]


def expected_weight_names(text_config: Mapping[str, Any]) -> set[str]:
    """Every HF ``Qwen3_5TextModel`` tensor name the forward reads (embed_tokens aside)."""
    names = {"norm.weight"}
    bias = bool(text_config.get("attention_bias", False))
    for i, kind in enumerate(text_config["layer_types"]):
        p = f"layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"}
        if kind == LINEAR:
            names |= {p + f"linear_attn.{n}" for n in (
                "in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
                "out_proj.weight", "conv1d.weight", "A_log", "dt_bias", "norm.weight")}
        else:
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                names.add(p + f"self_attn.{n}.weight")
                if bias:
                    names.add(p + f"self_attn.{n}.bias")
            names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
    return names


def build_text_core(weights: Mapping[str, Any], text_config: Mapping[str, Any],
                    attention_mode: str = CAUSAL) -> Qwen35TextCore:
    """The text core in fp32 eval mode over ``weights`` (HF names, torch tensors or numpy arrays; bf16
    values are upcast exactly)."""
    return Qwen35TextCore(weights, text_config, attention_mode).eval()


__all__ = [
    "ATTENTION_MODES", "CAUSAL", "CHUNK", "FULL", "LINEAR", "NONCAUSAL", "Qwen35TextCore", "block_masks",
    "build_text_core", "chunk_gated_delta", "empty_states", "expected_weight_names", "graph_input_names",
    "graph_output_names", "state_shapes", "unit_lower_inverse",
]
