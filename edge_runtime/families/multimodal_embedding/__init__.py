"""The multimodal embedding family: one graph per tower (text, image, audio) into one space;
``family.py`` (the family), ``features.py`` (numpy model inputs equal to the HF processors).
"""
