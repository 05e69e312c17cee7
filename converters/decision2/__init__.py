"""The Decision 2.0 converter: source.py (the upstream dev2 package, LoRA adapters over a pinned base),
export.py (graph, candidate head, card), verify.py (against PyTorch), fixture.py (upstream-format
sources), cli.py."""
