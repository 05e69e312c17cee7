"""The task-heads converter: ModernBERT and mmBERT task sources (Vela 1.0 and compatible) -> task-heads packages."""
