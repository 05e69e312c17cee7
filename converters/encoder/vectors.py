"""The embedding a package serves against sentence-transformers' own: whole vectors, prompts included.

The hidden-state parity (verify.py) checks the graph; this checks everything after it as the server
reads it: the input_type's prompt before the text, the package tokenizer, pooling over the real tokens
of a right-padded batch, the Dense projections, Matryoshka truncation and normalisation
(edge_runtime.heads.pooling.embed), against ``SentenceTransformer.encode`` with ``prompt_name`` (its
``truncate_dim`` slices the full vector, so each dimension is that slice, renormalised where the model
normalises). An export whose vectors fall below VECTOR_MIN_COSINE is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError
from converters.samples import SAMPLE_TEXTS
from converters.sentence_transformers import SentenceTransformerInfo
from converters.verify import encode_rows, pad_batch, rounded
from edge_runtime.heads.pooling import embed

#: the least cosine between a package's vector and sentence-transformers' for the same input
VECTOR_MIN_COSINE = 0.99999


def check_vectors(src: Path, session: Any, tokenizer: Any, head: dict[str, Any], st: SentenceTransformerInfo,
                  max_tokens: int, pad_id: int) -> dict[str, Any]:
    """Vectors of the sample texts, with no input_type and each prompt, at every dimension, against
    sentence-transformers in fp32; the card's ``verification.vectors``. ConversionError below the floor."""
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(src), device="cpu", local_files_only=True,
                                    model_kwargs={"dtype": torch.float32})
    texts = list(SAMPLE_TEXTS[:4])
    input_names = [i.name for i in session.get_inputs()]
    dense = [(d.weight, d.bias, d.activation) for d in st.dense]
    worst_cos, worst_abs, cases = 1.0, 0.0, 0
    for input_type, prompt_name in [(None, None), *((t, t) for t in head.get("prompts", {}))]:
        prompt = head["prompts"][input_type] if input_type else ""
        rows = encode_rows(tokenizer, [prompt + t for t in texts], max_tokens)
        feeds = pad_batch(rows, input_names, pad_id)
        hidden = session.run(["last_hidden_state"], feeds)[0]
        with torch.no_grad():
            full = np.asarray(reference.encode(texts, prompt_name=prompt_name, convert_to_numpy=True,
                                               batch_size=len(texts)), dtype=np.float64)
        for dim in head["dimensions"]:
            ours = np.stack([embed(hidden[i, :len(r["input_ids"])], head["pooling"], head["normalize"],
                                   dim if dim != head["dimension"] else None, dense) for i, r in enumerate(rows)])
            # encode(truncate_dim=dim) is this slice of the full vector (after its Normalize module)
            ref = full[:, :dim]
            if head["normalize"]:
                ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
            cos = np.sum(ours * ref, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
            worst_cos = min(worst_cos, float(cos.min()))
            worst_abs = max(worst_abs, float(np.abs(ours - ref).max()))
            cases += len(texts)
    del reference
    report = {"reference": f"sentence-transformers {sentence_transformers.__version__} fp32 encode",
              "min_cosine": float(f"{worst_cos:.8f}"), "max_abs_diff": rounded(worst_abs),
              "min_cosine_required": VECTOR_MIN_COSINE, "cases": cases,
              "input_types": sorted(head.get("prompts", {})), "dimensions": list(head["dimensions"])}
    if not worst_cos >= VECTOR_MIN_COSINE:
        raise ConversionError(f"vector check failed: least cosine to sentence-transformers {worst_cos:.6f} "
                              f"(required {VECTOR_MIN_COSINE}); no package written")
    return report
