"""A real Prometheus scraping two live servers: every dashboard query, scaler query and recording rule
returns series with the labels its reader uses, and the drill's alerts fire and clear.

The site: process 0 serves the real MiniLM (slow enough on one thread for a burst to queue) with a
64-job queue; process 1 serves a tiny classifier and a model whose package fails its self-check, so it
stays unready. Prometheus (the `prometheus` binary, Debian's package) scrapes both every second on
127.0.0.1 with the namespace and pod labels Kubernetes' pod discovery would add, and evaluates a copy
of deploy/prometheus/edge-runtime.rules.yaml whose `for` durations and range windows are shortened
(the shipped thresholds are kept). The drill: failed requests, a swap and a swap that rolls back, a
burst that fills the queue; then the failing model is removed and the burst stops, and every alert
clears.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import promql_parser
import pytest
import yaml

from edge_runtime.packages.golden import npz_bytes
from edge_runtime.packages.manifest import build_manifest
from tests.support.dashboards import DASHBOARDS, INTERVALS, LABEL_VALUES, VARIABLE, panels
from tests.support.manifests import scaler_queries, selectors
from tests.support.server_harness import Server, end, free_port, write_models_file

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "edge-runtime.rules.yaml"
PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.minilm,
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not installed (Debian: apt-get install "
                       "prometheus; scripts/test.sh installs it when run as root)"),
]

JOB = "edge-runtime"
# Pod names that both the Deployment's (edge-runtime-.+) and KServe's (edge-runtime-predictor-.+)
# query patterns match.
PODS = ("edge-runtime-predictor-0", "edge-runtime-predictor-1")
# The test's copy of the rules: one-second `for`s and ten-second windows, so that a drill of seconds
# fires and clears what the shipped rules would after minutes.
WINDOW = "10s"
GRAFANA_INTERVAL = "1m"  # $__rate_interval et al.: long enough to cover the whole drill
# More one-text requests at once than process 0's emb holds (64 waiting + 64 rows in a forward): its
# queue stays full and the few left over are refused 429 and come back. The texts are long enough for
# the model to be the bottleneck (a forward of 64 takes seconds on one thread) rather than the HTTP
# and tokenizing of requests: saturation then stays above 0.8 for most of each forward. 230 words (~233 of
# MiniLM's 256 tokens): with 150, a faster int8 left the refills between forwards long enough, once in a
# whole-suite run, for no two scrapes in a row to see the queue full.
BURST_CLIENTS = 140
BURST_TEXT = " ".join(["word"] * 230)

#: (alert, labels it must carry) that the drill makes fire.
EXPECTED = {
    "EdgeRuntimeNotReady": {"pod": PODS[1]},
    "EdgeRuntimeSelfCheckFailed": {"pod": PODS[1], "model": "emb-bad", "reason": "self_check"},
    "EdgeRuntimeErrorRatioHigh": {"model": "emb-bad", "endpoint": "/v1/embeddings", "namespace": "default"},
    "EdgeRuntimeSwapRolledBack": {"pod": PODS[1], "model": "cls", "reason": "verify"},
    "EdgeRuntimeQueueAboveScalingTarget": {"job": JOB, "namespace": "default"},
    "EdgeRuntimeSaturated": {"pod": PODS[0]},
    "EdgeRuntimeOverloaded": {"model": "emb", "endpoint": "/v1/embeddings"},
}
#: Alerts nothing in the drill should fire (EdgeRuntimeLatencyHigh may or may not, with the burst).
NEVER = {"EdgeRuntimeModelFailed", "EdgeRuntimeDrainTimedOut", "EdgeRuntimeMemoryNearLimit",
         "EdgeRuntimeForwardStalled", "EdgeRuntimeRestarted"}


def shortened_rules(text: str) -> str:
    """The rules with every `for` at 1 s and every range window at WINDOW (thresholds unchanged)."""
    text = re.sub(r"^(\s+for:) \S+$", r"\1 1s", text, flags=re.M)
    return re.sub(r"\[\d+[smh]\]", f"[{WINDOW}]", text)


class Prometheus:
    """The prometheus binary on 127.0.0.1 with its own configuration and storage in ``home``."""

    def __init__(self, home: Path, targets: list[tuple[str, str]]) -> None:
        (home / "rules.yaml").write_text(shortened_rules(RULES.read_text(encoding="utf-8")), encoding="utf-8")
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{"job_name": JOB, "static_configs": [
                {"targets": [target], "labels": {"namespace": "default", "pod": pod}} for target, pod in targets]}],
        }
        (home / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = open(home / "prometheus.log", "wb")  # noqa: SIM115 - written by the process until stop()
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
            cwd=home, stdout=self._log, stderr=subprocess.STDOUT)
        self.log_path = home / "prometheus.log"
        self.client = httpx.Client(base_url=self.url, timeout=10.0)

    def wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                if self.client.get("/-/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"Prometheus not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def api(self, path: str, **params: Any) -> Any:
        response = self.client.get(f"/api/v1/{path}", params=params)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector (a scalar comes back as one sample without labels)."""
        data = self.api("query", query=expr, **({"time": at} if at is not None else {}))
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self, state: str = "firing") -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["state"] == state]

    def stop(self) -> None:
        self.client.close()
        end(self.proc)
        self._log.close()


