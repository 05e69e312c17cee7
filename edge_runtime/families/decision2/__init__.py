"""The Decision 2.0 family: ``prompt.py`` (the prompt and its tokens), ``candidate.py`` (the numpy
candidate head), ``pipeline.py`` (one request's answers, shared with the converter's parity check),
``family.py`` (the served family).
"""
