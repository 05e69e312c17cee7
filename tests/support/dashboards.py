"""deploy/grafana/'s dashboards as the tests read them: the files, their panels, and the patterns of
Grafana's interval and template variables and of its label_values() queries."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DASHBOARDS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "grafana").glob("*.json"))
# Grafana's interval variables stand for durations; any one makes the query parse as it will run.
INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}")
# A dashboard variable: $name, ${name}, ${name:format} or [[name]].
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\s*\)$")


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside (collapsed) rows."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))
