"""The one error a package reader raises."""

from __future__ import annotations


class PackageError(Exception):
    """A package that cannot be loaded; ``str(e)`` names the offending file first."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file = file
        self.reason = reason