def failing_self_check(source: Path, out: Path) -> Path:
    """A copy of ``source`` whose recorded golden outputs are off by one: it verifies (a consistent
    manifest) and fails its self-check at load."""
    shutil.copytree(source, out)
    with np.load(out / "golden.npz", allow_pickle=False) as npz:
        arrays = {k: (npz[k] + 1.0 if "/out/" in k else npz[k]) for k in npz.files}
    (out / "golden.npz").write_bytes(npz_bytes(arrays))
    (out / "MANIFEST.json").unlink()
    (out / "MANIFEST.json").write_text(json.dumps(build_manifest(out)), encoding="utf-8")
    return out


def corrupt(source: Path, out: Path) -> Path:
    """A copy of ``source`` with one graph byte changed: its digests no longer verify. (Its manifest
    still names ``source``'s version: a copy of the active version would be that version, unchanged.)"""
    shutil.copytree(source, out)
    graph = out / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[-100] ^= 0xFF
    graph.write_bytes(bytes(data))
    return out


@dataclass
class Site:
    """The two servers, their models files and packages, Prometheus, and what the drill saw."""

    servers: tuple[Server, Server]
    models: tuple[Path, Path]  # each server's models.yaml
    packages: dict[str, Path]
    prometheus: Prometheus
    fired: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # alert -> label sets seen firing
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def entry(name: str, package: Path, **extra: Any) -> dict[str, Any]:
    return {"name": name, "package": str(package), "device": "cpu", "threads": 1, "spinning": False, **extra}


