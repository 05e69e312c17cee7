"""Decision 3.0 (``d3-code-readout-v1``): upstream packages converted to an ONNX text core plus a numpy readout."""
