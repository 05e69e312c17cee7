"""`python -m bench swap`: zero-downtime model updates under load (issue 25's measured "Done when").

One real server (`python -m edge_runtime serve` on 127.0.0.1, the admin listener on, its key in a
temporary file, `--update-watch-seconds 0` so that an old version is released as soon as it has
drained) serves the default models, and each default model has a second verified version written by
the converters (converters/versions.py, run by `python -m bench.swap build` in a subprocess: converters
import torch): minilm-embedding's A is the default package served as int8, its B the fp32-only package
of the same weights; sparrow-nano's B is the same weights under another digest.

Swaps go through the admin API (``POST /admin/v1/models/{name}/versions``, then the operation is
followed to its end). Two runs on the same server: a steady open-loop mixed load (embeddings and
decisions alternately, at a fixed rate, over pooled keep-alive connections: bench/harness/load.py)
without a swap, then the same load while each model is swapped A -> B -> A (``--rounds 2``: in ABBA
order). Then, with no other load, the server's RSS (/proc) across a MiniLM swap (before the new version loads, with both
loaded, after the switch, after the old one's release) and a long request accepted on the old version
just before a switch; and with ``--soak N``, N swaps of each model under a light load. The exit
status says whether every request was answered by a version active when it was accepted (0) or not
(1); the latency goal is reported, not judged.

A request "answered by a version that was not active when it was accepted": the server accepts a
request at some instant between the client's send and its receipt (wall clock, one machine). The
admin API gives each version's ``activated_at``, stamped under the update manager's lock just
before the name is repointed. The versions a request may rightly be answered by are the one active
at its send time and every one activated before its receipt; an answer whose ``meta.version_id``
(return_meta) is outside that set counts as wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.load import OpenLoopRun, Reply, open_loop
from bench.harness.report import (
    BENCHMARKS_DOC,
    ROOT,
    ForeignLoad,
    Table,
    conditions,
    fmt_ms,
    fmt_ratio,
    record,
    render_run,
)
from bench.harness.server import HOST, ServerProcess, free_port
from bench.harness.stats import percentile, ratio

ADMIN_KEY = "swap-bench-admin-key-0123456789abcdef"
VERSIONS_DIR = "swap-versions"  # under --packages: the B versions (the admin API's package root is --packages)
P99_GOAL = 2.0
SOAK_RSS_GOAL = 0.10
OP_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 60.0
RSS_SETTLE_S = 0.5  # between a version's release and an RSS reading
CLIENT_CONNECTIONS = 16


# -- what is served ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Version:
    """One package version of a served name."""

    package: Path
    variant: str


@dataclass(frozen=True)
class Served:
    """A name the bench loads and swaps: its surface, its two versions and its models.yaml settings."""

    name: str
    surface: str  # "embeddings" or "decisions"
    a: Version
    b: Version
    settings: dict[str, Any] = field(default_factory=dict)

    def entry(self) -> dict[str, Any]:
        return {"name": self.name, "package": str(self.a.package.resolve()), "variant": self.a.variant,
                "device": "cpu", **self.settings}


def digest8(package: Path) -> str:
    """A package's version_id as the server names it: its manifest digest's first 8 hex digits."""
    return str(json.loads((package / "MANIFEST.json").read_text(encoding="utf-8"))["digest"])[:8]


def default_models(packages: Path) -> list[Served]:
    """The default models (models.yaml's settings) with their B versions under ``packages``."""
    from converters.versions import version_paths

    b = version_paths(packages / VERSIONS_DIR)
    return [
        Served("minilm-embedding", "embeddings", Version(packages / "minilm-embedding", "int8"),
               Version(b["minilm-embedding"], "fp32"), {"max_queue": 256}),
        Served("sparrow-nano", "decisions", Version(packages / "sparrow-nano", "fp32"),
               Version(b["sparrow-nano"], "fp32"), {"threads": 1}),
    ]


# -- the B versions (converters/versions.py, in a subprocess: converters import torch) ----------------

def ensure_versions(packages: Path) -> None:
    """Build the default packages and their B versions when missing, in subprocesses (torch)."""
    import subprocess

    from bench.harness.runners import offline_env

    if not all((p / "card.json").is_file() for p in (packages / "minilm-embedding", packages / "sparrow-nano")):
        subprocess.run([sys.executable, "-m", "converters", "default", "--out", str(packages)], cwd=ROOT,
                       env=offline_env(), check=True, timeout=900)
    subprocess.run([sys.executable, "-m", "bench.swap", "build", "--packages", str(packages)], cwd=ROOT,
                   env=offline_env(), check=True, timeout=900)


# -- the admin API -----------------------------------------------------------------------------------

class Admin:
    """The admin listener's client (its own key)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=120)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Authorization": f"Bearer {ADMIN_KEY}",
                                                           "content-type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"null")
        finally:
            conn.close()

    def models(self) -> dict[str, dict[str, Any]]:
        status, body = self.call("GET", "/admin/v1/models")
        if status != 200:
            raise RuntimeError(f"admin models: HTTP {status}: {body}")
        return {m["name"]: m for m in body["models"]}

    def follow(self, status: int, body: Any) -> dict[str, Any]:
        """Follow an accepted operation to its end; RuntimeError unless it succeeded."""
        if status != 202:
            raise RuntimeError(f"admin operation refused: HTTP {status}: {body}")
        deadline = time.monotonic() + OP_TIMEOUT_S
        op = body
        while op["state"] in ("queued", "running"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"operation {op['id']} not done after {OP_TIMEOUT_S:.0f}s: {op}")
            _, op = self.call("GET", f"/admin/v1/operations/{op['id']}?wait=30")
        if op["state"] != "succeeded":
            raise RuntimeError(f"operation {op['id']} {op['state']}: {op.get('reason')}")
        return dict(op)

    def load(self, name: str, version: Version, promote: bool = True) -> dict[str, Any]:
        return self.follow(*self.call("POST", f"/admin/v1/models/{name}/versions",
                                      {"package": str(version.package.resolve()), "variant": version.variant,
                                       "promote": promote}))

    def promote(self, name: str, version_id: str) -> dict[str, Any]:
        return self.follow(*self.call("POST", f"/admin/v1/models/{name}/promote", {"version": version_id}))

    def active(self, name: str) -> dict[str, Any]:
        """The active version's entry (version_id, serial, activated_at, ...)."""
        model = self.models()[name]
        return next(v for v in model["versions"] if v["state"] == "active" and v["version_id"] == model["active"])

    def version(self, name: str, serial: int) -> dict[str, Any] | None:
        return next((v for v in self.models()[name]["versions"] if v["serial"] == serial), None)

    def wait_released(self, name: str, serial: int, timeout: float = DRAIN_TIMEOUT_S) -> dict[str, Any]:
        """The version's entry once it is retired (drained and released)."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.version(name, serial)
            if v is not None and v["state"] in ("retired", "failed") and "released_at" in v:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} version serial {serial} not released after {timeout:.0f}s: {v}")
            time.sleep(0.05)


@dataclass
class Swap:
    """One swap of a name, as the admin API saw it."""

    name: str
    old: str
    new: str
    old_serial: int
    new_serial: int
    requested_at: float  # wall clock
    activated_at: float
    finished_at: float
    released_at: float | None = None

    @property
    def seconds(self) -> float:
        """Request to switch: load, verify, promote."""
        return self.activated_at - self.requested_at

    @property
    def drain_seconds(self) -> float | None:
        return None if self.released_at is None else self.released_at - self.activated_at


def swap_to(admin: Admin, name: str, version: Version, wait_release: bool = True) -> Swap:
    """Load ``version`` beside the active one and promote it; with ``wait_release``, wait for the old one's release."""
    old = admin.active(name)
    requested = time.time()
    op = admin.load(name, version)
    new = admin.active(name)
    if new["serial"] == old["serial"]:
        raise RuntimeError(f"{name}: the swap to {version.package} left {old['version_id']} active: {op}")
    swap = Swap(name, old["version_id"], new["version_id"], old["serial"], new["serial"], requested,
                float(new["activated_at"]), float(op["finished_at"]))
    if wait_release:
        swap.released_at = float(admin.wait_released(name, old["serial"])["released_at"])
    return swap


# -- the load ----------------------------------------------------------------------------------------

@dataclass
class Sample:
    """One request of the load."""

    model: str
    scheduled: float  # the load's loop time
    sent_at: float  # wall clock, just before the request was written
    received_at: float  # wall clock, after the last body byte
    latency_s: float  # from its scheduled time (open loop: a late send counts) to the last byte
    status: int  # 0: no HTTP answer
    version_id: str | None
    error: str | None = None


def request_bodies(models: Sequence[Served], count: int = 48) -> dict[str, list[bytes]]:
    """Per name, ``count`` distinct request bodies with return_meta."""
    from bench.harness.texts import decision_requests, sentences

    out: dict[str, list[bytes]] = {}
    texts = sentences(3 * count, seed=7)
    for m in models:
        if m.surface == "embeddings":
            bodies = [{"model": m.name, "input": texts[3 * i: 3 * i + 1 + i % 3], "options": {"return_meta": True}}
                      for i in range(count)]
        else:
            bodies = [{"model": m.name, **r, "options": {"return_meta": True}} for r in decision_requests(count)]
        out[m.name] = [json.dumps(b).encode() for b in bodies]
    return out


def sample(reply: Reply, name: str) -> Sample:
    """A reply of the load as the accounting reads it: answered with a version, or failed and why (an
    embedding item or a decision question answered with an error is a failure too)."""
    version, error = None, reply.error
    if reply.status == 200:
        answer = json.loads(reply.body)
        version = answer.get("meta", {}).get("version_id")
        item_errors = [item["error"] for item in answer.get("data", []) if item.get("error")]
        item_errors += [a["error"] for a in (answer.get("answers") or {}).values()
                        if isinstance(a, dict) and a.get("error")]
        if version is None or item_errors:
            error = "no meta.version_id" if version is None else f"item errors: {item_errors[:2]}"
            version = None
    elif reply.status:
        error = reply.body[:300].decode(errors="replace")
    return Sample(name, reply.scheduled, reply.sent_at, reply.received_at, reply.latency_s, reply.status, version,
                  error)


class MixedLoad:
    """The harness's open loop at a fixed rate, alternating between the names, in a thread of its own
    while this one swaps versions."""

    def __init__(self, port: int, models: Sequence[Served], rate: float, connections: int = CLIENT_CONNECTIONS
                 ) -> None:
        self.paths = {m.name: f"/v1/{m.surface}" for m in models}
        self.bodies = request_bodies(models)
        self.names = [m.name for m in models]
        self._stop = threading.Event()
        self._run = OpenLoopRun()

        def load() -> None:
            self._run = asyncio.run(open_loop(port, self._request, rate, connections=connections, stop=self._stop))

        self._thread = threading.Thread(target=load, name="swap-load", daemon=True)

    def _request(self, i: int) -> tuple[str, bytes]:
        name = self.names[i % len(self.names)]
        bodies = self.bodies[name]
        return self.paths[name], bodies[(i // len(self.names)) % len(bodies)]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[Sample]:
        """Stop sending; every request sent is waited for. The samples, in completion order."""
        self._stop.set()
        self._thread.join()
        return [sample(r, self.names[r.index % len(self.names)]) for r in self._run.replies]


# -- accounting --------------------------------------------------------------------------------------

Timeline = dict[str, list[tuple[float, str]]]  # name -> [(activated_at, version_id)], in time order


def allowed_versions(timeline: list[tuple[float, str]], sent: float, received: float) -> set[str]:
    """The versions a request sent at ``sent`` and answered at ``received`` may rightly be answered by:
    the one active at ``sent`` and every one activated before ``received``."""
    out = set()
    current = None
    for at, vid in timeline:
        if at <= sent:
            current = vid
        elif at <= received:
            out.add(vid)
    if current is not None:
        out.add(current)
    return out


@dataclass
class RunFigures:
    """One run's accounting and latencies."""

    label: str
    seconds: float
    sent: int
    answered: int
    failed: int
    wrong_version: int
    versions_seen: dict[str, list[str]]
    p50: float
    p99: float
    failures: list[str]
    # answered requests sent while a swap was in progress (its request to the old version's release)
    in_swaps: int = 0
    p99_in_swaps: float | None = None
    p99_by_model: dict[str, float] = field(default_factory=dict)


def account(label: str, samples: Sequence[Sample], timeline: Timeline, seconds: float | None = None) -> RunFigures:
    """Count a run's requests: answered (200 with a version), failed, answered by a wrong version."""
    if not samples:
        raise ValueError(f"{label}: no request was sent")
    ok = [s for s in samples if s.status == 200 and s.version_id is not None]
    bad = [s for s in samples if not (s.status == 200 and s.version_id is not None)]
    wrong = [s for s in ok if s.version_id not in allowed_versions(timeline.get(s.model, []), s.sent_at, s.received_at)]
    seen: dict[str, list[str]] = {}
    for s in ok:
        if s.version_id not in seen.setdefault(s.model, []):
            seen[s.model].append(str(s.version_id))
    latencies = [s.latency_s for s in ok] or [float("nan")]
    by_model = {name: percentile([s.latency_s for s in ok if s.model == name], 99.0)
                for name in sorted({s.model for s in ok})}
    span = seconds if seconds is not None else max(s.received_at for s in samples) - min(s.sent_at for s in samples)
    return RunFigures(label, span, len(samples), len(ok), len(bad), len(wrong), seen,
                      percentile(latencies, 50.0), percentile(latencies, 99.0),
                      [f"{s.model}: HTTP {s.status}: {s.error}" for s in bad[:5]]
                      + [f"{s.model}: answered by {s.version_id}, outside "
                         f"{sorted(allowed_versions(timeline.get(s.model, []), s.sent_at, s.received_at))}"
                         for s in wrong[:5]], p99_by_model=by_model)


# -- the measurements --------------------------------------------------------------------------------

@dataclass
class Config:
    seconds: float = 20.0  # each run's load
    rate: float = 24.0  # requests/s, both names together
    lead_s: float = 2.0  # load before the first swap
    soak: int = 0
    soak_rate: float = 4.0
    long_inputs: int = 32  # texts in the long request
    rounds: int = 1  # pairs of runs; odd rounds swap their order (no swap first, then swaps; then reversed)
    warmup_s: float = 3.0
    threads: int = CLIENT_CONNECTIONS  # the load's pooled client connections


@dataclass
class Report:
    runs: list[RunFigures]
    swaps: list[Swap]
    p99_ratio: float | None
    long_request: dict[str, Any] | None = None
    soak: dict[str, Any] | None = None

    def ok(self) -> bool:
        """Every request answered by a version active when it was accepted (timings are not judged here)."""
        good = all(r.failed == 0 and r.wrong_version == 0 for r in self.runs)
        if self.long_request is not None:
            good = good and self.long_request["answered_by_old"]
        if self.soak is not None:
            good = good and self.soak["run"].failed == 0 and self.soak["run"].wrong_version == 0
        return good


def start_server(models: Sequence[Served], root: Path, log_dir: Path) -> tuple[ServerProcess, Admin]:
    """The server over the A versions, the admin listener on (its key in ``log_dir``), packages under ``root``."""
    keys = log_dir / "admin.keys"
    keys.write_text(ADMIN_KEY + "\n", encoding="utf-8")
    keys.chmod(0o600)
    admin_port = free_port()
    server = ServerProcess(models[0].a.package, models[0].a.variant, 1, log_dir=log_dir,
                           models=[m.entry() for m in models],
                           args=("--admin-key-file", str(keys), "--admin-port", str(admin_port),
                                 "--admin-package-root", str(root.resolve()), "--update-watch-seconds", "0"))
    server.wait_ready()
    return server, Admin(admin_port)


def initial_timeline(admin: Admin, models: Sequence[Served]) -> Timeline:
    return {m.name: [(float(admin.active(m.name)["activated_at"]), admin.active(m.name)["version_id"])]
            for m in models}


def run_load(server: ServerProcess, models: Sequence[Served], cfg: Config, rate: float,
             during: Callable[[], None] | None = None, seconds: float | None = None) -> list[Sample]:
    """The load for ``seconds`` (at least until ``during`` returns, which starts after lead_s)."""
    load = MixedLoad(server.port, models, rate, cfg.threads)
    started = time.perf_counter()
    load.start()
    if during is not None:
        time.sleep(cfg.lead_s)
        during()
    left = (seconds if seconds is not None else cfg.seconds) - (time.perf_counter() - started)
    if left > 0:
        time.sleep(left)
    elif during is not None:
        time.sleep(1.0)  # a little load after the last swap too
    return load.stop()


def long_request(server: ServerProcess, admin: Admin, m: Served, cfg: Config) -> dict[str, Any]:
    """Two measurements on ``m`` with no other load. Memory: RSS before the other version loads, once
    it is loaded (standby), after the switch (the old one draining) and after the old one's release.
    Then a long request accepted before a switch back: it must be answered by the version it was
    accepted on, which is released only afterwards."""
    from bench.harness.texts import sentences

    first = admin.active(m.name)
    rss = {"before the new version loads": server.memory()["VmRSS"]}
    admin.load(m.name, m.b, promote=False)
    second = next(v for v in admin.models()[m.name]["versions"] if v["state"] == "standby")
    rss["new version loaded (standby)"] = server.memory()["VmRSS"]
    admin.promote(m.name, second["version_id"])
    rss["after the switch (old draining)"] = server.memory()["VmRSS"]
    admin.wait_released(m.name, first["serial"])
    # the state says retired a moment before the heap is trimmed (updates/lifecycle.py Versions.release)
    rss["as the old version is listed retired"] = server.memory()["VmRSS"]
    time.sleep(RSS_SETTLE_S)
    rss[f"{RSS_SETTLE_S:g} s after the release"] = server.memory()["VmRSS"]

    admin.load(m.name, m.a, promote=False)  # back to A, with a long request across the switch
    third = next(v for v in admin.models()[m.name]["versions"] if v["state"] == "standby")
    texts = [" ".join(sentences(16, seed=100 + i)) for i in range(cfg.long_inputs)]
    # truncate: every text fills the model's 256 tokens (none is refused as too long)
    body = {"model": m.name, "input": texts, "options": {"return_meta": True, "overflow": "truncate"}}
    result: dict[str, Any] = {}

    def send() -> None:
        conn = http.client.HTTPConnection(HOST, server.port, timeout=300)
        result["sent_at"] = time.time()
        conn.request("POST", "/v1/embeddings", body=json.dumps(body).encode(),
                     headers={"content-type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
        embedded = sum(1 for item in data.get("data", []) if item.get("embedding") is not None)
        result.update(status=resp.status, received_at=time.time(), embedded=embedded,
                      version_id=data.get("meta", {}).get("version_id") if resp.status == 200 else None)
        conn.close()

    thread = threading.Thread(target=send)
    thread.start()
    deadline = time.monotonic() + 30
    while (admin.version(m.name, second["serial"]) or {}).get("leases", 0) < 1:  # accepted: it holds the version
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the long request was not seen holding {second['version_id']}: {result}")
        time.sleep(0.005)
    held_at = time.time()
    admin.promote(m.name, third["version_id"])
    activated = float(admin.active(m.name)["activated_at"])
    thread.join()
    released = admin.wait_released(m.name, second["serial"])
    return {
        "model": m.name, "old": second["version_id"], "new": third["version_id"], "inputs": cfg.long_inputs,
        "status": result.get("status"), "answered_version": result.get("version_id"),
        "embedded": result.get("embedded"),
        "answered_by_old": (result.get("status") == 200 and result.get("version_id") == second["version_id"]
                            and result.get("embedded") == cfg.long_inputs),
        "seen_holding_before_switch_s": activated - held_at,
        "finished_after_switch_s": result.get("received_at", 0.0) - activated,
        "duration_s": result.get("received_at", 0.0) - result["sent_at"],
        "released_after_answer_s": float(released["released_at"]) - result.get("received_at", 0.0),
        "memory_from": first["version_id"], "memory_to": second["version_id"],
        "old_resident_bytes": first.get("resident_bytes"), "new_resident_bytes": second.get("resident_bytes"),
        "rss": rss,
    }


def soak(server: ServerProcess, admin: Admin, models: Sequence[Served], cfg: Config) -> dict[str, Any]:
    """cfg.soak swaps of each name (A -> B -> A ...) under a light load; RSS after each swap's drain."""
    rss: list[int] = []
    swaps: list[Swap] = []

    def swapping() -> None:
        for k in range(cfg.soak):
            for m in models:
                swaps.append(swap_to(admin, m.name, m.b if k % 2 == 0 else m.a))
            time.sleep(RSS_SETTLE_S)
            rss.append(server.memory()["VmRSS"])

    timeline = initial_timeline(admin, models)
    samples = run_load(server, models, cfg, cfg.soak_rate, swapping, seconds=0.0)
    for s in swaps:
        timeline[s.name].append((s.activated_at, s.new))
    run = account(f"soak ({cfg.soak} swaps of each)", samples, timeline)
    growth = ratio(rss[-1] - rss[1], rss[1]) if len(rss) >= 2 else None
    return {"run": run, "rss": rss, "growth": growth, "swaps": swaps}


def measure(models: Sequence[Served], root: Path, cfg: Config, log_dir: Path, long: bool = True) -> Report:
    """Both runs (no swap, then the same load with every name swapped A -> B -> A), the long request,
    and the soak if asked; one server throughout."""
    server, admin = start_server(models, root, log_dir)
    try:
        run_load(server, models, cfg, cfg.rate, seconds=cfg.warmup_s)  # warm-up, not counted
        timeline = initial_timeline(admin, models)
        swaps: list[Swap] = []
        plain: list[Sample] = []
        swapped: list[Sample] = []

        def swapping() -> None:
            for m in models:
                swaps.append(swap_to(admin, m.name, m.b))
                swaps.append(swap_to(admin, m.name, m.a))

        spent = {False: 0.0, True: 0.0}
        for r in range(cfg.rounds):
            for with_swaps in ((False, True) if r % 2 == 0 else (True, False)):
                t0 = time.perf_counter()
                if with_swaps:
                    swapped += run_load(server, models, cfg, cfg.rate, swapping)
                else:
                    plain += run_load(server, models, cfg, cfg.rate)
                spent[with_swaps] += time.perf_counter() - t0
        for s in swaps:
            timeline[s.name].append((s.activated_at, s.new))
        base = account("steady load, no swap", plain, timeline, spent[False])
        during = account("the same load, each model swapped A -> B -> A", swapped, timeline, spent[True])
        windows = [(s.requested_at, s.released_at or s.finished_at) for s in swaps]
        inside = [x.latency_s for x in swapped if x.status == 200 and x.version_id is not None
                  and any(a <= x.sent_at <= b for a, b in windows)]
        during.in_swaps = len(inside)
        during.p99_in_swaps = percentile(inside, 99.0) if inside else None
        report = Report([base, during], swaps, ratio(during.p99, base.p99))
        embedding = next((m for m in models if m.surface == "embeddings"), None)
        if long and embedding is not None:
            report.long_request = long_request(server, admin, embedding, cfg)
        if cfg.soak:
            report.soak = soak(server, admin, models, cfg)
        return report
    except BaseException:
        print(f"server log: {server.log_path}\n{server.log_tail()}", file=sys.stderr)
        raise
    finally:
        server.stop()


# -- the report --------------------------------------------------------------------------------------

def _mib(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**20:.1f}"


def tables(report: Report, cfg: Config, models: Sequence[Served]) -> list[Table]:
    """The report as Markdown tables."""
    runs = report.runs + ([report.soak["run"]] if report.soak else [])
    base_p99 = report.runs[0].p99
    out = [Table(
        f"Open-loop mixed load at {cfg.rate:g} req/s ({' and '.join(m.surface for m in models)} alternately), "
        "with and without swaps",
        ["run", "seconds", "sent", "answered", "failed", "wrong version", "versions seen", "p50 ms", "p99 ms"],
        [[r.label, f"{r.seconds:.1f}", str(r.sent), str(r.answered), str(r.failed), str(r.wrong_version),
          "; ".join(f"{k}: {', '.join(v)}" for k, v in r.versions_seen.items()), fmt_ms(r.p50), fmt_ms(r.p99)]
         for r in runs],
        [f"p99 of the run with swaps / p99 of the run without: **{fmt_ratio(report.p99_ratio)}** "
         f"(goal <= {P99_GOAL:g}x)",
         *[f"only the {r.in_swaps} answered requests sent while a swap was in progress (its request to the "
           f"old version's release): p99 {fmt_ms(r.p99_in_swaps)} ms, "
           f"{fmt_ratio(ratio(r.p99_in_swaps, base_p99))} the run without" for r in runs
           if r.p99_in_swaps is not None],
         *[f"{r.label}: p99 by model " + ", ".join(f"{k} {fmt_ms(v)} ms" for k, v in r.p99_by_model.items())
           for r in runs],
         "latency: from each request's scheduled send time to its last byte (a late send counts), "
         "answered requests only; failed: no HTTP 200 with meta.version_id",
         "wrong version: meta.version_id is neither the version active when the request was sent nor one "
         "activated (admin API activated_at) before its answer arrived",
         *[f"failure: {f}" for r in runs for f in r.failures]])]
    out.append(Table(
        "Swaps during the load run (admin API: load beside, verify, promote; the old version drains)",
        ["model", "from", "to", "request -> switch s", "switch -> old released s"],
        [[s.name, s.old, s.new, f"{s.seconds:.2f}", "–" if s.drain_seconds is None else f"{s.drain_seconds:.2f}"]
         for s in report.swaps]))
    if report.long_request:
        lr = report.long_request
        rss = list(lr["rss"].items())
        out.append(Table(
            f"Memory across a swap of {lr['model']} ({lr['memory_from']} -> {lr['memory_to']}), no other load: "
            "the server's RSS (VmRSS, MiB)",
            ["point", "RSS MiB"],
            [*[[k, _mib(v)] for k, v in rss],
             [f"given back by the release (after the switch - {RSS_SETTLE_S:g} s after the release)",
              _mib(rss[2][1] - rss[4][1])],
             [f"RSS growth measured across each version's load: {lr['memory_from']} / {lr['memory_to']}",
              f"{_mib(lr['old_resident_bytes'])} / {_mib(lr['new_resident_bytes'])}"]]))
        out.append(Table(
            f"A long request across the switch back ({lr['model']} {lr['old']} -> {lr['new']}: one request of "
            f"{lr['inputs']} texts of 256 tokens)",
            ["measure", "value"],
            [["answered by", f"{lr['answered_version']} (HTTP {lr['status']}, "
              f"{lr['embedded']} of {lr['inputs']} inputs embedded)"],
             ["request duration s", f"{lr['duration_s']:.2f}"],
             ["seen holding the old version (admin API leases), s before the switch",
              f"{lr['seen_holding_before_switch_s']:.3f}"],
             ["answered, s after the switch", f"{lr['finished_after_switch_s']:.3f}"],
             ["old version released, s after that answer", f"{lr['released_after_answer_s']:.3f}"]],
            ["the new version is loaded as standby first, the long request is sent and seen holding the old "
             "version, then the new one is promoted"]))
    if report.soak:
        sk = report.soak
        rss = sk["rss"]
        durations = [s.seconds for s in sk["swaps"]]
        out.append(Table(
            f"Soak: {cfg.soak} consecutive swaps of each model at {cfg.soak_rate:g} req/s",
            ["measure", "value"],
            [["swaps", str(len(sk["swaps"]))],
             ["failed requests", str(sk["run"].failed)],
             ["RSS after the 2nd round / after the last, MiB",
              f"{_mib(rss[1] if len(rss) > 1 else None)} / {_mib(rss[-1])}"],
             ["growth from the 2nd to the last", "–" if sk["growth"] is None else f"{sk['growth'] * 100:+.1f}% "
              f"(goal within {SOAK_RSS_GOAL * 100:g}%)"],
             ["RSS min / max over the rounds, MiB", f"{_mib(min(rss))} / {_mib(max(rss))}"],
             ["swap request -> switch s, median / max", f"{percentile(durations, 50):.2f} / {max(durations):.2f}"]],
            [f"RSS is sampled once per round (each model swapped once), {RSS_SETTLE_S:g} s after the old "
             "versions are released"]))
    return out


# -- command line ------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench swap", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--packages", type=Path, default=ROOT / "models",
                   help="the default packages (`python -m converters default --out DIR`); the B versions go "
                        f"to DIR/{VERSIONS_DIR}")
    p.add_argument("--seconds", type=float, default=15.0, help="each run's load (15)")
    p.add_argument("--rate", type=float, default=24.0, help="requests/s of the mixed load (24)")
    p.add_argument("--rounds", type=int, default=2,
                   help="pairs of runs, the second pair in the other order (2)")
    p.add_argument("--soak", type=int, default=0, metavar="N", help="also N consecutive swaps of each model (0)")
    p.add_argument("--soak-rate", type=float, default=4.0, help="requests/s during the soak (4)")
    p.add_argument("--record", action="store_true", help=f"append the results to {BENCHMARKS_DOC.relative_to(ROOT)}")
    p.add_argument("--doc", type=Path, default=BENCHMARKS_DOC, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench swap [--seconds S] [--rate R] [--soak N] [--record]`; `python -m bench.swap build
    --packages DIR` builds the B versions (imports torch)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["build"]:
        from converters.versions import build_versions

        b = argparse.ArgumentParser(prog="python -m bench.swap build")
        b.add_argument("--packages", type=Path, required=True)
        build_versions(b.parse_args(argv[1:]).packages / VERSIONS_DIR)
        return 0
    args = _parser().parse_args(argv)
    if args.seconds <= 0 or args.rate <= 0 or args.soak < 0 or args.soak_rate <= 0 or args.rounds < 1:
        print("error: --seconds, --rate, --soak-rate and --rounds must be positive, --soak at least 0",
              file=sys.stderr)
        return 2
    ensure_versions(args.packages)
    models = default_models(args.packages)
    cfg = Config(seconds=args.seconds, rate=args.rate, soak=args.soak, soak_rate=args.soak_rate,
                 rounds=args.rounds)
    conds = conditions(1, 1, {"packages": str(args.packages.resolve().relative_to(ROOT))
                              if args.packages.resolve().is_relative_to(ROOT) else args.packages.name})
    conds["threads"] = ("as models.yaml: minilm-embedding none set (the server's default: the usable CPUs, "
                        "for serving and for verifying a new version alike), sparrow-nano 1")
    conds["server"] = ("--update-watch-seconds 0 (an old version is released once drained), "
                       "--update-drain-seconds 30, policy beside; admin listener on 127.0.0.1")
    conds["load"] = (f"open loop, {cfg.rate:g} req/s alternating embeddings (1-3 sentences) and decisions "
                     f"(a choice, a noul and a score), {cfg.threads} pooled keep-alive client connections; runs of "
                     f"{cfg.seconds:g} s, {cfg.rounds} round(s) (ABBA order), swaps start {cfg.lead_s:g} s in")
    conds.pop("rounds", None)
    conds["versions served"] = "; ".join(f"{m.name}: A {m.a.package.name} ({m.a.variant}), B {m.b.package.name} "
                                         f"({m.b.variant})" for m in models)
    print("\n".join(f"{k}: {v}" for k, v in conds.items()), flush=True)
    foreign = ForeignLoad()
    started = time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-swap-"))
    report = measure(models, args.packages, cfg, log_dir)
    shutil.rmtree(log_dir, ignore_errors=True)
    conds["wall time"] = f"{time.perf_counter() - started:.0f} s"
    conds["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    conds["CPU used by other processes during the run"] = foreign.describe()
    out = tables(report, cfg, models)
    for t in out:
        print("\n" + t.markdown(), flush=True)
    command = "python -m bench swap" + "".join(f" {a}" for a in argv if a != "--record")
    if args.record:
        record(render_run(command, conds, out), args.doc)
        print(f"\nrecorded in {args.doc}")
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