def digest8(package: Path) -> str:
    return str(json.loads((package / "MANIFEST.json").read_text())["digest"])[:8]


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def site(minilm_package: Path, fixture_package: Callable[..., Path],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    from converters.encoder.fixture import build_fixture

    root = tmp_path_factory.mktemp("prometheus-live")
    cls_a = fixture_package("sequence-classification")
    cls_b = build_fixture("sequence-classification", root / "cls-b", seed=1)
    packages = {"cls-a": cls_a, "cls-b": cls_b, "cls-corrupt": corrupt(cls_a, root / "cls-corrupt"),
                "emb-bad": failing_self_check(fixture_package("embedding"), root / "emb-bad")}
    models = (write_models_file(root / "models-0.yaml", [entry("emb", minilm_package, max_queue=64)]),
              write_models_file(root / "models-1.yaml", [entry("cls", cls_a), entry("emb-bad", packages["emb-bad"])]))
    flags = ("--update-watch-seconds", "0")
    servers = (Server(models[0], *flags), Server(models[1], *flags))
    prometheus: Prometheus | None = None
    try:
        servers[0].wait()
        servers[1].wait(("degraded",))
        home = root / "prometheus"
        home.mkdir()
        targets = [(server.url.removeprefix("http://"), pod) for server, pod in zip(servers, PODS, strict=True)]
        prometheus = Prometheus(home, targets)
        prometheus.wait()
        site = Site(servers, models, packages, prometheus)
        yield site
        site.stop.set()  # the drill's traffic, when the clear test did not run
        for thread in site.threads:
            thread.join(30)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for server in servers:
            server.stop()


# -- the drill ------------------------------------------------------------------------------------------

def _requests(site: Site) -> threading.Thread:
    """Until the site stops, five times a second: a classification on process 1, a 404 on process 0
    (an unknown model) and a 503 on process 1 (emb-bad is not ready)."""
    def run() -> None:
        with httpx.Client(base_url=site.servers[0].url, timeout=30.0) as zero, \
                httpx.Client(base_url=site.servers[1].url, timeout=30.0) as one:
            for n in itertools.count():
                if site.stop.is_set():
                    return
                # a new text each time, as the burst's: a repeat is answered from the result cache and never
                # queues, forwards or shows in the dashboard's per-model queue and forward panels
                statuses = (one.post("/v1/classify", json={"model": "cls", "input": f"fine {n}"}).status_code,
                            zero.post("/v1/embeddings", json={"model": "no-such-model", "input": "x"}).status_code,
                            one.post("/v1/embeddings", json={"model": "emb-bad", "input": "x"}).status_code)
                if statuses != (200, 404, 503):
                    site.failures.append(f"requests: {statuses}")
                    return
                time.sleep(0.2)

    thread = threading.Thread(target=run, name="requests", daemon=True)
    thread.start()
    site.threads.append(thread)
    return thread


def _burst(site: Site) -> threading.Thread:
    """BURST_CLIENTS one-text embedding requests at a time on process 0 until the site stops."""
    url = site.servers[0].url
    sent = itertools.count()

    async def client(c: httpx.AsyncClient) -> None:
        while not site.stop.is_set():
            # a new text each time: a repeat would be answered from the result cache, never queued
            r = await c.post("/v1/embeddings", json={"model": "emb", "input": f"{BURST_TEXT} {next(sent)}"})
            if r.status_code not in (200, 429):
                site.failures.append(f"burst: {r.status_code} {r.text[:200]}")
                return
            if r.status_code == 429:
                await asyncio.sleep(0.2)

    async def main() -> None:
        limits = httpx.Limits(max_connections=BURST_CLIENTS)
        async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as c:
            await asyncio.gather(*(client(c) for _ in range(BURST_CLIENTS)))

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="burst", daemon=True)
    thread.start()
    site.threads.append(thread)
    return thread


def _rollbacks(server: Server, model: str, reason: str) -> float:
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith(f'edge_runtime_model_rollbacks_total{{model="{model}",reason="{reason}"}} '):
            return float(line.split()[-1])
    return 0.0


def _swap_and_roll_back(site: Site) -> None:
    """On process 1 (SIGHUP after each models.yaml change): cls to another version, then to a corrupt
    package, which is not promoted (a rollback, reason verify)."""
    server, models = site.servers[1], site.models[1]
    bad = entry("emb-bad", site.packages["emb-bad"])
    write_models_file(models, [entry("cls", site.packages["cls-b"]), bad])
    server.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: server.client.get("/health").json()["models"]["cls"].get("version_id")
               == digest8(site.packages["cls-b"]), "the swap to cls-b")
    # Prometheus must have seen the counter at 0 before it moves (it starts at 0 when cls loads).
    counter = f'edge_runtime_model_rollbacks_total{{pod="{PODS[1]}", model="cls", reason="verify"}}'
    wait_until(lambda: bool(site.prometheus.query(counter)), "the rollback counter at 0 in Prometheus")
    write_models_file(models, [entry("cls", site.packages["cls-corrupt"]), bad])
    server.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: _rollbacks(server, "cls", "verify") == 1.0, "the corrupt version's rollback")


