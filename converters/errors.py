"""The error every converter step raises for a problem the user can fix; the CLI prints it in one line."""

from __future__ import annotations


class ConversionError(Exception):
    """A conversion that cannot proceed; the message is one line, meant for the user."""
