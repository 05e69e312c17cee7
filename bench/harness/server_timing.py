"""Parsing the server's Server-Timing header ("parse;dur=0.041, ..., total;dur=3.2", durations in ms)."""

from __future__ import annotations


def parse_server_timing(value: str) -> dict[str, float]:
    """Map each metric name to its `dur` in ms; metrics without a dur are skipped.

    Follows the header grammar loosely: metrics separated by commas, parameters by semicolons,
    optional whitespace, `desc` and other parameters ignored, quoted values unquoted.
    Raises ValueError on a dur that is not a number.
    """
    out: dict[str, float] = {}
    for metric in value.split(","):
        parts = [p.strip() for p in metric.split(";")]
        name = parts[0]
        if not name:
            continue
        for param in parts[1:]:
            key, sep, raw = param.partition("=")
            if sep and key.strip().lower() == "dur":
                try:
                    out[name] = float(raw.strip().strip('"'))
                except ValueError:
                    raise ValueError(f"Server-Timing {name!r} has a dur that is not a number: {raw!r}") from None
    return out
