"""Comparison: the sparrow default, our server against its own package's HTTP server, same questions.

Both servers answer the same requests (one state, a Choice, a Noul and a Score question each) with
the same weights: ours is the sparrow-nano package (`python -m converters default`) served by
`python -m edge_runtime serve` on POST /v1/decisions; theirs is `sparrow-decider serve` (its numpy
`Decider` behind http.server's ThreadingHTTPServer, POST /v1/systemone, HTTP/1.0: a connection per
request, probabilities rounded to 4 decimals). The request bodies differ only by our `model` member.

Measured, in interleaved rounds: client wall time of sequential requests (keep-alive where the
server keeps connections), from http.client and from a lean client that parses no header but the
length; throughput sequentially and with a few concurrent clients (a thread and a connection
each); and agreement: our probabilities against the package's numpy `Decider.probs` in this
process (unrounded) and against its server's rounded answers.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lab import Lab
from bench.report import ROOT, Table, fmt_ms, fmt_ratio
from bench.server import HOST, ServerProcess, free_port, terminate
from bench.stats import Summary, median, ratio, summarize
from bench.texts import sentences

PACKAGE = "sparrow-nano"
REQUESTS = 48              # distinct requests, cycled through
SEQUENTIAL_PER_ROUND = 48  # timed sequential requests per contestant and round
CLIENTS = 4                # concurrent clients
CONCURRENT_PER_CLIENT = 24  # requests each concurrent client sends per round
WARMUP = 20
SETTLE_S = 0.3
# Untimed requests before each timed sequential phase, on its own client: after the settle the VM's
# idle vCPU takes ~10 requests to come back to speed (measured on ours, median of 14 rounds: the
# 1st request 3.0 ms, the 2nd 1.8, the 4th 1.45, the 12th 1.1, unsettled 1.1).
ROUND_WARMUP = 8
TARGET_THROUGHPUT_RATIO = 3.0
TARGET_P50_S = 1.0e-3  # issue 13: a 3-question decision over HTTP, p50
READY_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 60.0
OURS, THEIRS = "ours", "package"

# Questions a router asks about a support message: a Choice, a Noul and a Score each, from these.
_CHOICES: list[tuple[str, dict[str, str | None]]] = [
    ("Which team should handle this message?",
     {"billing": "payments, invoices and refunds", "shipping": "parcels and delivery",
      "technical": "apps, logins and errors", "sales": "new orders and pricing"}),
    ("What does the customer want?",
     {"refund": "money back", "information": "an answer to a question",
      "change": "an update to an account or an order", "cancel": "to stop a service", "other": None}),
    ("Which product area is this about?", {"account": "sign-in and settings", "orders": None, "reports": None}),
]
_NOULS: list[tuple[str, dict[str, str] | None]] = [
    ("Is the customer upset?", {"true": "the customer sounds angry or frustrated"}),
    ("Does the message ask for a call back?", None),
    ("Is this about money?", {"false": "nothing about payments", "true": "payments, charges or refunds"}),
]
_SCORES: list[tuple[str, list[str]]] = [
    ("How urgent is this message?", ["not urgent", "this week", "today", "within the hour", "right now"]),
    ("How hard will this be to resolve?", ["trivial", "easy", "moderate", "hard"]),
]


def decision_requests(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` distinct requests (state and questions), the same for a seed, in both servers' format.

    Each state is one to three support-desk sentences; each request asks a Choice (``criteria`` as
    ``{key: description}``), a Noul and a Score (``criteria`` as a list of levels).
    """
    rng = random.Random(seed)
    pool = sentences(max(3 * count, 8), seed=seed + 100)
    out = []
    for i in range(count):
        state = " ".join(pool[(3 * i + k) % len(pool)] for k in range(rng.randint(1, 3)))
        c_text, c_crit = rng.choice(_CHOICES)
        n_text, n_crit = rng.choice(_NOULS)
        s_text, s_crit = rng.choice(_SCORES)
        noul: dict[str, Any] = {"type": "noul", "instructions": n_text}
        if n_crit is not None:
            noul["criteria"] = dict(n_crit)
        out.append({"state": state, "questions": {
            "route": {"type": "choice", "instructions": c_text, "criteria": dict(c_crit)},
            "flag": noul,
            "level": {"type": "score", "instructions": s_text, "criteria": list(s_crit)},
        }})
    return out


