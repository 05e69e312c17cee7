"""Reliability tests of the real server process: fuzzing, overload, hostile bodies, soak, disconnects.

Every server here is a subprocess on 127.0.0.1 started with its own models file and flags; every
loop is bounded in requests and in time. The long versions are marked ``heavy`` (``make test-heavy``).
"""
