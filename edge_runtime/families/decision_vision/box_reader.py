"""Box questions of a decision-vision package, read as Qwen3-VL writes boxes: ``{"bbox_2d": [x1, y1, x2, y2]}``.

Where the package carries ``box`` in decision_config.json and :data:`BOX_READOUT` in head.npz, a Box is a
tree branch of the state's row, four forwards deep (one per edge, box_grid.py's digit tree), answered as
edges over 0..1000 with the card's confidence formula (box_grid.CONFIDENCE_FORMULA).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from edge_runtime.families.codes_prompt import CodesPrompt
from edge_runtime.families.decision_vision.box_grid import digit_tree, edge_distribution, pick, window_probability
from edge_runtime.families.decision_vision.forward import TreeBranch
from edge_runtime.questions import Question
from edge_runtime.questions.box import box_answer

BOX_READOUT = "box_readout"  # head.npz: LM-head rows of the digits 0-9, the separator and the end
BOX_REPLY = ('Reply with only its bounding box as JSON {"bbox_2d": [x1, y1, x2, y2]}, each coordinate '
             "from 0 to 1000.")
BOX_EDGES = 4


class BoxReader:
    """Box questions as Qwen3-VL writes boxes: ``{"bbox_2d": [x1, y1, x2, y2]}`` on the 0..1000 grid.

    The question part is ``Question:\n<instructions>\n\n<BOX_REPLY>``, the chat markup, then the
    forced ``{"bbox_2d": [``; each edge is one forward of the digit tree (box_grid.py) whose
    terminator is the separator's first token (the end's for the last edge). The picked edge's
    digits and the separator are committed before the next edge; right >= left, bottom >= top.
    """

    def __init__(self, prompt: CodesPrompt, box: dict[str, Any], readout: np.ndarray) -> None:
        self.prompt = prompt
        self.digit_ids = np.asarray(box["digit_ids"], dtype=np.int64)
        self.prefix_ids = [int(i) for i in box["prefix_ids"]]
        self.separator_ids = [int(i) for i in box["separator_ids"]]
        self.readout = np.ascontiguousarray(readout, dtype=np.float32)  # [12, H]
        if self.readout.shape[0] != 12 or len(self.digit_ids) != 10:
            raise ValueError("the box readout needs 10 digits, the separator and the end")
        self.tree = digit_tree()

    def question_ids(self, q: Question, budget: int, time: float | None = None) -> list[int] | None:
        what = q.instructions if isinstance(q.instructions, str) else json.dumps(q.instructions)
        # a moment of the video is named as the pairs' timestamps name it
        text = f"Question:\n{'' if time is None else f'At {time:.1f} seconds: '}{what}"
        ids = self.prompt.bounded(f"{text}\n\n{BOX_REPLY}", budget - len(self.prompt.after) - len(self.prefix_ids),
                                   cache=True)
        return None if ids is None else [*ids, *self.prompt.after, *self.prefix_ids]

    def tokens(self, question: Sequence[int]) -> int:
        """Tokens a box reads: its question part and the tree once per edge (committed digits aside)."""
        return len(question) + BOX_EDGES * len(self.tree.digits)

    def distribution(self, edge: int, hidden: np.ndarray, temperature: float) -> np.ndarray:
        """P(v), v = 0..1000, of one edge from its forward's ``[1 + T, H]``."""
        rows = self.readout[[*range(10), 10 if edge < BOX_EDGES - 1 else 11]]
        return edge_distribution(hidden @ rows.T, self.tree, temperature)

    def edges(self, hiddens: Sequence[np.ndarray], temperature: float) -> tuple[list[int], list[np.ndarray]]:
        """The picked edges and their distributions, edge by edge as the forwards committed them."""
        picks: list[int] = []
        dists = []
        for edge, hidden in enumerate(hiddens):
            p = self.distribution(edge, hidden, temperature)
            picks.append(pick(p, picks[edge - 2] if edge >= 2 else 0))  # x2 >= x1, y2 >= y1
            dists.append(p)
        return picks, dists

    def branch(self, question: Sequence[int], temperature: float) -> TreeBranch:
        def advance(hiddens: Sequence[np.ndarray]) -> list[int]:
            v = self.edges(hiddens, temperature)[0][-1]  # the edge just read, masked by the earlier ones
            return [*(int(self.digit_ids[int(d)]) for d in str(v)), *self.separator_ids]

        return TreeBranch(np.asarray(question, dtype=np.int64), self.digit_ids[self.tree.digits],
                          self.tree.parents, self.tree.depths, BOX_EDGES, advance)

    def answer(self, hiddens: np.ndarray, temperature: float, time: float | None = None) -> dict[str, Any]:
        (x1, y1, x2, y2), dists = self.edges(list(hiddens), temperature)
        windows = [window_probability(p, v) for p, v in zip(dists, (x1, y1, x2, y2))]
        confidence = float(np.prod(windows) ** (1 / len(windows)))
        return box_answer(x1 / 1000, y1 / 1000, x2 / 1000, y2 / 1000, confidence, time)


__all__ = ["BOX_EDGES", "BOX_READOUT", "BOX_REPLY", "BoxReader"]
