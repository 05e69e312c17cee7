"""The Forward for encoder graphs: right-padded batches of token rows in, per-row outputs out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .batching import Buckets, padded_width

if TYPE_CHECKING:  # keeps this module importable without onnxruntime
    from .session import GraphSession, TensorSpec

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"
_KNOWN_INPUTS = (INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS)

_INT_TYPES: dict[str, type[np.integer]] = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class EncoderForward:
    """Runs rows with `.ids` and `.type_ids` (int64 [n]) through an encoder graph.

    Rows are RIGHT-padded to the batch's longest row with `pad_id` and a zero attention mask:
    right padding keeps fp32 ORT CPU rows bit-identical to running them alone, left padding does
    not (docs/reference/feasibility-notes.md A.2). Each row's result is a dict {output: array}: outputs with a
    sequence axis ([b, s, ...]) are cut to the row's real length, the others ([b, ...]) give
    the row's entry. Arrays are copies, owned by the row.

    With ``buckets`` (see :meth:`bucketed`) every batch is padded to its bucket's width, and to its
    row count with copies of the first row, so each forward has one of a few fixed shapes. Every
    width, a row alone included, is rounded up to the session's ``row_multiple``.
    """

    def __init__(self, session: GraphSession, outputs: Sequence[str] | None = None, pad_id: int = 0,
                 buckets: Buckets | None = None) -> None:
        missing = [name for name in (INPUT_IDS, ATTENTION_MASK) if name not in session.inputs]
        unknown = [name for name in session.input_names if name not in _KNOWN_INPUTS]
        if missing or unknown:
            raise ValueError(
                f"{session.path.name} is not an encoder graph this forward can feed: "
                f"inputs {session.input_names}, needs {INPUT_IDS} and {ATTENTION_MASK}, "
                f"may have {TOKEN_TYPE_IDS}"
            )
        self.session = session
        self.pad_id = int(pad_id)
        self.output_names: list[str] = list(outputs) if outputs is not None else list(session.output_names)
        absent = [name for name in self.output_names if name not in session.outputs]
        if absent:
            raise ValueError(f"{session.path.name} has no output {', '.join(absent)} (has {session.output_names})")
        self._dtypes = {name: _int_dtype(session.inputs[name]) for name in session.input_names}
        self._has_type_ids = TOKEN_TYPE_IDS in session.inputs
        ids_shape = session.inputs[INPUT_IDS].shape
        seq_dim = ids_shape[1] if len(ids_shape) >= 2 else None
        # True: has a sequence axis; False: per row only; None: decide from the run's shape.
        self._sequence_axis = {name: _has_sequence_axis(session.outputs[name], seq_dim) for name in self.output_names}
        self.buckets = buckets
        self.row_multiple: int = session.row_multiple

    def bucketed(self, buckets: Buckets) -> EncoderForward:
        """This forward over the same session, running every batch at a shape of ``buckets``."""
        return EncoderForward(self.session, self.output_names, self.pad_id, buckets)

    def length(self, row: Any) -> int:
        """Tokens in the row, specials included."""
        return len(row.ids)

    def feeds(self, rows: Sequence[Any], width: int | None = None) -> dict[str, np.ndarray]:
        """The right-padded input tensors for `rows`, ``width`` tokens wide (default: the longest row),
        rounded up to the row multiple."""
        width = padded_width(max(len(row.ids) for row in rows) if width is None else width, self.row_multiple)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        type_ids = np.zeros((len(rows), width), dtype=np.int64) if self._has_type_ids else None
        for b, row in enumerate(rows):
            n = len(row.ids)
            ids[b, :n] = row.ids
            mask[b, :n] = 1
            if type_ids is not None:
                type_ids[b, :n] = row.type_ids
        feeds = {INPUT_IDS: ids, ATTENTION_MASK: mask}
        if type_ids is not None:
            feeds[TOKEN_TYPE_IDS] = type_ids
        return {name: value.astype(self._dtypes[name], copy=False) for name, value in feeds.items()}

    def __call__(self, rows: Sequence[Any]) -> list[dict[str, np.ndarray]]:
        """Run `rows` as one batch; one dict of outputs per row, in order."""
        if not rows:
            return []
        real = len(rows)
        width = None
        if self.buckets is not None:
            width = self.buckets.width(max(len(row.ids) for row in rows))
            if self.buckets.rows is not None:
                if real > self.buckets.rows:
                    raise ValueError(f"{real} rows do not fit a bucket of {self.buckets.rows} rows")
                rows = [*rows, *[rows[0]] * (self.buckets.rows - real)]  # fillers, dropped below
        feeds = self.feeds(rows, width)
        width = feeds[INPUT_IDS].shape[1]
        values = self.session.run(feeds, self.output_names)
        results: list[dict[str, np.ndarray]] = [{} for _ in range(real)]
        for name in self.output_names:
            value = values[name]
            if value.ndim == 0 or value.shape[0] != len(rows):
                raise ValueError(f"output {name} has shape {value.shape}, expected a batch axis of {len(rows)}")
            sequence = self._sequence_axis[name]
            if sequence is None:
                sequence = value.ndim >= 2 and value.shape[1] == width
            for b, row in enumerate(rows[:real]):
                part = value[b, : len(row.ids)] if sequence else value[b]
                results[b][name] = np.array(part, copy=True)
        return results


def _int_dtype(spec: TensorSpec) -> type[np.integer]:
    try:
        return _INT_TYPES[spec.type]
    except KeyError:
        raise ValueError(f"input {spec.name} has type {spec.type}; expected int64 or int32") from None


def _has_sequence_axis(spec: TensorSpec, seq_dim: int | str | None) -> bool | None:
    if len(spec.shape) < 2:
        return False
    dim = spec.shape[1]
    if seq_dim is not None and dim == seq_dim:
        return True
    if isinstance(dim, int):
        return False  # a fixed size such as num_labels or hidden
    return None
