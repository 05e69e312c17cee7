"""Pure numpy readouts: no onnxruntime, no sanic, no I/O."""
