"""The encoder family: classify (sequence, scores and token heads), embeddings and rerank over one
encoder graph; ``family.py`` plans requests into token rows and reads the outputs with the heads.
"""
