"""The encoder converter (embedding, sequence-classification, multi-label, token-classification, rerank):
export.py (any encoder Optimum exports, its head and card), verify.py (against PyTorch), fixture.py (a
tiny BERT-shaped source), cli.py (its options)."""
