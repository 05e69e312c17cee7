"""The sparrow converter (`converters default`): source.py (the sparrow-decider wheel read as data),
graphs.py (model.onnx and its question and answer halves), verify.py (against the numpy Decider, the
halves bit for bit), export.py (the package)."""
