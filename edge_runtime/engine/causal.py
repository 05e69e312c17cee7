"""The Forward for causal-LM graphs: last-token hidden states, per row or branched from a shared prefix.

Two kinds of rows (the family builds them from token ids; this module never reads a prompt):

- :class:`CausalRow` (``ids``): one whole sequence. Rows are RIGHT-padded into one batch with
  ``position_ids = arange`` and a zero attention mask on the padding, and each row's result is the
  hidden state at its own last real token. Right padding keeps ORT CPU fp32 rows bit-identical to
  running them alone; left padding does not (docs/reference/feasibility-notes.md A.2).
- :class:`BranchRow` (``prefix``, ``branches``): a prefix run once (a prefill over an empty past)
  whose key/value cache every branch continues from, with ``attention_mask = [1]*prefix + branch
  mask`` and ``position_ids = prefix + arange``; the result is each branch's last-token hidden
  state, ``[n_branches, hidden]``: measured bit-identical to running ``prefix + branch`` alone
  (notes B.2). How the branches read the cache (``branch_mode``):

  - ``shared``: the batch-1 cache is bound to the session once (IOBinding) and every branch runs at
    batch 1 against it, so a request holds one copy of the prefix's cache whatever its number of
    questions; but each branch reads all the weights again (Qwen3-0.6B, 32 questions on a 500-token
    prefix: 2.3x slower than tiled, docs/benchmarks.md).
  - ``tiled`` (the default): the cache is copied into preallocated buffers tiled to a chunk of branches (page
    faults, not copying, make ``np.repeat`` slow: notes B.3.6) and a chunk's branches run
    right-padded in one batch: fewer weight reads, but a copy of the cache per branch of a chunk
    (and the graph's own concatenated past per branch). The graph's attention concatenates past and
    new keys per batch row, so a batch-1 past cannot serve several rows without a graph whose
    attention is split in two, which changes the reduction and so the bits. Where a chunk would
    hold one branch (the cache is large against ``max_branch_bytes``) or there is one branch,
    tiling buys nothing and the branches run shared: the copy per request is bounded by
    ``max_branch_bytes`` either way, never by the number of questions.

Graphs: Optimum's decoder exports. ``input_ids``, ``attention_mask`` and (when present)
``position_ids`` in, ``last_hidden_state`` out; a state-once graph adds
``past_key_values.{i}.key|value [b, kv_heads, past, head_dim]`` inputs and ``present.{i}.*``
outputs. A graph with past inputs also runs CausalRows (every past empty).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .batching import padded_width

if TYPE_CHECKING:  # keeps this module importable without onnxruntime
    from .session import GraphSession

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
HIDDEN = "last_hidden_state"
PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."

#: Tiled key/value bytes one branch chunk may hold; more branches run in several chunks, which
#: changes no row (batch invariance) but bounds memory: Q x prefix x KV-per-token grows fast.
DEFAULT_MAX_BRANCH_BYTES = 64 * 1024 * 1024
#: Every chunk reads all the weights once, so a large model may spend more on the tiled cache: up to
#: this share of the graph's own bytes. Qwen3-0.6B shape, 8 questions of 30 tokens on a 200-token
#: state: 2.46 s in 64 MiB chunks (one question each), 1.88 s in 512 MiB chunks (bench decision-codes).
BRANCH_BYTES_PER_GRAPH_BYTE = 0.25
DEFAULT_MAX_BRANCH_ROWS = 64
#: ``branch_mode``: every branch at batch 1 over the prefix's cache bound once, or chunks of tiled copies.
SHARED = "shared"
TILED = "tiled"
BRANCH_MODES = (SHARED, TILED)

_FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


@dataclass(frozen=True)
class CausalRow:
    """One whole token sequence (int64 ids, at least one token)."""

    ids: np.ndarray


@dataclass(frozen=True)
class BranchRow:
    """A prefix run once and the branches that continue it (each at least one token)."""

    prefix: np.ndarray
    branches: tuple[np.ndarray, ...]


def _ids(values: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(values, dtype=np.int64).reshape(-1))


def causal_row(ids: Sequence[int] | np.ndarray) -> CausalRow:
    """A CausalRow over ``ids``."""
    return CausalRow(_ids(ids))


def branch_row(prefix: Sequence[int] | np.ndarray, branches: Sequence[Sequence[int] | np.ndarray]) -> BranchRow:
    """A BranchRow over a prefix and its branches."""
    return BranchRow(_ids(prefix), tuple(_ids(b) for b in branches))


def _graph_bytes(path: Path) -> int:
    """The graph file and its external data files (``model.onnx*`` beside it), in bytes."""
    return sum(p.stat().st_size for p in path.parent.glob(f"{path.name}*") if p.is_file())


class CausalForward:
    """Runs CausalRows and BranchRows through a decoder graph; results are last-token hidden states.

    A CausalRow gives ``float32 [hidden]``; a BranchRow gives ``[n_branches, hidden]`` in branch
    order. Arrays are copies owned by the caller. ``branch_mode`` ``shared`` runs every branch at
    batch 1 over the prefix's cache bound once; ``tiled`` (default) cuts the branches into chunks
    of at most ``max_branch_rows`` rows whose tiled cache stays within ``max_branch_bytes``
    (default: a quarter of the graph's size, at least 64 MiB). Both give the same bits. Calls are
    serialised (the branch buffers are shared); the executor runs one forward at a time anyway.
    """

    def __init__(self, session: GraphSession, pad_id: int = 0, *,
                 max_branch_bytes: int | None = None,
                 max_branch_rows: int = DEFAULT_MAX_BRANCH_ROWS,
                 branch_mode: str = TILED) -> None:
        if branch_mode not in BRANCH_MODES:
            raise ValueError(f"branch_mode must be one of {list(BRANCH_MODES)}, not {branch_mode!r}")
        self.branch_mode = branch_mode
        names = list(session.input_names)
        missing = [n for n in (INPUT_IDS, ATTENTION_MASK) if n not in session.inputs]
        self.past_names = [n for n in names if n.startswith(PAST_PREFIX)]
        known = {INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *self.past_names}
        unknown = [n for n in names if n not in known]
        if missing or unknown or HIDDEN not in session.outputs:
            raise ValueError(
                f"{session.path.name} is not a decoder graph this forward can feed: inputs {names}, "
                f"outputs {session.output_names}; needs {INPUT_IDS}, {ATTENTION_MASK} and output {HIDDEN}, "
                f"may have {POSITION_IDS} and {PAST_PREFIX}*")
        self.session = session
        self.pad_id = int(pad_id)
        self.row_multiple: int = session.row_multiple
        if max_branch_bytes is None:
            share = int(_graph_bytes(session.path) * BRANCH_BYTES_PER_GRAPH_BYTE)
            max_branch_bytes = max(DEFAULT_MAX_BRANCH_BYTES, share)
        self.max_branch_bytes = int(max_branch_bytes)
        self.max_branch_rows = max(1, int(max_branch_rows))
        self._positions = POSITION_IDS in session.inputs
        # past input -> (dtype, kv_heads, head_dim), and the present output that refills it
        self._past: dict[str, tuple[type, int, int]] = {}
        self._present: dict[str, str] = {}
        for name in self.past_names:
            spec = session.inputs[name]
            heads, dim = (spec.shape[1], spec.shape[3]) if len(spec.shape) == 4 else (None, None)
            if not isinstance(heads, int) or not isinstance(dim, int) or spec.type not in _FLOAT_TYPES:
                raise ValueError(f"past input {name} has shape {spec.shape} and type {spec.type}; "
                                 "expected [batch, kv_heads, past, head_dim] floats with fixed kv_heads and head_dim")
            present = PRESENT_PREFIX + name[len(PAST_PREFIX):]
            if present not in session.outputs:
                raise ValueError(f"past input {name} has no {present} output to fill it")
            self._past[name] = (_FLOAT_TYPES[spec.type], heads, dim)
            self._present[name] = present
        self._buffers: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def has_past(self) -> bool:
        """Whether the graph takes a key/value cache (and so can run BranchRows)."""
        return bool(self.past_names)

    def kv_bytes_per_token(self) -> int:
        """Key/value cache bytes one token of one row holds."""
        return sum(heads * dim * np.dtype(dtype).itemsize for dtype, heads, dim in self._past.values())

    def length(self, row: Any) -> int:
        """Tokens the row computes: the sequence, or the prefix once plus every branch."""
        if isinstance(row, BranchRow):
            return len(row.prefix) + sum(len(b) for b in row.branches)
        return len(row.ids)

    def __call__(self, rows: Sequence[Any]) -> list[np.ndarray]:
        """One result per row, in order; CausalRows of one call share one right-padded batch."""
        with self._lock:
            results: list[np.ndarray | None] = [None] * len(rows)
            plain = [i for i, r in enumerate(rows) if not isinstance(r, BranchRow)]
            if plain:
                for i, h in zip(plain, self._last_hidden([rows[i].ids for i in plain])):
                    results[i] = h
            for i, row in enumerate(rows):
                if isinstance(row, BranchRow):
                    results[i] = self._branch(row)
            return results  # type: ignore[return-value]

    # ---- feeds -------------------------------------------------------------------------------

    def _empty_past(self, batch: int) -> dict[str, np.ndarray]:
        return {name: np.zeros((batch, heads, 0, dim), dtype=dtype) for name, (dtype, heads, dim) in self._past.items()}

    def _padded(self, seqs: Sequence[np.ndarray], past: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Right-padded input_ids, attention_mask (past ones, then the row's), position_ids from past;
        the keys (past and new) rounded up to the row multiple."""
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        if lengths.min(initial=1) < 1:
            raise ValueError("every sequence needs at least one token")
        width = padded_width(past + int(lengths.max()), self.row_multiple) - past
        ids = np.full((len(seqs), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(seqs), past + width), dtype=np.int64)
        mask[:, :past] = 1
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = s
            mask[b, past : past + len(s)] = 1
        feeds = {INPUT_IDS: ids, ATTENTION_MASK: mask}
        if self._positions:
            # pad positions get positions too; they are masked as keys and never read
            feeds[POSITION_IDS] = np.broadcast_to(past + np.arange(width, dtype=np.int64), (len(seqs), width)).copy()
        return feeds, lengths

    @staticmethod
    def _gather_last(hidden: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        return np.array(hidden[np.arange(len(lengths)), lengths - 1], dtype=np.float32, copy=True)

    def _last_hidden(self, seqs: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds, lengths = self._padded(seqs, 0)
        feeds.update(self._empty_past(len(seqs)))
        hidden = self.session.run(feeds, [HIDDEN])[HIDDEN]
        last = self._gather_last(hidden, lengths)
        return [last[b].copy() for b in range(len(seqs))]

    # ---- state once ----------------------------------------------------------------------------

    def prefill(self, prefix: np.ndarray) -> dict[str, np.ndarray]:
        """The key/value cache of ``prefix`` at batch 1, by past input name."""
        if not self.has_past:
            raise ValueError(f"{self.session.path.name} has no past key/value inputs; it cannot branch")
        feeds, _ = self._padded([prefix], 0)
        feeds.update(self._empty_past(1))
        out = self.session.run(feeds, [self._present[n] for n in self.past_names])
        return {n: real_keys(out[self._present[n]], len(prefix)) for n in self.past_names}

    def _tiled(self, cache: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """The cache repeated ``rows`` times, in buffers kept between calls (contiguous views)."""
        tiled = {}
        for name, value in cache.items():
            need = rows * value[0].size
            buf = self._buffers.get(name)
            if buf is None or buf.size < need or buf.dtype != value.dtype:
                buf = np.empty(need, dtype=value.dtype)
                self._buffers[name] = buf
            view = buf[:need].reshape((rows, *value.shape[1:]))
            view[...] = value  # broadcasts the batch-1 cache over the rows
            tiled[name] = view
        return tiled

    def _chunk_rows(self, prefix_len: int) -> int:
        per_row = max(1, prefix_len * self.kv_bytes_per_token())
        return max(1, min(self.max_branch_rows, self.max_branch_bytes // per_row))

    def _branch(self, row: BranchRow) -> np.ndarray:
        if not row.branches:
            raise ValueError("a BranchRow needs at least one branch")
        if len(row.prefix) == 0:  # nothing to share: every branch is a whole sequence
            return np.stack(self._last_hidden(list(row.branches)))
        cache = self.prefill(row.prefix)
        past = len(row.prefix)
        size = self._chunk_rows(past)
        if self.branch_mode == SHARED or size == 1 or len(row.branches) == 1:
            return self._branch_shared(row, cache)
        # Shorter branches first so that a chunk pads little; results go back in branch order.
        order = sorted(range(len(row.branches)), key=lambda i: (len(row.branches[i]), i))
        out: np.ndarray | None = None
        tiled = self._tiled(cache, min(size, len(order)))
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            feeds, lengths = self._padded([row.branches[i] for i in chunk], past)
            feeds.update({n: v[: len(chunk)] for n, v in tiled.items()})
            hidden = self.session.run(feeds, [HIDDEN])[HIDDEN]
            last = self._gather_last(hidden, lengths)
            if out is None:
                out = np.empty((len(row.branches), last.shape[1]), dtype=np.float32)
            out[chunk] = last
        assert out is not None
        return out

    def _branch_shared(self, row: BranchRow, cache: dict[str, np.ndarray]) -> np.ndarray:
        """Every branch at batch 1 over the prefix's cache, bound once: memory holds one cache."""
        past = len(row.prefix)
        bound = self.session.bind(cache)
        out: np.ndarray | None = None
        for i, branch in enumerate(row.branches):
            feeds, lengths = self._padded([branch], past)
            last = self._gather_last(bound.run(feeds, [HIDDEN])[HIDDEN], lengths)
            if out is None:
                out = np.empty((len(row.branches), last.shape[1]), dtype=np.float32)
            out[i] = last[0]
        assert out is not None
        return out


def real_keys(present: np.ndarray, length: int) -> np.ndarray:
    """A prefill's cache [b, heads, keys, dim] without the keys of the padding a row multiple added
    (under causal attention a real key never read them)."""
    return present if present.shape[2] == length else np.ascontiguousarray(present[:, :, :length])


__all__ = ["BRANCH_MODES", "SHARED", "TILED", "BranchRow", "CausalForward", "CausalRow", "branch_row", "causal_row"]
