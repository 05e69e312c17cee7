"""Multimodal embeddings: one graph per tower (text, image, audio), every tower writing into one space.

A request's inputs may mix texts, images and clips when the package has those towers. Each input
becomes one row for its tower: token ids (text), pixel values (image, numpy preprocessing equal to
the source's processor), or a log-mel window (audio). The engine hands this family's forward
mixed batches; the forward splits them per tower and batches within a tower only as far as that
tower's load-time probe proved bit-identical to running each row alone, so every answer is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from edge_runtime.engine import probe_grouping
from edge_runtime.engine.batching import padded_width
from edge_runtime.engine.forward import Grouping
from edge_runtime.errors import ItemError, invalid_request
from edge_runtime.families.base import Graph, Plan, open_graphs, token_budget
from edge_runtime.families.embeddings import Embedded, embedding_card, embeddings_body
from edge_runtime.families.items import InputUsage
from edge_runtime.families.multimodal_embedding.card import PRIMARY_GRAPH
from edge_runtime.families.multimodal_embedding.features import (
    audio_windows,
    clap_log_mel,
    image_pixels,
    log_mel,
    whisper_real_positions,
    window_samples,
)
from edge_runtime.heads.pooling import normalize, weighted_mean
from edge_runtime.media.audio import AudioLimits, decode_audio
from edge_runtime.media.dataurl import b64_bytes
from edge_runtime.media.errors import MediaError
from edge_runtime.media.image import ImageLimits, decode_image_url
from edge_runtime.packages import Package, PackageError
from edge_runtime.packages.golden import GoldenCase, read_golden
from edge_runtime.requests.embedding_inputs import AudioInput, ImageInput, modality_unsupported
from edge_runtime.requests.encoder import EmbeddingsRequest
from edge_runtime.text import Encoded, InputError, TextEncoder

log = logging.getLogger(__name__)

#: Golden outputs of the non-primary towers must match within this (the runtime's CPU tolerance).
TEXT_PROBE_LENGTHS = (3, 9, 9, 17, 40, 130)


@dataclass(frozen=True)
class TowerRow:
    """One input for one tower (or one window of a long clip): the array it reads, its
    token(-equivalent) count, for audio the encoder positions that saw sound (the only ones
    averaged), and its weight when an input's windows are pooled."""

    tower: str
    data: np.ndarray
    tokens: int
    real: int = 0
    width: int = 0  # what the forward computes over, for the engine's batch planning (0: tokens)
    weight: float = 1.0


class Tower:
    """One tower's graph: feeds for a batch of its rows and one vector [dimension] per row."""

    def __init__(self, name: str, spec: dict[str, Any], session: Any) -> None:
        self.name = name
        self.spec = spec
        self.session = session
        self.inputs: list[str] = list(spec["inputs"])
        self.output: str = spec["output"]
        missing = [n for n in self.inputs if n not in session.inputs]
        if missing or self.output not in session.outputs:
            raise PackageError(spec["graph"], f"the {name} tower's graph lacks {missing or [self.output]}")
        text = spec.get("text") or {}
        self.pad_to: int | None = text.get("pad_to")
        self.pad_id = int(text.get("pad_id", 0))
        self.grouping: Grouping = "alone"

    def feeds(self, rows: Sequence[TowerRow]) -> dict[str, np.ndarray]:
        if self.name != "text":
            return {self.inputs[0]: np.stack([r.data for r in rows]).astype(np.float32, copy=False)}
        # Right padding: fp32 ORT CPU rows stay bit-identical to running alone (the probe checks).
        width = padded_width(self.pad_to or max(len(r.data) for r in rows), self.session.row_multiple)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for b, r in enumerate(rows):
            ids[b, : len(r.data)] = r.data
            mask[b, : len(r.data)] = 1
        feeds = {"input_ids": ids}
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = mask
        return feeds

    def run(self, rows: Sequence[TowerRow]) -> list[np.ndarray]:
        """One vector per row (float32, before truncation and normalisation)."""
        value = self.session.run(self.feeds(rows), [self.output])[self.output]
        if self.spec.get("pooling") == "mean_real_frames":
            # Mean over the positions that saw sound, in float64 (as heads.pooling does for text).
            return [value[b, : r.real].astype(np.float64).mean(axis=0).astype(np.float32) for b, r in enumerate(rows)]
        return [np.array(value[b], dtype=np.float32, copy=True) for b in range(len(rows))]


