"""deploy/prometheus/: the rules pass `promtool check rules` and their `promtool test rules` unit tests,
every alert has a firing and a silent case there and a runbook section in docs/deployment.md, the
PrometheusRule is the rules file's, and the series the server adds for the rules behave.

A real Prometheus evaluating the same rules against live servers is tests/test_prometheus_live.py;
the PrometheusRule's CRD validation is tests/test_scaling.py's, as for every other manifest.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from edge_runtime.metrics import ROLLBACK_REASONS, SWAP_RESULTS, Metrics
from edge_runtime.updates import memory
from tests.support.manifests import manifest_targets, validate
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "edge-runtime.rules.yaml"
PROMETHEUS_RULE = ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"
UNIT_TESTS = Path(__file__).resolve().parent / "data" / "prometheus" / "edge-runtime.rules.test.yaml"
DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus; scripts/test.sh "
                             "installs it when run as root)")


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


# -- promtool ------------------------------------------------------------------------------------------

@needs_promtool
def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    done = promtool("test", "rules", str(UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_promtool_unit_tests_fail_when_a_threshold_moves(tmp_path: Path) -> None:
    """The unit tests bite: the error-ratio bound at 20 % instead of 5 % fails them."""
    bound = "edge_runtime:model_request_errors:ratio_rate5m > "
    text = RULES.read_text(encoding="utf-8")
    assert text.count(bound + "0.05") == 1
    (tmp_path / "rules.yaml").write_text(text.replace(bound + "0.05", bound + "0.2"), encoding="utf-8")
    tests = yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))
    tests["rule_files"] = [str(tmp_path / "rules.yaml")]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests), encoding="utf-8")
    done = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert done.returncode != 0 and "EdgeRuntimeErrorRatioHigh" in done.stdout + done.stderr


# -- what the unit tests and the annotations cover --------------------------------------------------------

def test_every_alert_has_a_firing_and_a_silent_case_and_every_recording_rule_a_case() -> None:
    doc = yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))
    assert doc["rule_files"] == [str(Path("..", "..", "..").joinpath(RULES.relative_to(ROOT)))]
    firing: set[str] = set()
    silent: set[str] = set()
    exprs: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
            for alert in check["exp_alerts"]:
                assert set(alert["exp_annotations"]) == {"summary", "description", "runbook"}, check
        exprs |= {check["expr"] for check in case.get("promql_expr_test", []) if check["exp_samples"]}
    names = set(alerts())
    assert names - firing == set(), "alerts without a firing case"
    assert names - silent == set(), "alerts without a silent case"
    assert {rule["record"] for rule in rules() if "record" in rule} <= exprs


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of a Markdown text (lower case, punctuation dropped)."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


def test_every_alert_says_what_to_look_at_and_names_its_runbook_section() -> None:
    sections = anchors(DEPLOYMENT_DOC.read_text(encoding="utf-8"))
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, name
        page, _, anchor = annotations["runbook"].partition("#")
        assert page == "docs/deployment.md" and anchor == name.lower(), (name, annotations["runbook"])
        assert anchor in sections, f"{name}: docs/deployment.md has no section {anchor!r}"
    assert {a for a in sections if a.startswith("edgeruntime")} == {n.lower() for n in alerts()}


def test_the_queue_alert_holds_the_scalers_target() -> None:
    (target,) = set(manifest_targets().values())
    expr = alerts()["EdgeRuntimeQueueAboveScalingTarget"]["expr"]
    match = re.fullmatch(r"edge_runtime:pending_jobs_mean:avg_ready > ([0-9.]+) \* 1\.1\s*", expr)
    assert match and Decimal(match.group(1)) == target, expr


# -- the PrometheusRule ---------------------------------------------------------------------------------

def test_the_prometheus_rule_is_generated_from_the_rules_file() -> None:
    script = load_script(ROOT / "scripts" / "prometheus_rule.py")
    assert PROMETHEUS_RULE.read_text(encoding="utf-8") == script.render(), \
        "deploy/prometheus/prometheusrule.yaml is stale: run scripts/prometheus_rule.py"
    (rule,) = [d for d in yaml.safe_load_all(PROMETHEUS_RULE.read_text(encoding="utf-8")) if d]
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    assert script.main(["--check"]) == 0


def test_the_crd_refuses_a_misspelt_rule() -> None:
    (rule,) = [d for d in yaml.safe_load_all(PROMETHEUS_RULE.read_text(encoding="utf-8")) if d]
    validate(rule)
    group = rule["spec"]["groups"][0]
    first_alert = next(i for i, r in enumerate(group["rules"]) if "alert" in r)
    for wrong in ({"for": "10 minutes"}, {"annotation": {"summary": "x"}}):
        broken = {**group["rules"][first_alert], **wrong}
        doc = {**rule, "spec": {"groups": [{**group, "rules": [broken]}]}}
        with pytest.raises(jsonschema.ValidationError):
            validate(doc)


# -- the series the rules read that the server adds for them -----------------------------------------------

def samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = metrics.render().decode()
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_ready_live_and_failed_models_are_read_from_the_runtime_at_each_scrape() -> None:
    stall: list[str] = []
    runtime = SimpleNamespace(
        models={"emb": SimpleNamespace(name="emb", status="ready", reason_code=None),
                "cls": SimpleNamespace(name="cls", status="failed", reason_code="self_check")},
        stalled=lambda: stall[0] if stall else None, status=lambda: "degraded")
    metrics = Metrics()
    metrics.set_ready(True)  # what /health last said; the runtime's state wins at a scrape
    metrics.watch_runtime(runtime)
    assert samples(metrics, "edge_runtime_ready") == {(): 0.0}
    assert samples(metrics, "edge_runtime_live") == {(): 1.0}
    assert samples(metrics, "edge_runtime_model_failed") == {(("model", "cls"), ("reason", "self_check")): 1.0}
    stall.append("model emb: a forward has run for 61.0 s (limit 60 s)")
    runtime.models = {"emb": runtime.models["emb"]}  # replaced whole, as Runtime does
    runtime.status = lambda: "ready"
    assert samples(metrics, "edge_runtime_live") == {(): 0.0}
    assert samples(metrics, "edge_runtime_model_failed") == {}
    assert samples(metrics, "edge_runtime_ready") == {(): 1.0}


def test_a_models_event_counters_start_at_zero_when_it_gets_a_version() -> None:
    """Prometheus sees no increase in a series whose first sample is 1: each counter an alert takes
    increase() of is there at 0 from the model's first version on."""
    metrics = Metrics()
    assert samples(metrics, "edge_runtime_model_rollbacks_total") == {}
    metrics.set_active_version("emb", "0123abcd")
    assert samples(metrics, "edge_runtime_model_rollbacks_total") == {
        (("model", "emb"), ("reason", reason)): 0.0 for reason in ROLLBACK_REASONS}
    assert samples(metrics, "edge_runtime_model_swaps_total") == {
        (("model", "emb"), ("result", result)): 0.0 for result in SWAP_RESULTS}
    assert samples(metrics, "edge_runtime_model_drain_timeouts_total") == {(("model", "emb"),): 0.0}


def test_memory_limit_is_the_cgroup_limit_else_the_memory_of_the_machine(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_cgroup_dir", lambda: tmp_path)
    (tmp_path / "memory.max").write_text("1610612736\n")
    assert memory.memory_limit() == memory.Budget(1610612736, "cgroup v2 memory.max")
    (tmp_path / "memory.max").write_text("max\n")
    total = memory.memory_limit()
    assert total.source == "MemTotal" and total.bytes > memory.available_memory().bytes > 0
    monkeypatch.setattr(memory, "_cgroup_dir", lambda: None)
    assert memory.memory_limit() == total
