"""The decision-vision family (Qwen3-VL): ``planner.py`` (media, the codes-v1 prompt with its vision blocks, the
readout), ``forward.py`` (the two graphs' forward: the state once, branches and box trees from its cache),
``box_reader.py`` and ``box_grid.py`` (Box questions and their digit tree), ``family.py`` (the served family).
The image processor and the grid arithmetic are edge_runtime.vision_lm's.
"""