class MultimodalForward:
    """The engine's Forward: splits a batch per tower and batches each only as its probe allows."""

    def __init__(self, towers: dict[str, Tower]) -> None:
        self.towers = towers

    def length(self, row: TowerRow) -> int:
        """The row's cost for batch planning: a Whisper clip always fills its window, however short,
        so rows of one tower plan as equals instead of being kept apart by their real lengths."""
        return row.width or row.tokens

    def __call__(self, rows: Sequence[TowerRow]) -> list[np.ndarray]:
        results: list[Any] = [None] * len(rows)
        by_tower: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            by_tower.setdefault(row.tower, []).append(i)
        for name, indices in by_tower.items():
            tower = self.towers[name]
            for group in _groups(tower.grouping, [rows[i] for i in indices], indices):
                for i, vector in zip(group, tower.run([rows[i] for i in group])):
                    results[i] = vector
        return results


def _groups(grouping: Grouping, rows: list[TowerRow], indices: list[int]) -> list[list[int]]:
    if grouping == "alone":
        return [[i] for i in indices]
    if grouping == "padded":
        return [indices]
    shapes: dict[tuple[int, ...], list[int]] = {}
    for i, row in zip(indices, rows):
        shapes.setdefault(row.data.shape, []).append(i)
    return list(shapes.values())


def graphs(package: Package, variant: str = "fp32") -> list[Graph]:
    """Every tower's graph in ``variant`` but the primary's (the variant's own file), each with its
    golden cases."""
    return [Graph(f"tower:{name}", own["graph"], partial(_golden, own["golden"]))
            for name, spec in package.card.raw["towers"].items() if spec["graph"] != PRIMARY_GRAPH
            for own in [tower_variant(spec, variant)]]


def tower_variant(spec: dict[str, Any], variant: str) -> dict[str, Any]:
    """A tower's graph and golden in ``variant`` (fp32: the tower's own members)."""
    if variant == "fp32":
        return spec
    own = spec.get("variants", {}).get(variant)
    if own is None:  # the card check makes every variant name a graph per tower
        raise PackageError("card.json", f"the tower has no {variant} graph")
    return own


def served_variant(package: Package, session: Any) -> str:
    """The variant whose file ``session`` runs (fp32 when it is not one of the card's files)."""
    path = getattr(session, "path", None)
    name = getattr(path, "name", str(path or ""))
    return next((v.name for v in package.card.variants.values() if v.file == name), "fp32")


def _golden(file: str, package: Package) -> list[GoldenCase]:
    return read_golden(package.file(file))


