"""The Forward for hybrid recurrent/attention text cores (decision3: Qwen3.5's Gated DeltaNet + attention).

The graph (converters/decision3/export.py; docs/decision3.md has the exact interface) takes ``inputs_embeds
[B, q, H]``, ``attention_mask [B, past + q]``, M-RoPE ``position_ids [B, 3, q]`` and per layer either a
GDN conv and recurrent state (``past_conv.{i}``, ``past_recurrent.{i}``: fixed shapes after the batch) or
an attention cache (``past_key_values.{i}.key|value``); it returns ``last_hidden_state`` and the new
states (``present_conv.{i}``, ``present_recurrent.{i}``, ``present.{i}.key|value``).

Rows (the family builds them; this module reads no prompt):

- whole rows: :class:`~edge_runtime.engine.causal.CausalRow` (token ids, embedded with the package's
  table) or :class:`EmbedsRow` (embeddings already built, e.g. with vision rows scattered in, and their
  M-RoPE positions). Rows of a call are RIGHT-padded into one batch (zero embeddings, mask 0); the result
  is each row's hidden state at its last real token, ``float32 [H]``. The graph gives a padded position
  no decay and no write (g = 0, beta = 0) and gathers each row's conv state at its last real token, so
  a row's answer does not depend on its batch: measured bit-identical alone vs batched, lengths 1 to
  200 across GDN chunk boundaries (tests/test_decision3_graph.py; engine/probe.py proves it at load).
- branch rows: :class:`~edge_runtime.engine.causal.BranchRow` (ids) or :class:`EmbedsBranchRow`: the
  prefix runs once at batch 1; its states (GDN conv + recurrent states, attention keys/values) are
  tiled into buffers per branch chunk, as engine/causal.py tiles a KV cache, and the branches continue
  right-padded from them; the result is ``[n_branches, H]`` in branch order. Only for ``causal`` graphs:
  with ``noncausal_full_attention`` a prefix's states depend on what follows it, so every branch runs
  whole (prefix + branch), batched as whole rows are.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .batching import padded_width
from .causal import ATTENTION_MASK, HIDDEN, POSITION_IDS, PRESENT_PREFIX, BranchRow, CausalRow, real_keys
from .causal import PAST_PREFIX as KV_PREFIX

if TYPE_CHECKING:  # keeps this module importable without onnxruntime
    from .session import GraphSession

INPUTS_EMBEDS = "inputs_embeds"
CONV_PREFIX, RECURRENT_PREFIX = "past_conv.", "past_recurrent."
CAUSAL, NONCAUSAL = "causal", "noncausal_full_attention"

#: Tiled state bytes one branch chunk may hold (GDN states are fixed per row; keys/values grow with the
#: prefix); more branches run in several chunks, which changes no row but bounds memory.
DEFAULT_MAX_BRANCH_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_BRANCH_ROWS = 64


@dataclass(frozen=True)
class EmbedsRow:
    """One sequence as embeddings ``float32 [n, H]`` and M-RoPE positions ``int64 [3, n]`` (None: text
    positions, three equal rows counting on from the start: 0, or after a branch's prefix)."""

    embeds: np.ndarray
    positions: np.ndarray | None = None


@dataclass(frozen=True)
class EmbedsBranchRow:
    """A prefix run once and the branches that continue it (each at least one token)."""

    prefix: EmbedsRow
    branches: tuple[EmbedsRow, ...]


def embeds_row(embeds: np.ndarray, positions: np.ndarray | None = None) -> EmbedsRow:
    """An EmbedsRow over float32 / int64 contiguous copies, shapes checked."""
    e = np.ascontiguousarray(np.asarray(embeds, dtype=np.float32))
    if e.ndim != 2 or e.shape[0] < 1:
        raise ValueError(f"embeddings must be [n >= 1, hidden], not {list(e.shape)}")
    p = None
    if positions is not None:
        p = np.ascontiguousarray(np.asarray(positions, dtype=np.int64))
        if p.shape != (3, e.shape[0]):
            raise ValueError(f"positions must be [3, {e.shape[0]}], not {list(p.shape)}")
    return EmbedsRow(e, p)


def text_positions(start: int, n: int) -> np.ndarray:
    """Text M-RoPE positions: three equal rows ``start .. start + n - 1``."""
    return np.broadcast_to(np.arange(start, start + n, dtype=np.int64), (3, n)).copy()


class RecurrentForward:
    """Runs whole rows and branch rows through a hybrid text core; results are last-token hidden states.

    ``embeddings`` is the token table ``[vocab, H]`` (memory-mapped is fine) that ids rows need; rows of
    embeddings need none. ``attention_mode`` is the package's (the card's): it decides whether a prefix's
    states can be shared. Calls are serialised (the branch buffers are shared).
    """

    def __init__(self, session: GraphSession, embeddings: np.ndarray | None = None, *,
                 attention_mode: str = CAUSAL, max_branch_bytes: int = DEFAULT_MAX_BRANCH_BYTES,
                 max_branch_rows: int = DEFAULT_MAX_BRANCH_ROWS) -> None:
        if attention_mode not in (CAUSAL, NONCAUSAL):
            raise ValueError(f"attention_mode must be {CAUSAL} or {NONCAUSAL}, not {attention_mode!r}")
        names = list(session.input_names)
        self.state_names = [n for n in names if n.startswith((CONV_PREFIX, RECURRENT_PREFIX, KV_PREFIX))]
        known = {INPUTS_EMBEDS, ATTENTION_MASK, POSITION_IDS, *self.state_names}
        unknown = [n for n in names if n not in known]
        missing = [n for n in (INPUTS_EMBEDS, ATTENTION_MASK, POSITION_IDS) if n not in session.inputs]
        if missing or unknown or HIDDEN not in session.outputs:
            raise ValueError(f"{session.path.name} is not a hybrid text core: inputs {names}, outputs "
                             f"{session.output_names}; needs {INPUTS_EMBEDS}, {ATTENTION_MASK}, {POSITION_IDS} "
                             f"and {HIDDEN}, may have {CONV_PREFIX}*, {RECURRENT_PREFIX}*, {KV_PREFIX}*")
        hidden = session.inputs[INPUTS_EMBEDS].shape[2] if len(session.inputs[INPUTS_EMBEDS].shape) == 3 else None
        if not isinstance(hidden, int):
            raise ValueError(f"{INPUTS_EMBEDS} has shape {session.inputs[INPUTS_EMBEDS].shape}; the hidden size "
                             "must be fixed")
        self.hidden = hidden
        self.session = session
        self.row_multiple: int = session.row_multiple
        self.embeddings = embeddings
        if embeddings is not None and (embeddings.ndim != 2 or embeddings.shape[1] != hidden):
            raise ValueError(f"the embedding table is {list(embeddings.shape)}; the graph wants [vocab, {hidden}]")
        self.attention_mode = attention_mode
        self.max_branch_bytes = int(max_branch_bytes)
        self.max_branch_rows = max(1, int(max_branch_rows))
        # state input -> (shape after the batch, with 0 for the attention past axis), and its output
        self._shape: dict[str, tuple[int, ...]] = {}
        self._present: dict[str, str] = {}
        for name in self.state_names:
            spec = session.inputs[name]
            if spec.type != "tensor(float)":
                raise ValueError(f"state input {name} is {spec.type}; expected float32")
            dims = spec.shape[1:]
            if name.startswith(KV_PREFIX):
                if len(dims) != 3 or not isinstance(dims[0], int) or not isinstance(dims[2], int):
                    raise ValueError(f"{name} has shape {spec.shape}; expected [batch, kv_heads, past, head_dim]")
                shape: tuple[int, ...] = (dims[0], 0, dims[2])
                present = PRESENT_PREFIX + name[len(KV_PREFIX):]
            else:
                if not all(isinstance(d, int) for d in dims):
                    raise ValueError(f"{name} has shape {spec.shape}; a GDN state has fixed dims after the batch")
                shape = tuple(int(d) for d in dims)  # type: ignore[arg-type]
                present = "present_" + name[len("past_"):]
            if present not in session.outputs:
                raise ValueError(f"state input {name} has no {present} output to fill it")
            self._shape[name] = shape
            self._present[name] = present
        self._buffers: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def can_branch(self) -> bool:
        """Whether branch rows share their prefix's states (causal graphs with states)."""
        return self.attention_mode == CAUSAL and bool(self.state_names)

    # ---- rows -----------------------------------------------------------------------------------

    def length(self, row: Any) -> int:
        """Tokens the row computes: the sequence, or the prefix once plus every branch."""
        if isinstance(row, BranchRow | EmbedsBranchRow):
            prefix = len(row.prefix) if isinstance(row, BranchRow) else len(row.prefix.embeds)
            branches = [len(b) if isinstance(b, np.ndarray) else len(b.embeds) for b in row.branches]
            if not self.can_branch:
                return sum(prefix + n for n in branches)
            return prefix + sum(branches)
        return len(row.ids) if isinstance(row, CausalRow) else len(row.embeds)

    def _as_embeds(self, row: CausalRow | EmbedsRow | np.ndarray) -> EmbedsRow:
        if isinstance(row, EmbedsRow):
            return row
        ids = row.ids if isinstance(row, CausalRow) else np.asarray(row, dtype=np.int64).reshape(-1)
        if self.embeddings is None:
            raise ValueError("rows of token ids need the embedding table; this forward was given none")
        if len(ids) < 1:
            raise ValueError("every sequence needs at least one token")
        if ids.min() < 0 or ids.max() >= self.embeddings.shape[0]:
            raise ValueError(f"token ids must be in [0, {self.embeddings.shape[0]})")
        return EmbedsRow(np.asarray(self.embeddings[ids], dtype=np.float32))

    def _branch_parts(self, row: BranchRow | EmbedsBranchRow) -> tuple[EmbedsRow, list[EmbedsRow]]:
        if not row.branches:
            raise ValueError("a branch row needs at least one branch")
        if isinstance(row, EmbedsBranchRow):
            return row.prefix, list(row.branches)
        prefix = (self._as_embeds(CausalRow(row.prefix)) if len(row.prefix)
                  else EmbedsRow(np.zeros((0, self.hidden), dtype=np.float32)))
        return prefix, [self._as_embeds(CausalRow(b)) for b in row.branches]

    def __call__(self, rows: Sequence[Any]) -> list[np.ndarray]:
        """One result per row, in order; the whole rows of one call share one right-padded batch."""
        with self._lock:
            results: list[np.ndarray | None] = [None] * len(rows)
            whole: list[tuple[int, int, EmbedsRow]] = []  # (row, branch or -1, sequence)
            branched: list[int] = []
            for i, row in enumerate(rows):
                if isinstance(row, BranchRow | EmbedsBranchRow):
                    prefix, branches = self._branch_parts(row)
                    if self.can_branch and len(prefix.embeds):
                        branched.append(i)
                    else:  # nothing to share, or a noncausal prefix that depends on its branch
                        whole += [(i, j, _joined(prefix, b)) for j, b in enumerate(branches)]
                        results[i] = np.empty((len(branches), self.hidden), dtype=np.float32)
                else:
                    whole.append((i, -1, self._as_embeds(row)))
            if whole:
                last = self._last_hidden([seq for _, _, seq in whole])
                for (i, j, _), h in zip(whole, last):
                    if j < 0:
                        results[i] = h
                    else:
                        out = results[i]
                        assert out is not None
                        out[j] = h
            for i in branched:
                prefix, branches = self._branch_parts(rows[i])
                results[i] = self._branch(prefix, branches)
            return results  # type: ignore[return-value]

    # ---- feeds -----------------------------------------------------------------------------------

    def empty_states(self, batch: int) -> dict[str, np.ndarray]:
        """Zero GDN states and empty caches for ``batch`` rows with no past."""
        return {n: np.zeros((batch, *shape), dtype=np.float32) for n, shape in self._shape.items()}

    def _padded(self, seqs: Sequence[EmbedsRow], past: int, start: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Right-padded embeds (zeros), mask (past ones, then the row's), positions (given, or text from
        start); the keys (past and new) rounded up to the row multiple."""
        lengths = np.array([len(s.embeds) for s in seqs], dtype=np.int64)
        if lengths.min(initial=1) < 1:
            raise ValueError("every sequence needs at least one token")
        width = padded_width(past + int(lengths.max()), self.row_multiple) - past
        embeds = np.zeros((len(seqs), width, self.hidden), dtype=np.float32)
        mask = np.zeros((len(seqs), past + width), dtype=np.int64)
        mask[:, :past] = 1
        positions = np.broadcast_to(start + np.arange(width, dtype=np.int64), (len(seqs), 3, width)).copy()
        for b, s in enumerate(seqs):
            n = len(s.embeds)
            if s.embeds.shape[1] != self.hidden:
                raise ValueError(f"a row's embeddings are {list(s.embeds.shape)}; the graph wants [n, {self.hidden}]")
            embeds[b, :n] = s.embeds
            mask[b, past:past + n] = 1
            if s.positions is not None:
                positions[b, :, :n] = s.positions
        return {INPUTS_EMBEDS: embeds, ATTENTION_MASK: mask, POSITION_IDS: positions}, lengths

    def _last_hidden(self, seqs: Sequence[EmbedsRow]) -> list[np.ndarray]:
        feeds, lengths = self._padded(seqs, 0, 0)
        feeds.update(self.empty_states(len(seqs)))
        hidden = self.session.run(feeds, [HIDDEN])[HIDDEN]
        last = np.array(hidden[np.arange(len(seqs)), lengths - 1], dtype=np.float32, copy=True)
        return [last[b].copy() for b in range(len(seqs))]

    # ---- state once ------------------------------------------------------------------------------

    def prefill(self, prefix: EmbedsRow) -> dict[str, np.ndarray]:
        """The prefix's states at batch 1 (by state input name), for branches to continue from."""
        if not self.can_branch:
            raise ValueError(f"{self.session.path.name} cannot share a prefix "
                             f"({self.attention_mode}, {len(self.state_names)} state inputs)")
        feeds, _ = self._padded([prefix], 0, 0)
        feeds.update(self.empty_states(1))
        out = self.session.run(feeds, [self._present[n] for n in self.state_names])
        # GDN states are gathered at the last real token already; attention caches hold the padding's keys
        return {n: real_keys(out[self._present[n]], len(prefix.embeds)) if n.startswith(KV_PREFIX)
                else out[self._present[n]] for n in self.state_names}

    def state_bytes_per_row(self, prefix_len: int) -> int:
        """Bytes of one row's tiled states after a prefix of ``prefix_len`` tokens."""
        total = 0
        for name, shape in self._shape.items():
            dims = (shape[0], prefix_len, shape[2]) if name.startswith(KV_PREFIX) else shape
            total += int(np.prod(dims)) * 4
        return total

    def _tiled(self, states: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """The batch-1 states repeated ``rows`` times, in buffers kept between calls (contiguous views)."""
        tiled = {}
        for name, value in states.items():
            need = rows * value[0].size
            buf = self._buffers.get(name)
            if buf is None or buf.size < need:
                buf = np.empty(need, dtype=np.float32)
                self._buffers[name] = buf
            view = buf[:need].reshape((rows, *value.shape[1:]))
            view[...] = value
            tiled[name] = view
        return tiled

    def _branch(self, prefix: EmbedsRow, branches: Sequence[EmbedsRow]) -> np.ndarray:
        states = self.prefill(prefix)
        past = len(prefix.embeds)
        start = int(prefix.positions.max()) + 1 if prefix.positions is not None else past
        order = sorted(range(len(branches)), key=lambda i: (len(branches[i].embeds), i))
        size = max(1, min(self.max_branch_rows, self.max_branch_bytes // max(1, self.state_bytes_per_row(past))))
        tiled = self._tiled(states, min(size, len(order)))
        out = np.empty((len(branches), self.hidden), dtype=np.float32)
        for first in range(0, len(order), size):
            chunk = order[first:first + size]
            feeds, lengths = self._padded([branches[i] for i in chunk], past, start)
            feeds.update({n: v[:len(chunk)] for n, v in tiled.items()})
            hidden = self.session.run(feeds, [HIDDEN])[HIDDEN]
            out[chunk] = hidden[np.arange(len(chunk)), lengths - 1]
        return out


def _joined(prefix: EmbedsRow, branch: EmbedsRow) -> EmbedsRow:
    """prefix + branch as one whole row (positions joined; text positions where both are text)."""
    if not len(prefix.embeds):
        return branch
    embeds = np.concatenate([prefix.embeds, branch.embeds])
    if prefix.positions is None and branch.positions is None:
        return EmbedsRow(embeds)
    p = prefix.positions if prefix.positions is not None else text_positions(0, len(prefix.embeds))
    b = branch.positions if branch.positions is not None else text_positions(int(p.max()) + 1, len(branch.embeds))
    return EmbedsRow(embeds, np.concatenate([p, b], axis=1))


__all__ = ["CAUSAL", "NONCAUSAL", "EmbedsBranchRow", "EmbedsRow", "RecurrentForward", "embeds_row",
           "text_positions"]
