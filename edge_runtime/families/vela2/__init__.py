"""The Vela 2.0 family (ModernBERT encoder + marker head): ``state.py`` (request parts and engine
questions), ``words.py`` (word units for spans), ``layout.py`` (token rows and windows), ``marker.py``
(the numpy head), ``answers.py`` (answer assembly), ``pipeline.py`` (one request end to end, shared with
the converter's parity check), ``family.py`` (the served family).
"""
