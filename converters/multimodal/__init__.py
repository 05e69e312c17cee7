"""The multimodal embedding converter: source.py (config and processor settings),
ctranslate2_whisper.py (CTranslate2 Whisper checkpoints read as data), export.py (one graph per
tower), verify.py (each tower against Transformers), fixture.py (tiny SigLIP/CLIP/Whisper/CLAP
sources), cli.py."""
