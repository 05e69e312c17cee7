"""The decision-codes converter: export.py (any causal LM Optimum exports, its readout and card),
verify.py (against Transformers), fixture.py (a tiny Qwen3-shaped source), cli.py (its options)."""
