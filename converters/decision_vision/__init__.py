"""The decision-vision converter: export.py (the vision core and the text graph of a Qwen-VL model),
verify.py (against Transformers at three image sizes and a video, the Box readout), fixture.py (a
tiny source), cli.py."""