def _firing(site: Site) -> None:
    for alert in site.prometheus.alerts():
        labels = alert["labels"]
        seen = site.fired.setdefault(labels["alertname"], [])
        if labels not in seen:
            seen.append(labels)


def _fired_as_expected(site: Site) -> bool:
    return all(any(wanted.items() <= labels.items() for labels in site.fired.get(name, []))
               for name, wanted in EXPECTED.items())


@pytest.fixture(scope="module")
def drill(site: Site) -> Site:
    """Run the drill until every expected alert has fired (traffic keeps going until the clear test)."""
    wait_until(lambda: len(site.prometheus.query(f'up{{job="{JOB}"}} == 1')) == 2, "both targets up", 30)
    _requests(site)
    _burst(site)
    _swap_and_roll_back(site)
    deadline = time.monotonic() + 60
    while not _fired_as_expected(site) and time.monotonic() < deadline and not site.failures:
        _firing(site)
        time.sleep(0.5)
    assert not site.failures, site.failures
    return site


def test_the_drill_fires_each_alert_with_the_labels_its_runbook_reads(drill: Site) -> None:
    missing = {name: wanted for name, wanted in EXPECTED.items()
               if not any(wanted.items() <= labels.items() for labels in drill.fired.get(name, []))}
    assert not missing, f"not fired: {missing}; fired: {drill.fired}\n{drill.prometheus.log()}"
    assert not NEVER & set(drill.fired), {name: drill.fired[name] for name in NEVER & set(drill.fired)}
    assert all(labels["severity"] in ("warning", "critical") for seen in drill.fired.values() for labels in seen)


# -- what the dashboard and the scalers read -------------------------------------------------------------

def grafana(query: str) -> str:
    """A dashboard query as Grafana sends it for job=edge-runtime and every process and model."""
    return VARIABLE.sub(lambda m: JOB if "job" in m.groups() else ".*", INTERVALS.sub(GRAFANA_INTERVAL, query))


def grouping_labels(node: Any) -> set[str]:
    """The labels the outermost `by (...)` of a parsed query keeps: what its panel's legend reads."""
    if isinstance(node, promql_parser.ParenExpr):
        return grouping_labels(node.expr)
    if isinstance(node, promql_parser.BinaryExpr):  # a ratio, or `... or vector(0)`: its left side
        return grouping_labels(node.lhs)
    if isinstance(node, promql_parser.Call):  # histogram_quantile(q, sum by (le, x) (...)): x
        return {label for arg in node.args for label in grouping_labels(arg)} - {"le"}
    if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None \
            and node.modifier.type == promql_parser.AggModifierType.By:
        return set(node.modifier.labels)
    return set()


def test_every_dashboard_query_returns_series_with_the_labels_its_panel_reads(drill: Site) -> None:
    prometheus = drill.prometheus
    problems: list[str] = []
    checked = 0
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        for panel in panels(dashboard["panels"]):
            for target in panel.get("targets", []):
                expr = grafana(target["expr"])
                where = f"{path.name} {panel['title']!r} {target['refId']}"
                result = prometheus.query(expr)
                checked += 1
                if not result:
                    problems.append(f"{where}: no series for {expr}")
                    continue
                legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
                wanted = grouping_labels(promql_parser.parse(expr)) | legend
                lacking = [s["metric"] for s in result if not wanted <= set(s["metric"])]
                if lacking:
                    problems.append(f"{where}: series without {sorted(wanted)}: {lacking[:2]}")
                if not any(math.isfinite(float(s["value"][1])) for s in result):
                    problems.append(f"{where}: only NaN or infinite values: {result[:2]}")
        for var in dashboard["templating"]["list"]:
            if var["type"] != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = LABEL_VALUES.match(grafana(query))
            assert m, query
            values = prometheus.api(f"label/{m['label']}/values", **{"match[]": m["selector"]})
            checked += 1
            if not values:
                problems.append(f"{path.name} variable {var['name']}: no values for {query}")
    assert checked >= 30
    assert not problems, "\n".join(problems)


