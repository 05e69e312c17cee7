"""The Vela 2.0 converter: source.py (the upstream unified package), requests.py (the requests the
parity check runs), export.py (graph, marker head, card), verify.py (the PyTorch reference and the
parity check), fixture.py (upstream-format sources), cli.py."""
