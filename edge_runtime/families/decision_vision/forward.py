"""The forward of a vision-language decision model: a grid-free vision core and a text core.

The vision core and everything grid-shaped are edge_runtime.vision_lm.grid's. The text core takes
``inputs_embeds [B, q, H]``, an additive ``attention_bias [B, 1, q, past + q]``, M-RoPE
``position_ids [B, 3, q]``, ``past_key_values.{i}.key|value`` (and ``deepstack_embeds [B, k, q, H]``,
added after layer i where the model has them); out ``last_hidden_state`` and ``present.{i}.*``.

The embedding table lives beside the graphs (``embeddings.npy``, memory-mapped): ids become rows
with a numpy gather and the vision rows are scattered over the pad tokens.

A :class:`VisionRow` is a state (text ids with media blocks in it) run once, and the questions that
branch from its key/value cache; the result is each branch's last-token hidden state. Branches are
right-padded in one batch; a padded key is masked by the bias, never read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_runtime.vision_lm.grid import DEEPSTACK, IMAGE_EMBEDS, Block, check_core, core_feeds, rope_positions

if TYPE_CHECKING:  # importable without onnxruntime
    from edge_runtime.engine.session import GraphSession

# the text core's names (the converter writes exactly these)
INPUTS_EMBEDS, ATTENTION_BIAS, POSITION_IDS = "inputs_embeds", "attention_bias", "position_ids"
HIDDEN = "last_hidden_state"
PAST_PREFIX, PRESENT_PREFIX = "past_key_values.", "present."
#: The additive bias of a masked key: float32's lowest, as Transformers' eager mask uses.
MASKED = float(np.finfo(np.float32).min)


# ---- rows and the forward ------------------------------------------------------------------


@dataclass(frozen=True)
class TreeBranch:
    """A question read as a token tree, ``steps`` forwards deep, from the state's cache.

    Each forward runs the committed ids (at first ``prefix``) and the tree's tokens; tree node i
    sees the state, every committed token, its ancestors (``parents``, -1 for none) and itself, at
    position ``next + committed + depths[i]``. The committed tokens join the cache, the tree's do
    not. ``advance(hiddens)`` gets every step's ``[1 + T, H]`` so far (the last committed position,
    then every node) and returns the ids to commit before the next forward: the family's decision,
    never the engine's, and a pure function of what it is given (a row may be run again).
    """

    prefix: np.ndarray
    tree_ids: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    steps: int
    advance: Callable[[Sequence[np.ndarray]], Sequence[int]]


@dataclass(frozen=True)
class VisionRow:
    """A state (ids with its media blocks) run once, and the question branches that continue it."""

    prefix: np.ndarray
    blocks: tuple[Block, ...]
    branches: tuple[np.ndarray, ...]
    trees: tuple[TreeBranch, ...] = ()


@dataclass(frozen=True)
class VisionOutput:
    """A row's results: each branch's last hidden state ``[n, H]``, each tree's ``[steps, 1 + T, H]``."""

    branches: np.ndarray
    trees: tuple[np.ndarray, ...] = ()


def _ids(v: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(v, dtype=np.int64).reshape(-1))


def vision_row(prefix: Sequence[int], blocks: Sequence[Block], branches: Sequence[Sequence[int]],
               trees: Sequence[TreeBranch] = ()) -> VisionRow:
    """A VisionRow over int64 copies of the ids."""
    return VisionRow(_ids(prefix), tuple(blocks), tuple(_ids(b) for b in branches), tuple(trees))


