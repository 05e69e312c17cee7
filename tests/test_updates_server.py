"""Model updates through a real server on 127.0.0.1: SIGHUP re-reads models.yaml (and never ends the
server), --watch-models waits for a package still being copied, and the admin listener's keys,
root and routes (docs/updating-models.md)."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from edge_runtime.api.schema import validate_response
from tests.support.server_harness import Server, free_port, write_models_file

ADMIN_KEY = "admin-key-for-tests-0123456789"


def entry(package: Path) -> dict[str, Any]:
    # seeds 0 and 1 are different embedders: their swaps are allowed to change the output space
    return {"name": "emb", "package": str(package), "device": "cpu", "threads": 1,
            "update": {"allow_space_change": True}}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from converters.encoder.fixture import build_fixture

    root = tmp_path_factory.mktemp("site")
    build_fixture("embedding", root / "packages" / "emb-a", seed=0)
    build_fixture("embedding", root / "packages" / "emb-b", seed=1)
    (root / "admin.keys").write_text(ADMIN_KEY + "\n", encoding="utf-8")
    (root / "admin.keys").chmod(0o600)
    return {"root": root, "a": root / "packages" / "emb-a", "b": root / "packages" / "emb-b"}


@pytest.fixture(scope="module")
def admin_server(site: dict[str, Path]) -> Iterator[tuple[Server, httpx.Client]]:
    models = write_models_file(site["root"] / "models.yaml", [entry(site["a"])])
    port = free_port()
    srv = Server(models, "--admin-key-file", str(site["root"] / "admin.keys"), "--admin-port", str(port),
                 "--watch-models", "0.3", "--update-watch-seconds", "0", "--update-drain-seconds", "5")
    admin = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0,
                         headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    try:
        srv.wait()
        yield srv, admin
    finally:
        admin.close()
        srv.stop()


def active_version(srv: Server) -> str:
    return str(srv.client.get("/health").json()["models"]["emb"]["version_id"])


def wait_for_version(srv: Server, version: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while active_version(srv) != version:
        assert srv.proc.poll() is None, srv.log()
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.1)


def digest8(package: Path) -> str:
    import json

    return str(json.loads((package / "MANIFEST.json").read_text())["digest"])[:8]


def test_sighup_reloads_models_yaml_and_the_answers_name_the_new_version(
        admin_server: tuple[Server, httpx.Client], site: dict[str, Path]) -> None:
    srv, _ = admin_server
    assert active_version(srv) == digest8(site["a"])
    srv.proc.send_signal(signal.SIGHUP)  # nothing changed: nothing happens, and the server lives
    time.sleep(0.5)
    assert srv.proc.poll() is None and active_version(srv) == digest8(site["a"])
    write_models_file(site["root"] / "models.yaml", [entry(site["b"])])
    srv.proc.send_signal(signal.SIGHUP)
    wait_for_version(srv, digest8(site["b"]))
    body = srv.client.post("/v1/embeddings", json={"model": "emb", "input": "x",
                                                   "options": {"return_meta": True}}).json()
    assert body["meta"]["version_id"] == digest8(site["b"])
    validate_response("/v1/embeddings", "post", 200, body)
    listed = srv.client.get("/v1/models").json()
    validate_response("/v1/models", "get", 200, listed)
    states = {v["version_id"]: v["state"] for v in listed["data"][0]["versions"]}
    assert states[digest8(site["b"])] == "active"
    validate_response("/health", "get", 200, srv.client.get("/health").json())


def test_a_package_copied_in_place_is_loaded_only_once_complete(
        admin_server: tuple[Server, httpx.Client], site: dict[str, Path]) -> None:
    srv, admin = admin_server
    before = active_version(srv)
    target = site["root"] / "packages" / "emb-c"
    source = site["a"] if before == digest8(site["b"]) else site["b"]
    target.mkdir()
    graph = (source / "model.onnx").read_bytes()
    shutil.copy(source / "MANIFEST.json", target / "MANIFEST.json")  # the manifest first, then the rest
    (target / "model.onnx").write_bytes(graph[: len(graph) // 2])
    write_models_file(site["root"] / "models.yaml", [entry(target)])
    time.sleep(1.5)  # several polls (--watch-models 0.3) see it half-copied
    assert active_version(srv) == before
    waiting = admin.get("/admin/v1/models").json()["models"][0]
    assert "waiting" in waiting and "emb-c" in waiting["waiting"]
    for path in source.iterdir():
        if path.name != "MANIFEST.json":
            (shutil.copytree if path.is_dir() else shutil.copy)(path, target / path.name)
    wait_for_version(srv, digest8(source))
    loaded = [v for v in admin.get("/admin/v1/models").json()["models"][0]["versions"] if v["state"] == "failed"]
    assert loaded == []  # never tried in part


def test_admin_routes(admin_server: tuple[Server, httpx.Client], site: dict[str, Path], tmp_path: Path) -> None:
    srv, admin = admin_server
    base = str(admin.base_url)
    no_key = httpx.get(f"{base}/admin/v1/models", timeout=10)
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "unauthorized"
    assert "Bearer" in no_key.headers["www-authenticate"]
    serving_key = httpx.get(f"{base}/admin/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=10)
    assert serving_key.status_code == 401
    assert yaml.safe_load(httpx.get(f"{base}/admin/v1/openapi.yaml", timeout=10).text)["openapi"] == "3.1.0"
    assert srv.client.get("/admin/v1/models").status_code == 404  # not on the serving listener
    outside = tmp_path / "elsewhere"
    shutil.copytree(site["a"], outside)
    r = admin.post("/admin/v1/models/emb/versions", json={"package": str(outside)})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    r = admin.post("/admin/v1/models/emb/versions", json={"package": "../" * 8 + str(outside)})
    assert r.status_code == 403
    r = admin.post("/admin/v1/models/emb/versions", json={"package": "https://example.com/pkg"})
    assert r.status_code == 400 and r.json()["error"]["reason"] == "url_unsupported"
    r = admin.post("/admin/v1/models/nope/versions", json={"package": "packages/emb-a"})
    assert r.status_code == 404
    # dry run: the plan, nothing applied
    current = active_version(srv)
    other = site["a"] if current != digest8(site["a"]) else site["b"]
    plan = admin.post("/admin/v1/reload", json={"dry_run": True}).json()
    assert plan["dry_run"] is True and plan["plan"][0]["model"] == "emb"
    # load as standby, reach it pinned, promote it, roll back
    r = admin.post("/admin/v1/models/emb/versions", json={"package": str(other.relative_to(site["root"])),
                                                          "promote": False})
    assert r.status_code == 202, r.text
    op = admin.get(r.headers["location"], params={"wait": 30}).json()
    assert op["state"] == "succeeded", op
    pinned = f"emb@{digest8(other)}"
    body = srv.client.post("/v1/embeddings", json={"model": pinned, "input": "x",
                                                   "options": {"return_meta": True}}).json()
    assert body["meta"]["version_id"] == digest8(other) and active_version(srv) == current
    r = admin.post("/admin/v1/models/emb/promote", json={"version": digest8(other)})
    assert admin.get(r.headers["location"], params={"wait": 30}).json()["state"] == "succeeded"
    assert active_version(srv) == digest8(other)
    r = admin.post("/admin/v1/models/emb/rollback")
    op = admin.get(r.headers["location"], params={"wait": 60}).json()
    assert op["state"] == "succeeded", op
    assert active_version(srv) == current
    metrics = srv.client.get("/metrics").text
    assert 'edge_runtime_model_rollbacks_total{model="emb",reason="explicit"} 1.0' in metrics
    assert "edge_runtime_memory_budget_bytes" in metrics


def test_sighup_never_ends_a_server_without_keys(site: dict[str, Path], tmp_path: Path) -> None:
    models = write_models_file(tmp_path / "models.yaml", [entry(site["a"])])
    srv = Server(models)
    try:
        srv.wait()
        for _ in range(3):
            srv.proc.send_signal(signal.SIGHUP)
            time.sleep(0.2)
        assert srv.proc.poll() is None
        assert srv.client.get("/health").json()["status"] == "ready"
        assert srv.client.get("/admin/v1/models").status_code == 404  # the admin API is off
        models.write_text("models: [", encoding="utf-8")  # a broken file changes nothing
        srv.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert srv.proc.poll() is None and srv.client.get("/health").json()["status"] == "ready"
    finally:
        srv.stop()


def test_an_embedder_whose_space_changed_is_held_pinned_until_promoted(
        admin_server: tuple[Server, httpx.Client], site: dict[str, Path]) -> None:
    srv, admin = admin_server
    # an earlier test's rolled-back version may still be draining: this test loads it afresh
    deadline = time.monotonic() + 60
    while any(v["state"] not in ("active", "retired", "failed") for m in admin.get("/admin/v1/models").json()["models"]
              if m["name"] == "emb" for v in m["versions"]):
        assert time.monotonic() < deadline, admin.get("/admin/v1/models").json()
        time.sleep(0.1)
    current = active_version(srv)
    other = site["a"] if current != digest8(site["a"]) else site["b"]
    r = admin.post("/admin/v1/models/emb/versions", json={"package": str(other), "update": {"min_cosine": 2}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    # this load's rules over the file's: the space may not change (seeds 0 and 1 are other embedders)
    r = admin.post("/admin/v1/models/emb/versions", json={"package": str(other),
                                                          "update": {"allow_space_change": False}})
    assert r.status_code == 202, r.text
    op = admin.get(r.headers["location"], params={"wait": 30}).json()
    assert op["state"] == "succeeded" and op["result"].get("held") is True, op
    assert op["result"]["agreement"]["space"]["changed"] is True
    document = yaml.safe_load(admin.get("/admin/v1/openapi.yaml").text)
    jsonschema.validate(op["result"]["agreement"], document["components"]["schemas"]["Agreement"])
    held = digest8(other)
    assert active_version(srv) == current
    listed = srv.client.get("/v1/models").json()
    validate_response("/v1/models", "get", 200, listed)
    version = next(v for v in listed["data"][0]["versions"] if v["version_id"] == held)
    assert version["state"] == "standby" and "output space changed" in version["reason"]
    health = srv.client.get("/health").json()
    validate_response("/health", "get", 200, health)
    assert any(v["version_id"] == held and v["state"] == "standby" for v in health["models"]["emb"]["versions"])
    versions = admin.get("/admin/v1/models").json()["models"][0]["versions"]
    assert next(v for v in versions if v["version_id"] == held and v["state"] == "standby")["agreement"]["cases"] > 0
    pinned = srv.client.post("/v1/embeddings", json={"model": f"emb@{held}", "input": "x",
                                                     "options": {"return_meta": True}}).json()
    plain = srv.client.post("/v1/embeddings", json={"model": "emb", "input": "x",
                                                    "options": {"return_meta": True}}).json()
    assert pinned["meta"]["version_id"] == held and plain["meta"]["version_id"] == current
    metrics = srv.client.get("/metrics").text
    assert 'edge_runtime_model_swaps_total{model="emb",result="held"} 1.0' in metrics
    assert 'edge_runtime_model_agreement{figure="min_cosine",model="emb"}' in metrics
    r = admin.post("/admin/v1/models/emb/promote", json={"version": held})
    assert admin.get(r.headers["location"], params={"wait": 30}).json()["state"] == "succeeded"
    assert active_version(srv) == held
