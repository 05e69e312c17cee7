"""`python -m edge_runtime examples`: every Decisions example sent to a live server, answers checked."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from converters.sparrow.export import build_sparrow_package
from edge_runtime.examples import DECISIONS_EXAMPLE_1, DECISIONS_EXAMPLE_2, answer_problems
from tests.support.server_harness import ROOT, Server, write_models_file


def test_answer_problems_finds_wrong_shapes() -> None:
    good = {"answers": {
        "domain": {"type": "choice", "choice": "code", "confidence": 1.0,
                   "probabilities": {"code": 0.9, "math": 0.05, "other": 0.05}},
        "reasoning": {"type": "noul", "noul": 0.3},
        "difficulty": {"type": "score", "score": 1.0, "confidence": 0.5, "legend": {},
                       "probabilities": {"0": 0.2, "1": 0.6, "2": 0.2}},
    }}
    assert answer_problems(DECISIONS_EXAMPLE_1, good) == []
    bad = copy.deepcopy(good)
    bad["answers"]["domain"]["choice"] = "poetry"
    bad["answers"]["reasoning"]["type"] = "choice"
    del bad["answers"]["difficulty"]
    assert len(answer_problems(DECISIONS_EXAMPLE_1, bad)) == 3
    refused = {"answers": {"problems": {"type": "set", "error": "invalid_question",
                                        "reason": "question_type_unsupported", "message": "m"},
                           "contacts": {"type": "span", "error": "invalid_question", "message": "no reason"}}}
    assert answer_problems(DECISIONS_EXAMPLE_2, refused) == ["answers.contacts failed without a reason"]
    answered = {"answers": {"problems.billing": {"type": "noul", "noul": 0.9},
                            "problems.shipping": {"type": "noul", "noul": 0.2},
                            "problems.account": {"type": "noul", "noul": 0.1},
                            "contacts": {"type": "noul", "noul": 0.8}},
                "sets": {"problems": {"selected": ["billing"], "probabilities": {}}}, "spans": {"contacts": []},
                "thresholds": {"problems": 0.5, "contacts": 0.5}}
    assert answer_problems(DECISIONS_EXAMPLE_2, answered) == []
    del answered["thresholds"]["contacts"]
    assert answer_problems(DECISIONS_EXAMPLE_2, answered) == ["thresholds.contacts is missing"]


@pytest.mark.parametrize("family", ["sparrow", "decision-codes", "decision3"])
def test_examples_command_against_a_live_server(family: str, tmp_path: Path) -> None:
    if family == "sparrow":
        package = build_sparrow_package(tmp_path)
    elif family == "decision3":  # the causal pruned fixture: state-once, irregular layer_types
        from converters.decision3.convert import build_fixture

        package = build_fixture(tmp_path / "d3", variant="pruned", attention_mode="causal").path
    else:
        from converters.decision_codes.fixture import build_decision_codes_fixture

        package = build_decision_codes_fixture(tmp_path / "codes", attention_mode="prefix_causal")
    server = Server(write_models_file(tmp_path / "models.yaml",
                                      [{"name": "m", "package": str(package), "device": "cpu", "threads": 1}]))
    try:
        server.wait()
        run = subprocess.run([sys.executable, "-m", "edge_runtime", "examples", "--url", server.url, "--model", "m"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        lines = run.stdout.splitlines()
        assert sum(line.startswith(("answered", "refused")) for line in lines) == 5
        assert lines[0].split()[:2] == ["answered", "200"]  # choice, noul and score are answered
    finally:
        server.stop()
