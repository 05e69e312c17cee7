"""edge-runtime: ONNX Runtime inference server for decision models, classifiers, embedders and rerankers."""

API_VERSION = "5.0.0"
__version__ = "0.1.0"
