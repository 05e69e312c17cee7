"""The README's request examples, as the tests that answer them read them."""

from __future__ import annotations

import shlex

import orjson

from tests.support.server_harness import ROOT


def curl_examples() -> list[tuple[str, dict]]:
    """(path, JSON body) of every POST curl example in the README."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    examples = []
    for line in text.splitlines():
        if "curl" in line and " -d " in line:
            args = shlex.split(line.strip())
            url = next(a for a in args if a.startswith("http://127.0.0.1:8100/"))
            examples.append((url.removeprefix("http://127.0.0.1:8100"), orjson.loads(args[args.index("-d") + 1])))
    return examples