class MultimodalEmbeddingModel:
    """A multimodal embedding package: its towers, space, limits and the plan of /v1/embeddings."""

    surfaces = frozenset({"embeddings"})
    batchable = True  # each tower's own probe decides how its rows share a forward

    def __init__(self, package: Package, session: Any, max_input_tokens: int | None = None,
                 opened: Mapping[str, Any] | None = None) -> None:
        card = package.card
        raw = card.raw
        self.kind = card.kind
        self.digest = package.digest
        self.head = dict(card.head)
        self.limits = dict(card.limits)
        self.space = dict(raw["space"])
        self.dimension = int(self.head["dimension"])
        self.dimensions = sorted(set(self.head["dimensions"]), reverse=True)
        self.normalized = bool(self.head["normalize"])
        self.variant = served_variant(package, session)
        self.agreement = package.card.variants[self.variant].agreement
        if opened is None:  # built outside the loader (converters, tests): open them the same way
            opened, _ = open_graphs(package, graphs(package, self.variant), session)
        self.towers = {name: Tower(name, spec, session if spec["graph"] == PRIMARY_GRAPH else opened[f"tower:{name}"])
                       for name, spec in raw["towers"].items()}
        self.primary = next(n for n, s in raw["towers"].items() if s["graph"] == PRIMARY_GRAPH)
        self.modalities = tuple(sorted(self.towers))
        card_max = int(self.limits["max_input_tokens"])
        self.max_input_tokens = min(card_max, max_input_tokens or card_max)
        self.text = (TextEncoder(package.file("tokenizer.json"), self.max_input_tokens)
                     if "text" in self.towers else None)
        self.forward = MultimodalForward(self.towers)
        self._rng = np.random.default_rng(0)
        self._vocab = self.text.tokenizer.get_vocab_size() if self.text else 0
        for tower in self.towers.values():
            lengths = ([min(n, self.max_input_tokens) for n in TEXT_PROBE_LENGTHS] if tower.name == "text"
                       else [1, 1, 1])
            measured = tower_variant(tower.spec, self.variant).get("batch_invariance", {})
            # the converter saw batched rows differ: never batch them, whatever a probe of 3 rows says
            tower.grouping = ("alone" if measured.get("identical") is False
                              else probe_grouping(tower.run, partial(self._random_row, tower.name), lengths))
            log.info("multimodal tower %s (%s): grouping %s", tower.name, self.variant, tower.grouping)

    # -- engine hooks -------------------------------------------------------------------------

    def _random_row(self, tower: str, length: int) -> TowerRow:
        """A fresh random row (equal rows would prove nothing about batching)."""
        spec = self.towers[tower].spec
        if tower == "text":
            ids = self._rng.integers(1, self._vocab, size=length, dtype=np.int64)
            return TowerRow("text", ids, length)
        shape = [d if isinstance(d, int) else None for d in self.towers[tower].session.inputs[spec["inputs"][0]].shape]
        if tower == "image":
            crop = spec["preprocess"].get("crop") or spec["preprocess"]["resize"]
            data = self._rng.standard_normal((3, int(crop["height"]), int(crop["width"]))).astype(np.float32)
            return TowerRow("image", data, int(spec["tokens"]))
        pre = spec["preprocess"]
        if pre["log"] == "clap_db":
            frames = int(pre["max_length_s"]) * int(pre["sampling_rate"]) // int(pre["hop_length"]) + 1
            data = self._rng.standard_normal((1, frames, int(pre["n_mels"]))).astype(np.float32)
            return TowerRow("audio", data, int(spec["tokens"]))
        frames = int(pre["chunk_length"]) * int(pre["sampling_rate"]) // int(pre["hop_length"])
        data = self._rng.standard_normal((int(pre["n_mels"]), shape[-1] or frames)).astype(np.float32)
        real = int(self._rng.integers(1, int(spec["positions"]) + 1))
        return TowerRow("audio", data, real, real, int(spec["positions"]))

    def probe_row(self, length: int) -> TowerRow:
        """Rows of the text tower when there is one (lengths vary there), else of the first tower."""
        return self._random_row("text" if "text" in self.towers else self.modalities[0], length)

    def warm(self) -> None:
        if self.text is not None:
            self.text.cut_report()

    def describe(self) -> dict[str, Any]:
        """The card's ``embedding`` block: one space for every tower."""
        # pooling "model": each tower's graph pools (its projection head), not a readout here
        described = embedding_card(self.dimensions, [int(self.towers[self.primary].spec["layers"])], "model",
                                   self.normalized, self.modalities)
        # which rows of each tower share a forward, as its load-time probe proved
        described["tower_grouping"] = {name: t.grouping for name, t in self.towers.items()}
        if self.agreement is not None:  # a quantized variant: how close each tower is to fp32, as measured
            described["agreement"] = self.agreement
        return described

    def representation(self, dimension: int) -> dict[str, Any]:
        """The space's tag: the same for every tower of the package, so texts and images compare."""
        return {
            "model_sha256": self.digest,
            "layer": int(self.towers[self.primary].spec["layers"]),
            "dimension": dimension,
            "normalized": self.normalized,
            "modality": "+".join(self.modalities),
            "space": self.space["name"],
            "towers": {name: int(t.spec["layers"]) for name, t in self.towers.items()},
        }

    # -- planning -----------------------------------------------------------------------------

    def plan(self, surface: str, request: Any) -> Plan:
        if surface != "embeddings":
            raise ValueError(surface)
        return self._plan_embeddings(request)

    def _plan_embeddings(self, req: EmbeddingsRequest) -> Plan:
        if not req.modalities <= set(self.modalities):
            raise modality_unsupported(req.modalities, self.modalities)
        if req.dimensions is not None and req.dimensions not in self.dimensions:
            raise invalid_request(f"dimensions must be one of {sorted(self.dimensions)} for this model, "
                                  f"not {req.dimensions}")
        layer = int(self.towers[self.primary].spec["layers"])
        if req.layer is not None and req.layer != layer:
            raise invalid_request(f"layer must be one of [{layer}] for this model, not {req.layer}")
        if req.options.overflow == "window":
            raise invalid_request("embeddings take overflow reject or truncate")
        parts = req.parts or req.inputs
        rows: list[TowerRow] = []
        # each input's rows (a long clip has one per window) and its usage, or its error
        owners: list[tuple[slice, InputUsage] | ItemError] = []
        tokens = 0
        for index, part in enumerate(parts):
            try:
                item = self._rows(part, req)
            except MediaError as exc:
                raise exc.api_error(f"input[{index}]") from None
            if isinstance(item, ItemError):
                owners.append(item)
                continue
            own, usage = item
            owners.append((slice(len(rows), len(rows) + len(own)), usage))
            rows.extend(own)
            tokens += sum(r.tokens for r in own)  # what the towers read (a truncated text: its kept tokens)
        dims = req.dimensions if req.dimensions != self.dimension else None

        def finish(outputs: list[Any] | ItemError) -> dict[str, Any]:
            items: list[Embedded] = []
            for own in owners:
                if isinstance(own, ItemError) or isinstance(outputs, ItemError):
                    items.append(own if isinstance(own, ItemError) else outputs)  # type: ignore[arg-type]
                    continue
                mine = rows[own[0]]
                vector = weighted_mean([np.asarray(v, dtype=np.float32) for v in outputs[own[0]]],
                                       [r.weight for r in mine])
                if dims is not None:
                    vector = vector[:dims]
                items.append((normalize(vector) if self.normalized else vector, own[1]))
            return embeddings_body(items, req.encoding_format)

        return Plan(rows, finish, tokens,
                    extras={"representation": self.representation(req.dimensions or self.dimension)})

    def _rows(self, part: Any, req: EmbeddingsRequest) -> tuple[list[TowerRow], InputUsage] | ItemError:
        """The rows of one input (one, or a long clip's windows) and its coverage; an over-long
        text is an item error, a refused medium a MediaError."""
        if isinstance(part, ImageInput):
            row = self._image_row(part)
            return [row], InputUsage.whole(row.tokens)
        if isinstance(part, AudioInput):
            rows = self._audio_rows(part)
            usage = InputUsage.whole(sum(r.tokens for r in rows))
            return rows, usage if len(rows) == 1 else replace(usage, windows=len(rows))
        assert self.text is not None
        budget = token_budget(req.options.max_tokens, self.max_input_tokens)
        result = self.text.encode(part, None, max_tokens=budget, overflow=req.options.overflow or "reject")
        if isinstance(result, InputError):
            return ItemError(result.code, result.message)
        assert isinstance(result, Encoded)
        ids = np.asarray(result.rows[0].ids, dtype=np.int64)
        return [TowerRow("text", ids, int(len(ids)), width=self.towers["text"].pad_to or 0)], InputUsage.of(result)

    def _image_row(self, part: ImageInput) -> TowerRow:
        """The tower row of an image (whole: the tower reads a fixed shape)."""
        spec = self.towers["image"].spec
        limits = ImageLimits(int(self.limits["image_max_bytes"]), int(self.limits["image_source_max_pixels"]))
        image = decode_image_url(part.url, limits, check_declared=True)
        return TowerRow("image", image_pixels(image, spec["preprocess"]), int(spec["tokens"]))

    def _audio_rows(self, part: AudioInput) -> list[TowerRow]:
        """A clip's tower rows: one per window when the card reads long audio in windows (up to
        the card's audio_max_seconds, the budget decode_audio enforces), else the first window.

        Each window is read as the reference reads a clip of that length (Whisper: zero padded;
        CLAP: repeat-padded). Pooling: Whisper's windows weigh by the encoder positions that saw
        sound, so the result is the mean over every real position of the clip; CLAP's projected
        vectors weigh by their seconds of sound."""
        spec = self.towers["audio"].spec
        pre = spec["preprocess"]
        audio_limits = AudioLimits(int(self.limits["audio_max_bytes"]), float(self.limits["audio_max_seconds"]))
        samples = decode_audio(b64_bytes(part.data, audio_limits.max_bytes, "audio"), audio_limits,
                               int(pre["sampling_rate"]), part.format)
        windows = audio_windows(samples, window_samples(pre), spec.get("long_audio", "first_window"))
        if pre["log"] == "clap_db":  # CLAP: the graph pools; a window counts as its spectrogram's patches
            return [TowerRow("audio", clap_log_mel(w, pre), int(spec["tokens"]), weight=float(len(w)))
                    for w in windows]
        rows = []
        for w in windows:
            real = whisper_real_positions(len(w), pre, int(spec["positions"]))
            rows.append(TowerRow("audio", log_mel(w, pre), real, real, int(spec["positions"]), weight=float(real)))
        return rows
