"""The Transformers 5 contestant of the decision3 bench: ``.venv-ref/bin/python -m bench.decision3_torch
--threads N --source SRC --package PKG`` (a WorkerProcess; bench/decision3.py starts it).

It loads the upstream source's text model as the converter's reference does
(converters/decision3/reference.py: ``Qwen3_5TextModel``, fp32, SDPA, eval; upstream's noncausal hook where
the package's mode asks for it) and reads the code probabilities through the converted package's readout and
temperature with the server's own numpy function (edge_runtime.heads.decisions.code_probabilities), so that
only the backbone differs between the contestants.

A body is ``{"rows": [[token id, ...], ...], "counts": [options, ...], "prefix": P}``: the harness renders
and tokenizes the prompts exactly as the server does. ``prefix`` 0 runs every row whole, one after the
other; ``prefix`` P > 0 runs the rows' first P tokens once with Transformers' own cache (DynamicCache: GDN
and attention states) and continues each row from a copy of it, as a user of Transformers shares a prefix.
The answer is ``{"probabilities": [[p, ...], ...]}``; runners.serve_worker times whole answers in process.

Runs in the reference environment only (Transformers 5 has Qwen3.5; the exporter's Transformers 4 has not):
it imports nothing of edge_runtime but the numpy readout.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.runners import Answer, serve_worker, stay_offline


def load(source: Path, package: Path, threads: int) -> Answer:
    """The answer function over ``source``'s weights and ``package``'s readout (see the module docstring)."""
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    from transformers.cache_utils import DynamicCache

    from converters.decision3.reference import build_model, load_weights, text_config
    from edge_runtime.heads.decisions import code_probabilities

    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    ours = json.loads((package / "decision_config.json").read_text(encoding="utf-8"))
    weights = sorted(str(p) for p in source.glob("model*.safetensors"))
    model = build_model(text_config(config), load_weights(weights), str(ours["attention_mode"]))
    with np.load(package / "head.npz") as head:
        readout = np.ascontiguousarray(head["readout"], dtype=np.float32)
    temperature = float(ours["temperature"])

    def last(ids: Sequence[int], cache: Any = None, past: int = 0) -> np.ndarray:
        """The last position's hidden state of ``ids`` (after ``past`` cached tokens)."""
        mask = torch.ones((1, past + len(ids)), dtype=torch.long)
        out = model(input_ids=torch.tensor([list(ids)]), attention_mask=mask, past_key_values=cache,
                    use_cache=cache is not None)
        hidden: np.ndarray = out.last_hidden_state[0, -1].numpy()
        return hidden

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        rows, counts, prefix = body["rows"], body["counts"], int(body.get("prefix", 0))
        with torch.no_grad():
            if prefix:
                cache = DynamicCache(config=model.config)
                last(rows[0][:prefix], cache)
                hidden = [last(r[prefix:], copy.deepcopy(cache), prefix) for r in rows]
            else:
                hidden = [last(r) for r in rows]
        probs = [code_probabilities(h, readout, int(k), temperature).tolist() for h, k in zip(hidden, counts)]
        return {"probabilities": probs}

    return respond


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decision3_torch", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--source", type=Path, required=True, help="the upstream-format source (its weights)")
    parser.add_argument("--package", type=Path, required=True, help="the converted package (readout, temperature)")
    args = parser.parse_args(argv)
    stay_offline()
    return serve_worker(lambda: load(args.source, args.package, args.threads))


if __name__ == "__main__":
    sys.exit(main())
