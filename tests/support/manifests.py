"""deploy/'s Kubernetes manifests as the tests read them: their YAML documents, their validation
(built-in kinds against Kubernetes' schemas, custom resources against the CRDs in tests/data/crds/),
the scalers' pending-jobs targets and the PromQL queries they hand to Prometheus."""

from __future__ import annotations

import re
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
BASE = K8S / "base"
KSERVE = DEPLOY / "kserve"
CRDS = ROOT / "tests" / "data" / "crds"
# The oldest Kubernetes KEDA 2.20 supports and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.32", "1.37")
CRD_FILES = {
    ("keda.sh", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("serving.kserve.io", "ServingRuntime"): "serving.kserve.io_servingruntimes.yaml",
    ("serving.kserve.io", "InferenceService"): "serving.kserve.io_inferenceservices.yaml",
    ("monitoring.coreos.com", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
}


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of a file, empty ones left out."""
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one document of ``kind`` among ``docs``."""
    found = [d for d in docs if d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _close(schema: Any) -> Any:
    """A copy of an OpenAPI v3 schema in which objects with listed properties refuse unknown fields."""
    if isinstance(schema, list):
        return [_close(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _close(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def crd_schema(group: str, kind: str, version: str) -> dict[str, Any]:
    """spec.versions[name == version].schema.openAPIV3Schema of the shipped CRD, closed."""
    (crd,) = yaml_docs(CRDS / CRD_FILES[(group, kind)])
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (group, kind)
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert version in versions, f"{kind}: {version} is not among {sorted(versions)}"
    assert versions[version]["served"], f"{kind} {version} is not served"
    schema: dict[str, Any] = _close(versions[version]["schema"]["openAPIV3Schema"])
    return schema


def validate(doc: dict[str, Any]) -> None:
    """A custom resource against its CRD, anything else against Kubernetes' schemas (strict)."""
    group, _, version = doc["apiVersion"].rpartition("/")
    if (group, doc["kind"]) in CRD_FILES:
        jsonschema.Draft7Validator(crd_schema(group, doc["kind"], version)).validate(doc)
        return
    for k8s in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(doc, k8s, strict=True)


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity without binary suffixes ("1.5", "1500m")."""
    match = re.fullmatch(r"([0-9.]+)(m?)", text)
    assert match, f"not a plain decimal quantity: {text!r}"
    return Decimal(match.group(1)) / (1000 if match.group(2) else 1)


def scaled_objects() -> dict[str, dict[str, Any]]:
    """The ScaledObject of each KEDA overlay, by overlay."""
    return {name: only(yaml_docs(K8S / name / "scaledobject.yaml"), "ScaledObject")
            for name in ("keda", "keda-prometheus")}


def manifest_targets() -> dict[str, Decimal]:
    """The pending-jobs target as each scaler states it."""
    keda = scaled_objects()
    isvc = only(yaml_docs(KSERVE / "inferenceservice.yaml"), "InferenceService")
    (metric,) = isvc["spec"]["predictor"]["autoScaling"]["metrics"]
    adapter_hpa = only(yaml_docs(K8S / "prometheus-adapter" / "hpa-pending-jobs.yaml"), "HorizontalPodAutoscaler")
    return {
        "keda": quantity(keda["keda"]["spec"]["triggers"][0]["metadata"]["targetValue"]),
        "keda-prometheus": quantity(keda["keda-prometheus"]["spec"]["triggers"][0]["metadata"]["threshold"]),
        "kserve": quantity(metric["external"]["target"]["value"]),
        "prometheus-adapter": quantity(adapter_hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"]),
    }


def scaler_queries() -> dict[str, str]:
    """Every PromQL expression the manifests hand to Prometheus (adapter templates filled in)."""
    (prom,) = scaled_objects()["keda-prometheus"]["spec"]["triggers"]
    isvc = only(yaml_docs(KSERVE / "inferenceservice.yaml"), "InferenceService")
    (metric,) = isvc["spec"]["predictor"]["autoScaling"]["metrics"]
    adapter = yaml.safe_load((K8S / "prometheus-adapter" / "adapter-values.yaml").read_text(encoding="utf-8"))
    (rule,) = adapter["rules"]["custom"]
    series = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"])
    assert series
    filled = (rule["metricsQuery"].replace("<<.Series>>", series.group(1))
              .replace("<<.LabelMatchers>>", 'namespace="default",pod=~"edge-runtime-.+"')
              .replace("<<.GroupBy>>", "pod"))
    return {"keda-prometheus": prom["metadata"]["query"], "kserve": metric["external"]["metric"]["query"],
            "adapter series": rule["seriesQuery"], "adapter metrics": filled}


def selectors(query: str) -> list[Any]:
    """Every vector selector of a PromQL query (promql_parser nodes: name, matchers)."""
    found: list[Any] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(promql_parser.parse(query), visit)
    return found
