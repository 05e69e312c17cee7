"""deploy/grafana/: every dashboard query parses as PromQL and names only metrics and labels that a live
server exports on /metrics (plus the target labels Prometheus adds to every scraped series)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.dashboards import DASHBOARDS, INTERVALS, LABEL_VALUES, VARIABLE, panels
from tests.support.server_harness import Server

# Prometheus attaches these to every series it scrapes; they are not in /metrics.
TARGET_LABELS = frozenset({"job", "instance"})

Exported = dict[str, set[str]]  # sample name -> label names seen on it


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, query) for every panel target and every query variable."""
    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target['refId']}", target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            yield f"variable {var['name']}", query


def as_promql(query: str) -> str:
    """The query as Prometheus receives it: intervals as a duration, variables as a regex value."""
    text = INTERVALS.sub("5m", query)
    return VARIABLE.sub(".*", text)


def check(query: str, exported: Exported) -> list[str]:
    """Problems with one query: a parse error, an unknown metric, a label its metric does not carry."""
    m = LABEL_VALUES.match(query.strip())
    expr_text, extra_label = (m["selector"], m["label"]) if m else (query, None)
    try:
        expr = promql_parser.parse(as_promql(expr_text))
    except Exception as exc:  # the parser raises ValueError-like errors from Rust
        return [f"does not parse: {exc}"]
    problems: list[str] = []
    selectors: list[Any] = []
    promql_parser.walk(expr, lambda node: selectors.append(node) if isinstance(node, promql_parser.VectorSelector)
                       else None)
    for sel in selectors:
        if sel.name not in exported:
            problems.append(f"metric {sel.name} is not exported")
            continue
        for matcher in sel.matchers.matchers:
            if matcher.name not in exported[sel.name] | TARGET_LABELS:
                problems.append(f"{sel.name} has no label {matcher.name}")
        if extra_label and extra_label not in exported[sel.name] | TARGET_LABELS:
            problems.append(f"label_values: {sel.name} has no label {extra_label}")

    def grouping(node: Any) -> None:
        labels: list[str] = []
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            labels = list(node.modifier.labels)
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            labels = [*(matching.labels if matching is not None else []), *(node.modifier.group_labels or [])]
        if not labels:
            return
        under: list[Any] = []
        promql_parser.walk(node, lambda n: under.append(n) if isinstance(n, promql_parser.VectorSelector) else None)
        for sel in under:
            for label in labels:
                if sel.name in exported and label not in exported[sel.name] | TARGET_LABELS:
                    problems.append(f"grouping by {label}: {sel.name} has no label {label}")

    promql_parser.walk(expr, grouping)
    return problems


def exported_series(text: str) -> Exported:
    """Sample names in a /metrics exposition with the label names seen on each."""
    out: Exported = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


# -- the checker itself ------------------------------------------------------------------------------

def test_checker_flags_unknown_metrics_labels_and_bad_syntax() -> None:
    exported = {"edge_runtime_requests_total": {"endpoint", "status"},
                "edge_runtime_batch_rows_bucket": {"model", "le"}}
    good = 'sum by (endpoint) (rate(edge_runtime_requests_total{job=~"$job", status=~"5.."}[$__rate_interval]))'
    assert check(good, exported) == []
    assert check("histogram_quantile(0.9, sum by (le, model) (rate(edge_runtime_batch_rows_bucket[5m])))",
                 exported) == []
    assert check("rate(edge_runtime_nope_total[5m])", exported) == ["metric edge_runtime_nope_total is not exported"]
    assert check('edge_runtime_requests_total{model="a"}', exported) == [
        "edge_runtime_requests_total has no label model"]
    assert check("sum by (model) (edge_runtime_requests_total)", exported) == [
        "grouping by model: edge_runtime_requests_total has no label model"]
    assert check("edge_runtime_requests_total / on (le) edge_runtime_batch_rows_bucket", exported) == [
        "grouping by le: edge_runtime_requests_total has no label le"]
    assert check("label_values(edge_runtime_requests_total, model)", exported) == [
        "label_values: edge_runtime_requests_total has no label model"]
    assert check("sum(rate(edge_runtime_requests_total[5m])", exported)[0].startswith("does not parse")


# -- the dashboards ----------------------------------------------------------------------------------

def test_dashboards_exist_and_are_importable_json() -> None:
    assert DASHBOARDS, "deploy/grafana/ has no dashboard"
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36, path.name
        ids = [p["id"] for p in panels(dashboard["panels"])]
        assert len(ids) == len(set(ids)), f"{path.name}: panel ids repeat"
        names = {v["name"] for v in dashboard["templating"]["list"]}
        for panel in panels(dashboard["panels"]):
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, f"{path.name}: {panel['title']} is off the grid"
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], f"{panel['title']} has no query"
        # Every variable a query uses is defined (Grafana would send `$model` literally otherwise).
        for where, query in queries(dashboard):
            for m in VARIABLE.finditer(INTERVALS.sub("", query)):
                name = next(g for g in m.groups() if g)
                assert name in names, f"{path.name} {where}: ${name} is not a dashboard variable"


@pytest.fixture(scope="module")
def exported(server: Server) -> Exported:
    """The series a live server exports once it has answered on a few surfaces (labelled series appear
    only after their first observation)."""
    post = server.client.post
    assert post("/v1/embeddings", json={"model": "emb", "input": ["a query", "a passage"]}).status_code == 200
    assert post("/v1/classify", json={"model": "cls", "input": "x"}).status_code == 200
    assert post("/v1/embeddings", json={"model": "no-such-model", "input": "x"}).status_code == 404
    return exported_series(server.client.get("/metrics").text)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_parses_and_names_exported_metrics_and_labels(path: Path, exported: Exported) -> None:
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    found = list(queries(dashboard))
    assert len(found) >= 10, f"{path.name}: only {len(found)} queries"
    problems = [f"{where}: {problem}" for where, query in found for problem in check(query, exported)]
    assert not problems, "\n".join(problems)
