"""The decision-vision family (Qwen3-VL): ``processor.py`` (the Qwen2-VL image processor and video
frame pairs), ``vision_lm.py`` (the two graphs' forward, grid taps and M-RoPE), ``box_grid.py`` (the
Box digit tree), ``family.py`` (the served family).
"""