def answer_probabilities(answer: Mapping[str, Any]) -> dict[str, float]:
    """The probabilities an answer gives: Choice and Score by option key, Noul as ``{"true": p}``."""
    kind = answer.get("type")
    if kind == "noul" and "noul" in answer:
        return {"true": float(answer["noul"])}
    if kind in ("choice", "score") and isinstance(answer.get("probabilities"), Mapping):
        return {str(k): float(v) for k, v in answer["probabilities"].items()}
    raise ValueError(f"the answer carries no probabilities: {dict(answer)}")


def max_abs_diff(a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]]) -> float:
    """The largest |p_a - p_b| over every question and option; raises when the two differ in shape."""
    if set(a) != set(b):
        raise ValueError(f"different questions: {sorted(a)} vs {sorted(b)}")
    worst = 0.0
    for qid, pa in a.items():
        pb = b[qid]
        if set(pa) != set(pb):
            raise ValueError(f"question {qid}: different options {sorted(pa)} vs {sorted(pb)}")
        worst = max(worst, *(abs(pa[k] - pb[k]) for k in pa))
    return worst


def response_probabilities(body: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Every question's probabilities from a decisions response (``answers``)."""
    answers = body.get("answers")
    if not isinstance(answers, Mapping):
        raise ValueError(f"no answers in the response: {str(body)[:300]}")
    return {qid: answer_probabilities(ans) for qid, ans in answers.items()}


def reference_probabilities(decider: Any, request: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The package's own numpy ``Decider.probs`` for a request, unrounded, keyed as the answers are."""
    out = {}
    for qid, q in request["questions"].items():
        kind, names, _descs, p = decider.probs(request.get("state"), q)
        if kind == "noul":
            out[qid] = {"true": float(p[1])}
        else:
            out[qid] = {str(n): float(x) for n, x in zip(names, p)}
    return out


# ---- HTTP ----------------------------------------------------------------------------------------


class JsonClient:
    """A JSON POST client on one connection (kept alive if the server allows; reopened if not)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection(HOST, port, timeout=HTTP_TIMEOUT_S)

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        for attempt in (0, 1):
            try:
                self.conn.request("POST", path, body=body, headers={"content-type": "application/json"})
                resp = self.conn.getresponse()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()  # a kept-alive connection the server closed meanwhile: retry once
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


class LeanClient:
    """A minimal HTTP/1.1 JSON POST client: the request written as bytes, the response framed by its
    Content-Length (or read to the connection's close), no other header parsed.

    http.client parses every response header with the email package, which costs 0.1-0.3 ms a
    request on this VM: as much as the server's own work. The Router's Go client costs a few tens of
    microseconds, so this client measures what the server costs a caller; http.client stays the
    first measure. Connections are kept alive unless the server answers HTTP/1.0 or closes.
    """

    def __init__(self, port: int = 0, uds: Path | None = None) -> None:
        """A client of 127.0.0.1:``port``, or of the Unix socket ``uds`` (the Router's managed runtimes)."""
        self.port = port
        self.uds = uds
        self.sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        if self.uds is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(HTTP_TIMEOUT_S)
            sock.connect(str(self.uds))
            return sock
        sock = socket.create_connection((HOST, self.port), timeout=HTTP_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return self.request(b"POST", path, body)

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request(b"GET", path, None)

    def request(self, method: bytes, path: str, body: bytes | None) -> tuple[int, bytes]:
        """One request on the kept-alive connection (opened, or opened again once, as needed)."""
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, path.encode(), HOST.encode())
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        request = head + b"\r\n" + (body or b"")
        for attempt in (0, 1):
            reused = self.sock is not None
            if self.sock is None:
                self.sock = self._connect()
            try:
                self.sock.sendall(request)
                return self._response()
            except (ConnectionError, EOFError):
                self.close()  # a kept-alive connection the server closed meanwhile: retry once
                if attempt or not reused:
                    raise
        raise AssertionError("unreachable")

    def _response(self) -> tuple[int, bytes]:
        assert self.sock is not None
        data = b""
        while b"\r\n\r\n" not in data:
            data += self._recv()
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        version, status = lines[0].split(b" ", 2)[:2]
        fields = dict(line.split(b":", 1) for line in lines[1:])
        fields = {k.strip().lower(): v.strip().lower() for k, v in fields.items()}
        closing = version == b"HTTP/1.0" or fields.get(b"connection") == b"close"
        if b"content-length" in fields:
            length = int(fields[b"content-length"])
            while len(rest) < length:
                rest += self._recv()
        else:  # no length: the body ends with the connection
            while chunk := self.sock.recv(65536):
                rest += chunk
            closing = True
        if closing:
            self.close()
        return int(status), rest

    def _recv(self) -> bytes:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("the server closed the connection mid-response")
        return chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


@dataclass
class Target:
    """One contestant: where to POST and how its bodies look."""

    label: str
    port: int
    path: str
    model: str | None  # our `model` member; None for the package's server

    def body(self, request: Mapping[str, Any]) -> bytes:
        payload = dict(request) if self.model is None else {"model": self.model, **request}
        return json.dumps(payload).encode()


def call(client: JsonClient, target: Target, body: bytes) -> dict[str, Any]:
    """One request, decoded; raises on anything but 200."""
    status, _headers, data = client.post(target.path, body)
    if status != 200:
        raise RuntimeError(f"{target.label}: HTTP {status}: {data[:300]!r}")
    return json.loads(data)


def sequential(target: Target, bodies: list[bytes], n: int, offset: int = 0, lean: bool = False,
               warmup: int = 0) -> list[float]:
    """n requests one after the other on one client (http.client, or LeanClient when ``lean``),
    after ``warmup`` untimed ones on the same client; client wall time of each, to the decoded JSON
    body, seconds."""
    client = LeanClient(target.port) if lean else JsonClient(target.port)
    seconds = []
    try:
        for i in range(-warmup, n):
            body = bodies[(offset + i) % len(bodies)]
            started = time.perf_counter()
            if isinstance(client, LeanClient):
                status, data = client.post(target.path, body)
                if status != 200:
                    raise RuntimeError(f"{target.label}: HTTP {status}: {data[:300]!r}")
                json.loads(data)
            else:
                call(client, target, body)
            if i >= 0:
                seconds.append(time.perf_counter() - started)
    finally:
        client.close()
    return seconds


def concurrent(target: Target, bodies: list[bytes], clients: int, per_client: int) -> float:
    """Wall seconds for ``clients`` threads to send ``per_client`` requests each, a connection per thread."""
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)

    def worker(k: int) -> None:
        client = JsonClient(target.port)
        try:
            start.wait()
            for i in range(per_client):
                call(client, target, bodies[(k * per_client + i) % len(bodies)])
        except BaseException as e:  # noqa: BLE001 - reported after the join
            errors.append(e)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    started = time.perf_counter()
    for t in threads:
        t.join(HTTP_TIMEOUT_S * per_client)
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{target.label}: a concurrent client failed: {errors[0]}") from errors[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"{target.label}: concurrent clients did not finish")
    return elapsed


class DeciderServer:
    """`sparrow-decider serve` on 127.0.0.1 in a subprocess, BLAS pools capped at ``threads``."""

    def __init__(self, threads: int, log_dir: Path | None = None) -> None:
        self.port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="bench-sparrow-decider-", dir=log_dir))
        self.log_path = self._dir / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - the child process writes it until stop()
        caps = {k: str(threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sparrow_decider.cli", "serve", "--host", HOST, "--port", str(self.port)],
            cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1", **caps), stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll GET / until it answers; raises with the log when the process exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sparrow-decider serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                conn = http.client.HTTPConnection(HOST, self.port, timeout=5)
                conn.request("GET", "/")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            except (TimeoutError, OSError, http.client.HTTPException):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"sparrow-decider serve not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        terminate(self.proc)
        self._log.close()


# ---- the comparison ------------------------------------------------------------------------------


@dataclass
class Result:
    target: Target
    latency: Summary
    lean_latency: Summary  # the same requests from LeanClient
    sequential_rps: list[float]   # per round
    concurrent_rps: list[float]   # per round
    server_ms: list[float]        # the server's own time per request: Server-Timing total / latency_ms


def _server_times(target: Target, bodies: list[bytes]) -> list[float]:
    """The time each server reports for its own work: our Server-Timing total, their latency_ms."""
    from bench.server_timing import parse_server_timing

    client = JsonClient(target.port)
    out = []
    try:
        for body in bodies:
            status, headers, data = client.post(target.path, body)
            if status != 200:
                raise RuntimeError(f"{target.label}: HTTP {status}: {data[:300]!r}")
            if target.model is None:
                out.append(float(json.loads(data)["latency_ms"]))
            else:
                out.append(parse_server_timing(headers.get("server-timing", ""))["total"])
    finally:
        client.close()
    return out


def shipped_threads() -> int:
    """sparrow-nano's intra-op threads as models.yaml ships it (1): the bench serves what a user runs.

    On this graph a pool costs more than it parallelises (ad hoc, interleaved, 2026-12-04: 1 thread
    answered p50 1.09x faster than 2, answers identical); the package's server is numpy, whose
    BLAS runs these sizes on one thread whatever its cap.
    """
    import yaml

    models = yaml.safe_load((ROOT / "models.yaml").read_text())["models"]
    return int(next(m for m in models if m["name"] == PACKAGE).get("threads", 1))


def run(lab: Lab) -> list[Table]:
    """Start both servers, check they agree, time them in interleaved rounds; three tables."""
    settings = lab.settings
    ours_server = ServerProcess(settings.packages / PACKAGE, "fp32", shipped_threads(), name=PACKAGE,
                                log_dir=lab.log_dir)
    theirs_server = DeciderServer(settings.threads, lab.log_dir)
    try:
        ours_server.wait_ready()
        theirs_server.wait_ready()
        targets = {
            OURS: Target("edge-runtime sparrow-nano (POST /v1/decisions, keep-alive)", ours_server.port,
                         "/v1/decisions", PACKAGE),
            THEIRS: Target("sparrow-decider serve (POST /v1/systemone, HTTP/1.0)", theirs_server.port,
                           "/v1/systemone", None),
        }
        requests = decision_requests(REQUESTS, seed=3)
        bodies = {k: [t.body(r) for r in requests] for k, t in targets.items()}
        agreement = agreement_table(targets, requests)
        for key, target in targets.items():
            sequential(target, bodies[key], WARMUP)
        keys = list(targets)
        lat: dict[str, list[list[float]]] = {k: [] for k in keys}
        lean: dict[str, list[list[float]]] = {k: [] for k in keys}
        seq_rps: dict[str, list[float]] = {k: [] for k in keys}
        con_rps: dict[str, list[float]] = {k: [] for k in keys}
        for r in range(settings.rounds):
            for key in keys[r % 2:] + keys[: r % 2]:
                time.sleep(SETTLE_S)
                seconds = sequential(targets[key], bodies[key], SEQUENTIAL_PER_ROUND, offset=r, warmup=ROUND_WARMUP)
                lat[key].append(seconds)
                seq_rps[key].append(len(seconds) / sum(seconds))
                lean[key].append(sequential(targets[key], bodies[key], SEQUENTIAL_PER_ROUND, offset=r, lean=True,
                                            warmup=ROUND_WARMUP))
                time.sleep(SETTLE_S)
                wall = concurrent(targets[key], bodies[key], CLIENTS, CONCURRENT_PER_CLIENT)
                con_rps[key].append(CLIENTS * CONCURRENT_PER_CLIENT / wall)
        results = {k: Result(targets[k], summarize(lat[k]), summarize(lean[k]), seq_rps[k], con_rps[k],
                             _server_times(targets[k], bodies[k])) for k in keys}
    finally:
        ours_server.stop()
        theirs_server.stop()
    return [latency_table(results, settings.rounds), throughput_table(results), agreement]


def agreement_table(targets: Mapping[str, Target], requests: list[dict[str, Any]]) -> Table:
    """Every request through both servers and the package's numpy Decider; the largest differences."""
    from sparrow_decider import Decider  # numpy only: safe in the harness's process

    decider = Decider.load()
    clients = {k: JsonClient(t.port) for k, t in targets.items()}
    worst = {"ours_numpy": 0.0, "ours_server": 0.0, "server_numpy": 0.0}
    same_choice = 0
    try:
        for request in requests:
            got = {k: call(clients[k], t, t.body(request)) for k, t in targets.items()}
            ours, theirs = response_probabilities(got[OURS]), response_probabilities(got[THEIRS])
            ref = reference_probabilities(decider, request)
            worst["ours_numpy"] = max(worst["ours_numpy"], max_abs_diff(ours, ref))
            worst["ours_server"] = max(worst["ours_server"], max_abs_diff(ours, theirs))
            worst["server_numpy"] = max(worst["server_numpy"], max_abs_diff(theirs, ref))
            same_choice += got[OURS]["answers"]["route"]["choice"] == got[THEIRS]["answers"]["route"]["choice"]
    finally:
        for c in clients.values():
            c.close()
    n = len(requests)
    return Table(
        f"sparrow-nano: agreement on {n} requests ({3 * n} questions: choice, noul, score)",
        ["comparison", "max |Δp|", "note"],
        [["ours vs the package's numpy Decider.probs (in-process, unrounded)", f"{worst['ours_numpy']:.2e}",
          "same weights; ORT's exact Erf vs the package's approximate erf"],
         ["ours vs sparrow-decider serve", f"{worst['ours_server']:.2e}",
          "its server rounds probabilities to 4 decimals (up to 5e-5)"],
         ["sparrow-decider serve vs its numpy Decider", f"{worst['server_numpy']:.2e}", "its rounding alone"],
         ["same chosen option (choice questions)", f"{same_choice}/{n}", ""]],
    )


def latency_table(results: Mapping[str, Result], rounds: int) -> Table:
    ref = results[THEIRS]

    def verdict(p50: float) -> str:
        return "met" if p50 <= TARGET_P50_S else "NOT met"

    rows = [[r.target.label, fmt_ms(r.latency.median), fmt_ms(r.latency.p90),
             f"{fmt_ms(r.latency.round_low)}–{fmt_ms(r.latency.round_high)}",
             fmt_ms(r.lean_latency.median), f"{median(r.server_ms):.3f}",
             fmt_ratio(ratio(ref.latency.median, r.latency.median)),
             fmt_ratio(ratio(ref.latency.round_low, r.latency.round_low)),
             fmt_ratio(ratio(ref.lean_latency.median, r.lean_latency.median)),
             "" if key == THEIRS else
             f"p50 ≤ {fmt_ms(TARGET_P50_S, 1)} ms: http.client {verdict(r.latency.median)}, "
             f"lean client {verdict(r.lean_latency.median)}"]
            for key, r in results.items()]
    return Table(
        f"sparrow-nano: sequential latency, one request of 3 questions ({rounds} rounds × {SEQUENTIAL_PER_ROUND})",
        ["server", "median ms", "p90 ms", "round medians ms (best–worst)", "median ms, lean client",
         "server's own ms (median)", "speed vs package", "speed vs package (best rounds)",
         "speed vs package, lean client", "target"],
        rows,
        ["Client wall time from the request to the decoded JSON body, one client: http.client (the first "
         "columns), then, in the same rounds, LeanClient, which frames responses by Content-Length and "
         "parses no other header (http.client's header parsing costs 0.1-0.3 ms a request here; the "
         "Router's Go client far less). The server's own ms: our Server-Timing total; its `latency_ms` "
         "(Decider.ask alone, no HTTP).",
         f"Each timed phase follows {SETTLE_S:g} s of settling and {ROUND_WARMUP} untimed requests on its client "
         "(an idle vCPU of this VM takes ~10 requests to come back to speed).",
         "The package's server speaks HTTP/1.0 and closes every connection, so each of its requests "
         "includes a TCP connect; ours keeps the connection alive.",
         f"Ours is served as models.yaml ships sparrow-nano: {shipped_threads()} intra-op thread(s) "
         "(a pool costs more than it parallelises on this graph); the package's BLAS is capped at --threads."],
    )


def throughput_table(results: Mapping[str, Result]) -> Table:
    ref_seq, ref_con = median(results[THEIRS].sequential_rps), median(results[THEIRS].concurrent_rps)
    rows = []
    for key, r in results.items():
        seq, con = median(r.sequential_rps), median(r.concurrent_rps)
        target = ""
        if key == OURS:
            met = {name: "met" if (ratio(a, b) or 0.0) >= TARGET_THROUGHPUT_RATIO else "NOT met"
                   for name, a, b in (("sequential", seq, ref_seq), (f"{CLIENTS} clients", con, ref_con))}
            target = f"{TARGET_THROUGHPUT_RATIO:g}x: " + ", ".join(f"{k} {v}" for k, v in met.items())
        rows.append([r.target.label, f"{seq:.0f}", f"{3 * seq:.0f}", fmt_ratio(ratio(seq, ref_seq)),
                     f"{con:.0f}", f"{3 * con:.0f}", fmt_ratio(ratio(con, ref_con)), target])
    return Table(
        "sparrow-nano: throughput (requests of 3 questions)",
        ["server", "sequential req/s", "questions/s", "vs package", f"{CLIENTS} clients req/s", "questions/s",
         "vs package", "target"],
        rows,
        [f"Medians over rounds. Sequential: one client, requests back to back. Concurrent: {CLIENTS} client "
         f"threads in the harness, {CONCURRENT_PER_CLIENT} requests each, a connection each; the clients "
         "share the machine's cores with the server.",
         "The target is the issue's 3x throughput, judged sequentially and with concurrent clients."],
    )
