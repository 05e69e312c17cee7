"""The task-heads family: ModernBERT and mmBERT task packages (the Vela 1.0 classifiers, embedder and
reranker, and compatible checkpoints) with their heads read as the Router's runtime reads them; ``family.py``
plans requests into token rows and reads the outputs with the numpy heads.
"""
