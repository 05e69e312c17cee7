"""The Router runs us: its managed argv, models file, socket directory, readiness poll, card read,
recycling and stop, played by tests/router/process.py against `python -m edge_runtime` as
VLLM_SRUN_COMMAND names it."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.router import api
from tests.router.client import (
    Question,
    bundle_parts,
    check_embeddings,
    checked_answers,
    classify_request,
    content_part,
    decisions_request,
    decode_embed,
    embed_request,
    exchange,
    send_bundle,
)
from tests.router.process import MANAGED_BUNDLE_TASKS, STOP_GRACE_PERIOD, ManagedProcess
from tests.support.server_harness import ROOT

STATE = "I was charged twice for order 1182, I want my money back"
QUESTIONS = [
    Question("tool", "choice", "Which tool should handle this?",
             choices=[("refunds", "Refund a payment"), ("shipping", "Track a delivery"),
                      ("account", "Reset a password")]),
    Question("urgent", "noul", "Is it urgent?"),
    Question("angry", "score", "How angry is the customer?", levels=["Calm", "Annoyed", "Furious"]),
]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def sparrow_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from converters.sparrow.export import build_sparrow_package

    return build_sparrow_package(tmp_path_factory.mktemp("managed-sparrow"))


def runtime_dir(tmp_path: Path) -> Path:
    """manager.go: $TMPDIR/vllm-srun-<pid>, short enough for a socket path."""
    short = Path("/tmp") / f"er-{hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]}"
    shutil.rmtree(short, ignore_errors=True)
    return short / "vllm-srun-4242"


def entry(model: str, name: str, revision: str = "", profile: str = "exact") -> dict[str, Any]:
    """process.go ``modelEntry`` as planProcesses fills it (a CPU worker)."""
    return {"model": model, "revision": revision, "name": name, "device": "cpu", "profile": profile}


def hub_cache(root: Path, repo: str, package: Path, refs: dict[str, str]) -> Path:
    """A Hugging Face cache holding ``package`` as ``repo`` at COMMIT: files as blobs named by their
    content, the snapshot's files symbolic links to them, and refs naming the commit."""
    folder = root / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / COMMIT
    for path in sorted(package.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            link = snapshot / path.relative_to(package)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    for ref, commit in refs.items():
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return root


@pytest.fixture
def managed(tmp_path: Path) -> Any:
    started: list[ManagedProcess] = []

    def make(models: list[dict[str, Any]], **settings: Any) -> ManagedProcess:
        process = ManagedProcess(runtime_dir(tmp_path), settings.pop("name", "worker"), models, **settings)
        started.append(process)
        return process

    yield make
    for process in started:
        if process.proc is not None and process.proc.poll() is None:
            process.terminate()
        shutil.rmtree(process.runtime_dir.parent, ignore_errors=True)


def test_the_managed_argv_serves_the_defaults_over_the_socket(
        managed: Callable[..., ManagedProcess], minilm_package: Path, sparrow_package: Path) -> None:
    process = managed([entry(str(minilm_package), "minilm-embedding"), entry(str(sparrow_package), "sparrow-nano")],
                      threads=1)
    process.start()
    process.wait_ready()
    assert stat.S_IMODE(process.runtime_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(process.models_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(process.socket.stat().st_mode) == 0o600  # the directory guards it, the mode too
    sparrow = process.cards["sparrow-nano"]
    ours = listed_models(process)  # our members beside the Router's card
    assert ours["minilm-embedding"]["variant"] == "int8"  # profile exact: the exact int8 where there is one
    assert ours["sparrow-nano"]["variant"] == "fp32"
    assert ours["minilm-embedding"]["engine_args"]["threads"] == 1  # --threads caps each model
    with process.client() as client:
        listed = exchange(client, "/v1/models")
        assert isinstance(listed.body, api.ModelList) and listed.body.limits is not None
        assert listed.body.limits.max_bundle_tasks == MANAGED_BUNDLE_TASKS
        embedded = exchange(client, "/v1/embeddings", embed_request("minilm-embedding", [content_part(STATE)]))
        assert embedded.status == 200
        check_embeddings(decode_embed(embedded.body), 1)
        decided = exchange(client, "/v1/decisions", decisions_request("sparrow-nano", STATE, QUESTIONS, sparrow))
        assert decided.status == 200
        assert not any(a.error for a in checked_answers(decided.body, QUESTIONS).values())
        # a request stage of 300 calls: one bundle part under the managed cap
        tasks: list[dict[str, Any]] = []
        for i in range(150):
            tasks.append({"embeddings": embed_request("minilm-embedding", [content_part(f"chunk {i} of a long text")])})
            tasks.append({"decisions": decisions_request("sparrow-nano", f"{STATE} ({i})", QUESTIONS[:1], sparrow)})
        (part,) = bundle_parts(tasks, MANAGED_BUNDLE_TASKS)
        results = send_bundle(client, part)
        failed = [(r.id, r.status, r.error) for r in results if r.error is not None]
        assert len(results) == 300 and not failed, failed[:3]
    took = process.terminate()
    assert process.proc is not None and process.proc.returncode == 0, process.log()
    assert took < STOP_GRACE_PERIOD, f"SIGTERM took {took:.1f} s"
    assert not process.socket.exists() and not process.group_alive()


def test_a_repo_id_resolves_offline_and_a_missing_one_fails_alone(
        managed: Callable[..., ManagedProcess], minilm_package: Path, tmp_path: Path) -> None:
    cache = hub_cache(tmp_path / "hub", "sentence-transformers/all-MiniLM-L6-v2", minilm_package,
                      {"main": COMMIT, "v1": COMMIT})
    process = managed([entry("sentence-transformers/all-MiniLM-L6-v2", "latest"),
                       entry("sentence-transformers/all-MiniLM-L6-v2", "pinned", revision=COMMIT),
                       entry("sentence-transformers/all-MiniLM-L6-v2", "tagged", revision="v1", profile="fp32"),
                       entry("someone/not-downloaded", "absent")], cache_dir=cache, threads=1)
    process.start()
    process.watch(lambda p: all(p.ready(n) for n in ("latest", "pinned", "tagged"))
                  and p.states["absent"][0] == "failed")
    _, reason = process.states["absent"]
    assert str(cache) in reason and "nothing is downloaded" in reason, reason
    assert not process.every_model_failed()  # the Router keeps a process that serves any model
    digest = process.cards["latest"].model_sha256
    assert digest and process.cards["pinned"].model_sha256 == digest == process.cards["tagged"].model_sha256
    ours = listed_models(process)
    assert ours["tagged"]["variant"] == "fp32" and ours["latest"]["variant"] == "int8"
    with process.client() as client:
        for name in ("latest", "tagged"):
            embedded = exchange(client, "/v1/embeddings", embed_request(name, [content_part(STATE)]))
            assert embedded.status == 200
        gone = exchange(client, "/v1/embeddings", embed_request("absent", [content_part(STATE)]))
        assert gone.status == 503 and isinstance(gone.body, api.ErrorResponse)


def test_a_source_artifact_is_converted_into_the_cache_once_and_reused(
        managed: Callable[..., ManagedProcess], fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    """A repo id whose snapshot is a source (a Vela 1.0 specialist, as the Router's catalogue names them)
    is converted once into the cache, then served; a restart reuses the conversion."""
    repo = "llm-semantic-router/vela-hazard-tiny"
    cache = hub_cache(tmp_path / "hub", repo, fixture_package("task-hazard-source"), {"main": COMMIT})
    process = managed([entry(repo, "hazard")], cache_dir=cache, threads=1)
    process.start()
    process.wait_ready(timeout=600)  # the converters' own parity check runs inside the conversion
    assert "converted" in process.log()
    converted = list((cache / "edge-runtime-packages").iterdir())
    assert any(p.is_dir() and p.name.startswith("llm-semantic-router_vela-hazard-tiny-") for p in converted)
    card = process.cards["hazard"]
    with process.client() as client:
        classified = exchange(client, "/v1/classify", classify_request("hazard", [{"text": STATE}]))
        assert classified.status == 200, classified.raw
        assert [r.get("error") for r in classified.raw["results"]] == [None]
    assert process.terminate() < STOP_GRACE_PERIOD
    process.start()  # a restart reuses the conversion: the source's files are unchanged
    process.wait_ready()
    assert "files are unchanged" in process.log() and process.cards["hazard"].model_sha256 == card.model_sha256


def test_every_model_failing_is_recycled_and_a_killed_runtime_restarts_over_its_socket(
        managed: Callable[..., ManagedProcess], minilm_package: Path, tmp_path: Path) -> None:
    failing = managed([entry("someone/absent", "a"), entry(str(tmp_path / "no-such-dir"), "b")], name="failing")
    failing.start()
    failing.watch(lambda p: p.every_model_failed(), timeout=60)
    assert "no directory" in failing.states["b"][1]
    took = failing.terminate()  # group.go recycleFailedLocked -> supervisor.recycle
    assert took < STOP_GRACE_PERIOD and failing.proc is not None and failing.proc.returncode == 0

    process = managed([entry(str(minilm_package), "minilm-embedding")], threads=1)
    process.start()
    process.wait_ready()
    process.kill()  # no clean-up: the socket file stays behind
    assert stat.S_ISSOCK(process.socket.lstat().st_mode)
    process.start(remove_stale=False)  # our own check replaces it, whatever the supervisor does
    process.wait_ready()
    with process.client() as client:
        embedded = exchange(client, "/v1/embeddings", embed_request("minilm-embedding", [content_part(STATE)]))
        assert embedded.status == 200


def test_sigterm_answers_what_was_accepted_and_exits_within_the_grace(
        managed: Callable[..., ManagedProcess], minilm_package: Path) -> None:
    process = managed([entry(str(minilm_package), "minilm-embedding", profile="fp32")], threads=1)
    process.start()
    process.wait_ready()
    statuses: list[int] = []
    texts = [f"sentence number {i} of a batch that takes a while to embed on one thread" for i in range(64)]

    def call(i: int) -> None:
        with process.client() as client:
            body = embed_request("minilm-embedding", [content_part(f"{i} {t}") for t in texts])
            statuses.append(client.post("/v1/embeddings", json=body).status_code)

    callers = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for caller in callers:
        caller.start()
    process.watch(lambda p: _queued(p) > 0, timeout=30)  # accepted: in the model's queue or its forward
    took = process.terminate()
    for caller in callers:
        caller.join(30)
    assert statuses == [200] * len(callers), statuses
    assert took < STOP_GRACE_PERIOD, f"SIGTERM took {took:.1f} s"
    assert process.proc is not None and process.proc.returncode == 0
    assert not process.socket.exists()


def listed_models(process: ManagedProcess) -> dict[str, dict[str, Any]]:
    """/v1/models' entries as JSON, by id."""
    with process.client() as client:
        return {m["id"]: m for m in client.get("/v1/models").json()["data"]}


def _queued(process: ManagedProcess) -> float:
    """Jobs in flight or waiting, from /metrics over the socket."""
    with process.client() as client:
        text = client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("edge_runtime_saturation "):
            return float(line.split()[1])
    return 0.0


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_runtime", "serve", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_the_socket_path_is_guarded(minilm_package: Path, tmp_path: Path) -> None:
    models = ["--models", str(ROOT / "models.yaml")]
    not_a_socket = tmp_path / "file.sock"
    not_a_socket.write_text("keep me")
    refused = _serve(*models, "--uds", str(not_a_socket))
    assert refused.returncode == 2 and "not a socket" in refused.stderr
    assert not_a_socket.read_text() == "keep me"
    short = Path("/tmp") / f"er-live-{os.getpid()}"
    short.mkdir(exist_ok=True)
    try:
        live = socket.socket(socket.AF_UNIX)
        live.bind(str(short / "live.sock"))
        live.listen(1)
        refused = _serve(*models, "--uds", str(short / "live.sock"))
        assert refused.returncode == 2 and "another server is listening" in refused.stderr
        live.close()
    finally:
        shutil.rmtree(short, ignore_errors=True)
