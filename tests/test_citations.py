"""What the code cites is in the repository, and nothing names a path of the machine it was written on."""

from __future__ import annotations

import re
import subprocess

from tests.support.server_harness import ROOT

# a document's name: lowercase words joined by hyphens (package files such as LICENSE.md or vocab.txt are not)
_CITED = re.compile(r"\b((?:docs/)?(?:reference/)?[a-z0-9]+(?:-[a-z0-9]+)+\.(?:md|txt))\b")
# the checkouts, worktrees and shared notes of the machines this was written on
_MACHINE_PATH = re.compile(r"(?<![\w.])/work/[\w.-]+")


def _tracked(*patterns: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


def test_every_document_the_code_cites_exists() -> None:
    tracked = _tracked()
    missing = []
    for rel in _tracked("*.py"):
        for cited in set(_CITED.findall((ROOT / rel).read_text(encoding="utf-8"))):
            if not any(path == cited or path.endswith("/" + cited) for path in tracked):
                missing.append(f"{rel} cites {cited}")
    assert not missing, "\n".join(sorted(missing))


def test_no_file_names_a_machine_path() -> None:
    found = []
    for rel in _tracked("*.py", "*.md", "*.yaml", "*.yml", "*.sh", "*.toml", "Makefile", "Dockerfile.*"):
        if rel == "tests/test_citations.py":
            continue
        for n, line in enumerate((ROOT / rel).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if _MACHINE_PATH.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
