"""Lifecycle over real processes: degraded serving, not_ready, the check and models commands."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_runtime.api.schema import validate_response
from tests.support.server_harness import ROOT, Server, write_models_file


@pytest.fixture(scope="module")
def broken_package(fixture_package: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of a good package with one byte of its graph changed."""
    target = tmp_path_factory.mktemp("broken") / "pkg"
    shutil.copytree(fixture_package("sequence-classification"), target)
    graph = target / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[-1] ^= 0xFF
    graph.write_bytes(bytes(data))
    return target


def test_one_failed_model_leaves_the_others_serving(
    fixture_package: Callable[..., Path], broken_package: Path, tmp_path: Path
) -> None:
    models = write_models_file(tmp_path / "models.yaml", [
        {"name": "good", "package": str(fixture_package("sequence-classification")), "device": "cpu"},
        {"name": "bad", "package": str(broken_package), "device": "cpu"},
    ])
    server = Server(models)
    try:
        server.wait(("degraded",))
        health = server.client.get("/health")
        assert health.status_code == 503
        body = health.json()
        validate_response("/health", "get", 503, body)
        states = body["models"]
        assert states["good"]["status"] == "ready" and states["bad"]["status"] == "failed"
        assert "model.onnx" in states["bad"]["reason"]
        ok = server.client.post("/v1/classify", json={"model": "good", "input": "x"})
        assert ok.status_code == 200
        refused = server.client.post("/v1/classify", json={"model": "bad", "input": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
        assert refused.headers["retry-after"] == "5"
        assert server.client.get("/health/live").status_code == 200
        listed = {m["id"]: m for m in server.client.get("/v1/models").json()["data"]}
        assert listed["bad"]["status"] == "failed"
    finally:
        server.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_runtime", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_check_and_models_commands(
    fixture_package: Callable[..., Path], broken_package: Path, tmp_path: Path
) -> None:
    good = write_models_file(tmp_path / "good.yaml", [
        {"name": "emb", "package": str(fixture_package("embedding")), "device": "cpu"}])
    bad = write_models_file(tmp_path / "bad.yaml", [
        {"name": "emb", "package": str(fixture_package("embedding")), "device": "cpu"},
        {"name": "bad", "package": str(broken_package), "device": "cpu"}])
    ok = _cli("check", "--models", str(good))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "emb\tready" in ok.stdout
    failed = _cli("check", "--models", str(bad))
    assert failed.returncode == 1 and "bad\tfailed" in failed.stdout
    listing = _cli("models", "--models", str(good))
    assert listing.returncode == 0 and "embedding" in listing.stdout
    broken_yaml = tmp_path / "broken.yaml"
    broken_yaml.write_text("models:\n  - name: x\n    package: p\n    device: tpu\n")
    refused = _cli("models", "--models", str(broken_yaml))
    assert refused.returncode == 2 and "device" in refused.stderr
