"""Model families: one folder per family (its layout, prompt words, request reading, readout and
answers), what the decision families share (decision_plan.py), what every per-input surface
shares (items.py, embeddings.py), the family protocol (base.py) and the registry (registry.py).
"""