class VisionLanguageForward:
    """Runs VisionRows: the vision core per block, the state once, its branches from the cache.

    ``embeddings`` is the token table [vocab, H] (float32, memory-mapped is fine). Results are
    ``float32 [n_branches, H]`` per row. Calls are serialised (the engine runs one at a time).
    """

    def __init__(self, vision: GraphSession, text: GraphSession, embeddings: np.ndarray, *,
                 merge: int, side: int) -> None:
        self.vision, self.text, self.embeddings = vision, text, embeddings
        self.merge, self.side = int(merge), int(side)
        self.past_names = [n for n in text.input_names if n.startswith(PAST_PREFIX)]
        self.deepstack = DEEPSTACK in text.inputs
        needed = {INPUTS_EMBEDS, ATTENTION_BIAS, POSITION_IDS}
        if not needed <= set(text.inputs) or HIDDEN not in text.outputs or not self.past_names:
            raise ValueError(f"{text.path.name} is not a text core: inputs {text.input_names}")
        check_core(vision)
        if self.deepstack != (DEEPSTACK in vision.outputs):
            raise ValueError("the vision core and the text core disagree about deepstack features")
        self._past: dict[str, tuple[int, int]] = {}
        for name in self.past_names:
            shape = text.inputs[name].shape
            if len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(shape[3], int):
                raise ValueError(f"past input {name} has shape {shape}; expected fixed kv heads and head dim")
            self._past[name] = (shape[1], shape[3])
        self.hidden = int(embeddings.shape[1])
        self._lock = threading.Lock()

    def length(self, row: VisionRow) -> int:
        return (len(row.prefix) + sum(len(b) for b in row.branches)
                + sum(len(t.prefix) + t.steps * len(t.tree_ids) for t in row.trees))

    def encode_block(self, block: Block) -> tuple[np.ndarray, np.ndarray | None]:
        """The vision core over one block: its token rows, and its deepstack rows (or None)."""
        feeds = core_feeds(block.patches, block.grid_h, block.grid_w, self.side, self.merge)
        names = [IMAGE_EMBEDS, DEEPSTACK] if self.deepstack else [IMAGE_EMBEDS]
        out = self.vision.run(feeds, names)
        return out[IMAGE_EMBEDS], out.get(DEEPSTACK)

    def prefix_inputs(self, row: VisionRow) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The state's embeddings [P, H], M-RoPE positions [3, P] and deepstack additions [k, P, H]."""
        embeds = np.array(self.embeddings[row.prefix], dtype=np.float32)
        deep: np.ndarray | None = None
        for block in row.blocks:
            rows, stack = self.encode_block(block)
            n = block.tokens(self.merge)
            if rows.shape[0] != n:
                raise ValueError(f"the vision core gave {rows.shape[0]} rows for a block of {n} tokens")
            embeds[block.start:block.start + n] = rows
            if stack is not None:
                if deep is None:
                    deep = np.zeros((stack.shape[0], len(row.prefix), self.hidden), dtype=np.float32)
                deep[:, block.start:block.start + n] = stack
        return embeds, rope_positions(len(row.prefix), row.blocks, self.merge), deep

    def run_text(self, embeds: np.ndarray, bias: np.ndarray, positions: np.ndarray,
                 past: dict[str, np.ndarray], deep: np.ndarray | None) -> dict[str, np.ndarray]:
        """One text-core call; returns the hidden states and the present cache by past name."""
        feeds = {INPUTS_EMBEDS: embeds, ATTENTION_BIAS: bias, POSITION_IDS: positions, **past}
        if self.deepstack:
            k = self.text.inputs[DEEPSTACK].shape[1]
            feeds[DEEPSTACK] = deep if deep is not None else np.zeros(
                (embeds.shape[0], k if isinstance(k, int) else 0, *embeds.shape[1:]), dtype=np.float32)
        names = [HIDDEN, *(PRESENT_PREFIX + n[len(PAST_PREFIX):] for n in self.past_names)]
        out = self.text.run(feeds, names)
        result = {HIDDEN: out[HIDDEN]}
        result.update({n: out[PRESENT_PREFIX + n[len(PAST_PREFIX):]] for n in self.past_names})
        return result

    def prefill(self, row: VisionRow) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
        """The state's cache, its last hidden state and the next text position."""
        embeds, positions, deep = self.prefix_inputs(row)
        p = len(row.prefix)
        bias = causal_bias(p)[None, None]
        empty = {n: np.zeros((1, h, 0, d), dtype=np.float32) for n, (h, d) in self._past.items()}
        out = self.run_text(embeds[None], bias, positions[None], empty,
                            None if deep is None else deep[None])
        cache = {n: out[n] for n in self.past_names}
        return cache, out[HIDDEN][0, -1].copy(), int(positions.max()) + 1

    def __call__(self, rows: Sequence[Any]) -> list[VisionOutput]:
        with self._lock:
            return [self._row(r) for r in rows]

    def _row(self, row: VisionRow) -> VisionOutput:
        if not row.branches and not row.trees:
            raise ValueError("a VisionRow needs at least one branch or tree")
        cache, _, start = self.prefill(row)
        branches = (self._branches(row, cache, start) if row.branches
                    else np.zeros((0, self.hidden), dtype=np.float32))
        return VisionOutput(branches, self._trees(row.trees, cache, start))

    def _trees(self, trees: Sequence[TreeBranch], cache: dict[str, np.ndarray],
               start: int) -> tuple[np.ndarray, ...]:
        """Every tree of a row, those of one shape batched: one forward per step for all of them.

        Row i holds its committed ids, padding to the longest, then the tree; its own committed cache
        (``extra``) sits after the state's, padded to the longest. Every padded key is masked, so a
        tree reads what it reads alone (measured bit-identical on ORT CPU fp32; tests allow 1e-5);
        the weights are read once per step for all the boxes and moments of a request, not per tree.
        """
        out: list[np.ndarray | None] = [None] * len(trees)
        groups: dict[tuple[int, bytes, bytes], list[int]] = {}
        for i, t in enumerate(trees):
            groups.setdefault((t.steps, t.tree_ids.tobytes(), t.parents.tobytes()), []).append(i)
        for members in groups.values():
            for i, hidden in zip(members, self._tree_batch([trees[i] for i in members], cache, start)):
                out[i] = hidden
        return tuple(o for o in out if o is not None)

    def _tree_batch(self, trees: Sequence[TreeBranch], cache: dict[str, np.ndarray], start: int) -> list[np.ndarray]:
        first = trees[0]
        t_len, n = len(first.tree_ids), len(trees)
        sees = np.eye(t_len, dtype=bool)
        for i, p in enumerate(first.parents):
            while p >= 0:
                sees[i, p] = True
                p = first.parents[p]
        tree_bias = np.where(sees, 0.0, MASKED).astype(np.float32)
        state = next(iter(cache.values())).shape[2]
        committed = [_ids(t.prefix) for t in trees]
        extra: list[dict[str, np.ndarray]] = [{} for _ in trees]  # each tree's committed keys so far
        extra_len = [0] * n
        results: list[list[np.ndarray]] = [[] for _ in trees]
        for step in range(first.steps):
            c = [len(x) for x in committed]
            if min(c) < 1:
                raise ValueError("every tree step commits at least one token")
            width, e_max = max(c), max(extra_len)
            q = width + t_len
            keys = state + e_max + q
            ids = np.zeros((n, q), dtype=np.int64)
            bias = np.full((n, 1, q, keys), MASKED, dtype=np.float32)
            positions = np.zeros((n, 3, q), dtype=np.int64)
            for i in range(n):
                ids[i, :c[i]] = committed[i]
                ids[i, width:] = first.tree_ids
                visible = np.zeros(keys, dtype=bool)
                visible[:state + extra_len[i]] = True  # the state and this tree's committed tokens
                bias[i, 0, :, :][:, visible] = 0.0
                new = state + e_max
                bias[i, 0, :c[i], new:new + c[i]] = causal_bias(c[i])
                bias[i, 0, c[i]:width, new:new + 1] = 0.0  # padding rows see one key; never read
                bias[i, 0, width:, new:new + c[i]] = 0.0
                bias[i, 0, width:, new + width:] = tree_bias
                at = start + extra_len[i]
                positions[i, :, :c[i]] = at + np.arange(c[i])
                positions[i, :, c[i]:width] = at
                positions[i, :, width:] = at + c[i] + first.depths
            past = {}
            for name in self.past_names:
                shared = cache[name]
                buf = np.zeros((n, shared.shape[1], state + e_max, shared.shape[3]), dtype=shared.dtype)
                buf[:, :, :state] = shared[0]
                for i in range(n):
                    if extra_len[i]:
                        buf[i, :, state:state + extra_len[i]] = extra[i][name]
                past[name] = buf
            embeds = np.array(self.embeddings[ids], dtype=np.float32)
            result = self.run_text(embeds, bias, positions, past, None)
            hidden = result[HIDDEN]
            for i in range(n):
                results[i].append(np.concatenate([hidden[i, c[i] - 1:c[i]], hidden[i, width:]]).astype(np.float32))
                # this step's committed keys join the tree's own cache; the tree's keys are dropped
                new = state + e_max
                for name in self.past_names:
                    mine = result[name][i, :, new:new + c[i]]
                    extra[i][name] = (np.concatenate([extra[i][name], mine], axis=1) if extra_len[i]
                                      else np.ascontiguousarray(mine))
                extra_len[i] += c[i]
            if step + 1 < first.steps:
                committed = [_ids(t.advance(results[i])) for i, t in enumerate(trees)]
        return [np.stack(r) for r in results]

    def _tree(self, tree: TreeBranch, cache: dict[str, np.ndarray], start: int) -> np.ndarray:
        """``[steps, 1 + T, H]``: each forward's last committed position and tree nodes."""
        sees = np.eye(len(tree.tree_ids), dtype=bool)
        for i, p in enumerate(tree.parents):
            while p >= 0:
                sees[i, p] = True
                p = tree.parents[p]
        committed = _ids(tree.prefix)
        past = next(iter(cache.values())).shape[2]
        out = []
        for step in range(tree.steps):
            c, t = len(committed), len(tree.tree_ids)
            if c < 1:
                raise ValueError("every tree step commits at least one token")
            bias = np.full((1, 1, c + t, past + c + t), MASKED, dtype=np.float32)
            bias[0, 0, :, :past] = 0.0
            bias[0, 0, :c, past:past + c] = causal_bias(c)
            bias[0, 0, c:, past:past + c] = 0.0
            bias[0, 0, c:, past + c:] = np.where(sees, 0.0, MASKED)
            positions = np.concatenate([start + np.arange(c), start + c + tree.depths]).astype(np.int64)
            ids = np.concatenate([committed, tree.tree_ids])
            embeds = np.array(self.embeddings[ids], dtype=np.float32)[None]
            result = self.run_text(embeds, bias, np.broadcast_to(positions, (1, 3, c + t)).copy(), cache, None)
            hidden = np.array(result[HIDDEN][0, c - 1:], dtype=np.float32)
            out.append(hidden)
            # the committed tokens join the cache; the tree's are dropped
            cache = {n: np.ascontiguousarray(result[n][:, :, :past + c]) for n in self.past_names}
            past, start = past + c, start + c
            if step + 1 < tree.steps:
                committed = _ids(tree.advance(out))
        return np.stack(out)

    def _branches(self, row: VisionRow, cache: dict[str, np.ndarray], start: int) -> np.ndarray:
        past = len(row.prefix)
        lengths = np.array([len(b) for b in row.branches], dtype=np.int64)
        if lengths.min() < 1:
            raise ValueError("every branch needs at least one token")
        width, n = int(lengths.max()), len(row.branches)
        ids = np.zeros((n, width), dtype=np.int64)
        bias = np.full((n, 1, width, past + width), MASKED, dtype=np.float32)
        bias[:, :, :, :past] = 0.0
        for b, branch in enumerate(row.branches):
            ids[b, :len(branch)] = branch
            bias[b, 0, :, past:] = causal_bias(width)
            bias[b, 0, :, past + len(branch):] = MASKED  # padded keys are never read
        embeds = np.array(self.embeddings[ids], dtype=np.float32)
        positions = np.broadcast_to(start + np.arange(width, dtype=np.int64), (n, 3, width)).copy()
        tiled = {name: np.ascontiguousarray(np.broadcast_to(v, (n, *v.shape[1:]))) for name, v in cache.items()}
        out = self.run_text(embeds, bias, positions, tiled, None)
        return np.array(out[HIDDEN][np.arange(n), lengths - 1], dtype=np.float32)


def causal_bias(n: int) -> np.ndarray:
    """[n, n] additive bias: 0 on and below the diagonal, MASKED above it."""
    bias = np.zeros((n, n), dtype=np.float32)
    bias[np.triu_indices(n, 1)] = MASKED
    return bias


__all__ = ["MASKED", "TreeBranch", "VisionLanguageForward", "VisionOutput", "VisionRow", "causal_bias", "vision_row"]
