"""The error every converter step raises for a problem the user can fix; the CLI prints it in one line."""

from __future__ import annotations


class ConversionError(Exception):
    """A conversion that cannot proceed; the message is one line, meant for the user."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), for a one-line error."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