def test_the_scaler_queries_read_the_ready_processes_by_pod(drill: Site) -> None:
    prometheus = drill.prometheus
    found = scaler_queries()
    at = time.time() - 1  # a past instant, so both queries below see the same samples
    # KEDA's prometheus trigger: one value, the average over the ready pods only (process 1 is not).
    (keda,) = prometheus.query(found["keda-prometheus"], at)
    (ready,) = prometheus.query(f'edge_runtime_pending_jobs_mean{{pod="{PODS[0]}"}}', at)
    assert keda["metric"] == {} and float(keda["value"][1]) == float(ready["value"][1])
    assert len(prometheus.query('edge_runtime_pending_jobs_mean{namespace="default"}', at)) == 2
    # KServe's: the sum over the same pods (one ready here), one value.
    (kserve,) = prometheus.query(found["kserve"], at)
    assert float(kserve["value"][1]) == float(ready["value"][1])
    # prometheus-adapter: the series query finds both pods with the labels it maps to resources, and
    # the metrics query gives one value per pod, labelled by pod.
    series = prometheus.api("series", **{"match[]": found["adapter series"]})
    assert {(s["namespace"], s["pod"]) for s in series} == {("default", pod) for pod in PODS}
    per_pod = prometheus.query(found["adapter metrics"])
    assert sorted(s["metric"]["pod"] for s in per_pod) == sorted(PODS)
    assert all(set(s["metric"]) == {"pod"} for s in per_pod)


def test_every_recording_rule_returns_series_and_every_rule_reads_scraped_metrics(drill: Site) -> None:
    prometheus = drill.prometheus
    rules = [rule for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"] for rule in group["rules"]]
    recorded = {rule["record"]: rule for rule in rules if "record" in rule}
    wanted = {
        "edge_runtime:model_requests:rate5m": {"job", "namespace", "model", "endpoint", "status"},
        "edge_runtime:model_request_errors:ratio_rate5m": {"job", "namespace", "model", "endpoint"},
        "edge_runtime:requests:rate5m": {"job", "namespace", "endpoint"},
        "edge_runtime:request_duration_seconds:p99_rate5m": {"job", "namespace", "endpoint"},
        "edge_runtime:pending_jobs_mean:avg_ready": {"job", "namespace"},
    }
    assert set(recorded) == set(wanted)
    for name, labels in wanted.items():
        result = prometheus.query(name)
        assert result, f"{name}: no series"
        assert all(set(s["metric"]) - {"__name__"} == labels for s in result), (name, result[:2])
    ratios = {s["metric"]["model"]: float(s["value"][1])
              for s in prometheus.query('edge_runtime:model_request_errors:ratio_rate5m{endpoint="/v1/embeddings"}')}
    assert ratios["emb-bad"] == 1.0 and ratios["emb"] == 0.0  # 0 where nothing failed, not absent
    scraped = set(prometheus.api("label/__name__/values"))
    for rule in rules:
        names = {selector.name for selector in selectors(rule["expr"])}
        assert names <= scraped | set(recorded), (rule.get("alert") or rule.get("record"), names - scraped)


# -- and back -------------------------------------------------------------------------------------------

def test_every_alert_clears_once_the_failing_model_goes_and_the_burst_ends(drill: Site) -> None:
    drill.stop.set()
    for thread in drill.threads:
        thread.join(30)
    assert not drill.failures, drill.failures
    server = drill.servers[1]
    write_models_file(drill.models[1], [entry("cls", drill.packages["cls-b"])])  # the version serving
    server.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: server.client.get("/health").status_code == 200, "process 1 ready without emb-bad")
    deadline = time.monotonic() + 60
    while (active := drill.prometheus.alerts("firing") + drill.prometheus.alerts("pending")) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not active, [(a["labels"]["alertname"], a["state"]) for a in active]
    assert _rollbacks(server, "cls", "verify") == 1.0  # the reload back to cls-b did not fail again
