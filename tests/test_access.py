"""API keys, TLS, request ids, the access log and model aliases, over real sockets on 127.0.0.1.

One keyed server (sparrow-nano with the alias jev-latest, and an embedding model) is driven with no
key, a wrong key, the right key and a rotated key, by httpx, the official System One SDK and the
openai client; a second one speaks TLS with a certificate made here. Every JSON body is checked
against the contract (openapi.yaml).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from converters.sparrow.export import build_sparrow_package
from edge_runtime.api import auth
from edge_runtime.api.auth import ApiKeys, KeyFileError, bearer_token, needs_key, read_key_file
from edge_runtime.api.request_ids import request_id
from edge_runtime.api.schema import validate_response
from edge_runtime.config import ConfigError
from edge_runtime.models_file import load_models_file
from tests.support.server_harness import ROOT, Server, write_models_file

DECIDER = "sparrow-nano"
KEY = "k-first-8c1f0e5a9b7d4e2f"
ROTATED = "k-second-3a6d9c2b1e0f4a7c"
ENV_KEY = "k-env-5e2a7b9c0d1f3e4a"
WRONG = "k-wrong-0000aaaa1111bbbb"
SECRETS = (KEY, ROTATED, ENV_KEY, WRONG)

STATE = "I was charged twice for my order. Please refund me today."
QUESTIONS = {"billing": {"type": "noul", "instructions": "Is this message about billing?"}}
DECISIONS = {"model": DECIDER, "state": STATE, "questions": QUESTIONS}
SYSTEMONE = {"model": "jev-latest", "state": STATE, "questions": QUESTIONS}

# Every /v1 route, with a body it accepts, and the status the right key gets. No model here serves
# classify or rerank, so those answer 422 unsupported_surface (the contract's code) once let in.
ROUTES: list[tuple[str, str, Any, int]] = [
    ("POST", "/v1/decisions", DECISIONS, 200),
    ("POST", "/v1/systemone", SYSTEMONE, 200),
    ("POST", "/v1/systemone/batch", {"requests": {"a": SYSTEMONE}}, 200),
    ("POST", "/v1/embeddings", {"model": "emb", "input": ["hello"]}, 200),
    ("POST", "/v1/classify", {"input": ["hello"]}, 422),
    ("POST", "/v1/rerank", {"query": "q", "documents": ["d"]}, 422),
    ("POST", "/v1/bundle", {"tasks": [{"id": "e", "embeddings": {"model": "emb", "input": "hi"}}]}, 200),
    ("GET", "/v1/models", None, 200),
]
PUBLIC = ["/health", "/health/live", "/openapi.yaml", "/metrics"]


def call(srv: Server, method: str, path: str, body: Any = None, key: str | None = None,
         headers: dict[str, str] | None = None, client: httpx.Client | None = None) -> httpx.Response:
    """One request with ``key`` as its Bearer token; the body is checked against the contract and
    for every secret this module uses (none may be echoed)."""
    hdrs = dict(headers or {})
    if key is not None:
        hdrs["Authorization"] = f"Bearer {key}"
    if body is not None:
        hdrs["content-type"] = "application/json"
    r = (client or srv.client).request(method, path, content=None if body is None else orjson.dumps(body),
                                       headers=hdrs)
    if r.headers.get("content-type", "").startswith("application/json"):
        validate_response(path, method.lower(), r.status_code, r.json())
    seen = r.text + json.dumps(dict(r.headers))
    assert not any(s in seen for s in SECRETS), f"a key was echoed by {path}"
    return r


def assert_unauthorized(r: httpx.Response, path: str) -> None:
    assert r.status_code == 401, (path, r.status_code, r.text)
    assert r.headers["www-authenticate"].startswith("Bearer")
    body = r.json()
    if path.startswith("/v1/systemone"):
        assert body["detail"]["error_type"] == "authentication_error" and body["code"] == "unauthorized"
    else:
        assert body["error"]["code"] == "unauthorized"


def access_lines(srv: Server) -> list[dict[str, Any]]:
    """The JSON access lines of a server's log so far."""
    out = []
    for line in srv.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


# ---- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models_file(tmp_path_factory: pytest.TempPathFactory, fixture_package: Callable[..., Path]) -> Path:
    root = tmp_path_factory.mktemp("access")
    sparrow = build_sparrow_package(root)
    return write_models_file(root / "models.yaml", [
        {"name": DECIDER, "package": str(sparrow), "device": "cpu", "threads": 1, "aliases": ["jev-latest"]},
        {"name": "emb", "package": str(fixture_package("embedding")), "device": "cpu", "threads": 1},
    ])


@pytest.fixture(scope="module")
def key_file(models_file: Path) -> Path:
    path = models_file.parent / "keys"
    path.write_text(f"# rotated by SIGHUP\n{KEY}\n\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def keyed(models_file: Path, key_file: Path) -> Iterator[Server]:
    srv = Server(models_file, "--api-key-file", str(key_file), env={"EDGE_RUNTIME_API_KEY": ENV_KEY})
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


# ---- keys, unit level -------------------------------------------------------------------------


def test_key_file_reading(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# comment\n  a1 \n\nb2\n", encoding="utf-8")
    assert read_key_file(path) == ("a1", "b2")
    path.write_text("# only a comment\n\n", encoding="utf-8")
    with pytest.raises(KeyFileError, match="holds no key"):
        read_key_file(path)
    path.write_text("has space\n", encoding="utf-8")
    with pytest.raises(KeyFileError) as bad:
        read_key_file(path)
    assert "has space" not in str(bad.value)  # a message names the file, never a key
    with pytest.raises(KeyFileError, match="cannot read"):
        read_key_file(tmp_path / "missing")


def test_reload_keeps_keys_when_the_file_goes_bad(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("one\n", encoding="utf-8")
    keys = ApiKeys(path, env={})
    assert keys.enabled and keys.check("one") and not keys.check("two") and not keys.check(None)
    path.write_text("two\n", encoding="utf-8")
    assert keys.reload() and keys.check("two") and not keys.check("one")
    path.write_text("", encoding="utf-8")
    assert not keys.reload() and keys.check("two")  # an empty file must not open the server
    assert not ApiKeys(None, env={}).enabled
    assert ApiKeys(None, env={"EDGE_RUNTIME_API_KEY": "e"}).check("e")
    with pytest.raises(KeyFileError, match="EDGE_RUNTIME_API_KEY"):
        ApiKeys(None, env={"EDGE_RUNTIME_API_KEY": "two words"})


def test_the_key_check_is_hmac_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ApiKeys(None, env={"EDGE_RUNTIME_API_KEY": "secret"})
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert keys.check("secret") and calls == [(b"secret", b"secret")]
    # The answer is compare_digest's, not an == beside it: a digest that says no refuses the right key.
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: False)
    assert not keys.check("secret")
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: True)
    assert keys.check("anything")


def test_which_paths_need_a_key(tmp_path: Path) -> None:
    keys = ApiKeys(None, env={"EDGE_RUNTIME_API_KEY": "k"})
    assert all(needs_key(p, keys, False) for p in ("/v1/models", "/v1/systemone/batch", "/v1/anything"))
    assert not any(needs_key(p, keys, True) for p in ("/health", "/health/live", "/openapi.yaml", "/v10"))
    assert not needs_key("/metrics", keys, False) and needs_key("/metrics", keys, True)
    assert not needs_key("/v1/models", ApiKeys(None, env={}), True)
    assert bearer_token({"authorization": "bearer abc"}) == "abc"
    assert bearer_token({"authorization": "Basic abc"}) is None and bearer_token({}) is None


def test_request_ids_keep_well_formed_client_values() -> None:
    assert request_id({"x-request-id": "trace-01.A:b_c"}) == "trace-01.A:b_c"
    for bad in ("", "has space", "x" * 129, "new\nline", "é"):
        made = request_id({"x-request-id": bad})
        assert made != bad and len(made) == 32
    assert request_id({}) != request_id({})


# ---- keys over HTTP ---------------------------------------------------------------------------


@pytest.mark.parametrize("method,path,body,ok", ROUTES, ids=[r[1] for r in ROUTES])
def test_every_v1_route_needs_the_key(keyed: Server, method: str, path: str, body: Any, ok: int) -> None:
    assert_unauthorized(call(keyed, method, path, body), path)
    assert_unauthorized(call(keyed, method, path, body, key=WRONG), path)
    assert_unauthorized(call(keyed, method, path, body, headers={"Authorization": KEY}), path)  # no scheme
    for key in (KEY, ENV_KEY):
        r = call(keyed, method, path, body, key=key)
        assert r.status_code == ok, (path, r.text)
    if ok == 422:
        assert r.json()["error"]["code"] == "unsupported_surface"


def test_probes_and_the_contract_stay_public(keyed: Server) -> None:
    for path in PUBLIC:
        r = call(keyed, "GET", path)
        assert r.status_code == 200, path
        assert r.headers["x-request-id"]


def test_a_rotated_key_works_after_sighup(keyed: Server, key_file: Path) -> None:
    key_file.write_text(f"{ROTATED}\n", encoding="utf-8")
    keyed.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while call(keyed, "GET", "/v1/models", key=ROTATED).status_code != 200:
        assert time.monotonic() < deadline, keyed.log()
        time.sleep(0.05)
    for method, path, body, ok in ROUTES:
        assert call(keyed, method, path, body, key=ROTATED).status_code == ok, path
        assert_unauthorized(call(keyed, method, path, body, key=KEY), path)
        assert call(keyed, method, path, body, key=ENV_KEY).status_code == ok, path
    # A reload that finds no key keeps the keys in force rather than opening the server.
    key_file.write_text("\n", encoding="utf-8")
    keyed.proc.send_signal(signal.SIGHUP)
    while "API keys not reloaded" not in keyed.log():
        assert time.monotonic() < deadline, keyed.log()
        time.sleep(0.05)
    assert call(keyed, "GET", "/v1/models", key=ROTATED).status_code == 200
    assert_unauthorized(call(keyed, "GET", "/v1/models"), "/v1/models")
    key_file.write_text(f"{KEY}\n", encoding="utf-8")
    keyed.proc.send_signal(signal.SIGHUP)
    while call(keyed, "GET", "/v1/models", key=KEY).status_code != 200:
        assert time.monotonic() < deadline, keyed.log()
        time.sleep(0.05)


def test_official_sdk_with_a_key_and_its_default_model(keyed: Server) -> None:
    from typesafe_sdk import Noul, RetryPolicy, TypeSafeAuthenticationError, TypeSafeClient

    questions = {"billing": Noul(instructions="Is this message about billing?")}
    with TypeSafeClient(api_key=KEY, base_url=keyed.url, retry=RetryPolicy(max_retries=0),
                        compression=False) as client:
        result = client.system_one(state=STATE, questions=questions)  # the SDK's default model: jev-latest
        assert result.model == DECIDER  # the model's own name, as System One reports the id behind an alias
        raw = result.raw_http_response
        assert result.request_id and result.request_id == raw.headers["x-request-id"]
        assert raw.headers["x-typesafe-request-id"] == result.request_id
        direct = call(keyed, "POST", "/v1/decisions", DECISIONS, key=KEY).json()
        assert result.nouls["billing"].noul == direct["answers"]["billing"]["noul"]
        names = [m.name for m in client.models.list().models]
        assert names == [DECIDER, "jev-latest"]
    with TypeSafeClient(api_key=WRONG, base_url=keyed.url, retry=RetryPolicy(max_retries=0),
                        compression=False) as client:
        with pytest.raises(TypeSafeAuthenticationError) as refused:
            client.system_one(state=STATE, questions=questions)
        assert refused.value.status == 401 and refused.value.request_id


def test_openai_client_with_a_key(keyed: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=KEY, max_retries=0)
    out = client.embeddings.create(model="emb", input=["a short text"])
    assert len(out.data) == 1 and out.model == "emb"
    listed = client.models.list()
    assert {m.id for m in listed.data} == {DECIDER, "emb"}
    wrong = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=WRONG, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.embeddings.create(model="emb", input=["a short text"])
    assert refused.value.status_code == 401


def test_request_ids_and_the_access_log(keyed: Server) -> None:
    mine = call(keyed, "POST", "/v1/decisions", DECISIONS, key=KEY, headers={"X-Request-Id": "client-abc.1"})
    assert mine.headers["x-request-id"] == "client-abc.1" and "x-typesafe-request-id" not in mine.headers
    fresh = call(keyed, "POST", "/v1/systemone", SYSTEMONE, key=KEY, headers={"X-Request-Id": "bad id!"})
    rid = fresh.headers["x-request-id"]
    assert rid != "bad id!" and fresh.headers["x-typesafe-request-id"] == rid
    refused = call(keyed, "POST", "/v1/embeddings", {"model": "emb", "input": "x"}, key=WRONG,
                   headers={"X-Request-Id": "refused-1"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "refused-1"
    missing = call(keyed, "POST", "/v1/embeddings", {"model": "nope", "input": "x"}, key=KEY)
    assert missing.status_code == 404 and missing.headers["x-request-id"]
    deadline = time.monotonic() + 30
    while not {"client-abc.1", rid, "refused-1"} <= {line["id"] for line in access_lines(keyed)}:
        assert time.monotonic() < deadline, keyed.log()
        time.sleep(0.05)
    by_id = {line["id"]: line for line in access_lines(keyed)}
    line = by_id["client-abc.1"]
    assert (line["route"], line["model"], line["status"], line["method"]) == ("/v1/decisions", DECIDER, 200, "POST")
    assert line["bytes_in"] == len(orjson.dumps(DECISIONS)) and line["bytes_out"] == len(mine.content)
    assert set(line["timings"]) == {"parse", "tokenize", "queue", "forward", "post", "serialize", "total"}
    assert line["time"].endswith("+00:00")
    assert (by_id[rid]["model"], by_id[rid]["route"]) == ("jev-latest", "/v1/systemone")
    assert by_id["refused-1"]["status"] == 401
    # A log line about a request names its id.
    assert any("[refused-1]" in text and "no valid API key" in text for text in keyed.log().splitlines())


def test_no_key_ever_reaches_the_log(keyed: Server) -> None:
    for method, path, body, _ in ROUTES:  # every route, once more with each kind of key
        for key in (None, WRONG, KEY):
            call(keyed, method, path, body, key=key)
    keyed.log()  # flush
    text = keyed.log_path.read_text(errors="replace")
    assert "no valid API key" in text  # the refusals were logged...
    assert not any(s in text for s in SECRETS)  # ...and no key, right or wrong, with them


# ---- without keys -------------------------------------------------------------------------------


def test_without_keys_authorization_is_ignored(server: Server) -> None:
    r = call(server, "POST", "/v1/embeddings", {"model": "emb", "input": ["hi"]}, key="anything at all")
    assert r.status_code == 200 and r.headers["x-request-id"]
    assert call(server, "GET", "/v1/models", headers={"Authorization": "Basic Zm9vOmJhcg=="}).status_code == 200


# ---- model aliases ----------------------------------------------------------------------------


def test_aliases_in_models_and_errors(keyed: Server) -> None:
    body = call(keyed, "GET", "/v1/models", key=KEY).json()
    by_id = {m["id"]: m for m in body["data"]}
    assert by_id[DECIDER]["aliases"] == ["jev-latest"] and by_id["emb"]["aliases"] == []
    names = {m["name"]: m for m in body["models"]}
    assert set(names) == {DECIDER, "jev-latest"}
    assert names["jev-latest"]["alias_of"] == DECIDER and "alias_of" not in names[DECIDER]
    assert names["jev-latest"]["card"] == names[DECIDER]["card"]
    via_alias = call(keyed, "POST", "/v1/decisions", {**DECISIONS, "model": "jev-latest"}, key=KEY)
    assert via_alias.status_code == 200 and via_alias.json()["model"] == DECIDER
    direct = call(keyed, "POST", "/v1/decisions", DECISIONS, key=KEY)
    assert via_alias.json()["answers"] == direct.json()["answers"]
    missing = call(keyed, "POST", "/v1/decisions", {**DECISIONS, "model": "jev-preview"}, key=KEY)
    assert missing.status_code == 404
    assert "jev-latest" in missing.json()["error"]["message"] and DECIDER in missing.json()["error"]["message"]


def test_a_name_or_alias_claimed_twice_is_refused(tmp_path: Path) -> None:
    def models(*entries: dict[str, Any]) -> Path:
        return write_models_file(tmp_path / "models.yaml", [{"package": "p", **e} for e in entries])

    with pytest.raises(ConfigError) as twice:
        load_models_file(models({"name": "a", "aliases": ["latest"]}, {"name": "b", "aliases": ["latest"]}))
    assert "'latest'" in str(twice.value) and "'a'" in str(twice.value) and "'b'" in str(twice.value)
    with pytest.raises(ConfigError) as shadow:
        load_models_file(models({"name": "a"}, {"name": "b", "aliases": ["a"]}))
    assert "'a'" in str(shadow.value) and "'b'" in str(shadow.value)
    with pytest.raises(ConfigError, match="aliases"):
        load_models_file(models({"name": "a", "aliases": "latest"}))
    loaded = load_models_file(models({"name": "a", "aliases": ["x", "y"]}, {"name": "b"}))
    assert loaded[0].aliases == ("x", "y") and loaded[1].aliases == ()


def test_a_bad_key_file_stops_the_server(models_file: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n", encoding="utf-8")
    for flags in (["--api-key-file", str(empty)], ["--api-key-file", str(tmp_path / "none")],
                  ["--metrics-require-key"], ["--tls-cert", str(empty)]):
        done = subprocess.run([sys.executable, "-m", "edge_runtime", "serve", "--models", str(models_file), *flags],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "error:" in done.stderr, (flags, done.stderr)


# ---- TLS --------------------------------------------------------------------------------------


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made here (it is also its own trust anchor)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge-runtime test")])
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls(models_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path, Path]]:
    root = tmp_path_factory.mktemp("tls")
    cert, private = make_certificate(root)
    keys = root / "keys"
    keys.write_text(f"{KEY}\n", encoding="utf-8")
    srv = Server(models_file, "--api-key-file", str(keys), "--tls-cert", str(cert), "--tls-key", str(private),
                 "--metrics-require-key", "--no-access-log", tls_ca=cert)
    try:
        srv.wait()
        yield srv, cert, keys
    finally:
        srv.stop()


def rotate(srv: Server, key_file: Path, new_key: str) -> None:
    """Write ``new_key`` as the only key, SIGHUP, and wait until the server takes it."""
    key_file.write_text(f"{new_key}\n", encoding="utf-8")
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while call(srv, "GET", "/v1/models", key=new_key).status_code != 200:
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.05)


def test_tls_with_keys(tls: tuple[Server, Path, Path]) -> None:
    srv, _, key_file = tls
    assert srv.url.startswith("https://")
    for method, path, body, ok in ROUTES:
        assert_unauthorized(call(srv, method, path, body), path)
        assert_unauthorized(call(srv, method, path, body, key=WRONG), path)
        assert call(srv, method, path, body, key=KEY).status_code == ok, path
    assert_unauthorized(call(srv, "GET", "/metrics"), "/metrics")  # --metrics-require-key
    metrics = call(srv, "GET", "/metrics", key=KEY)
    assert metrics.status_code == 200
    # Refused requests are counted, under their route and 401.
    assert 'edge_runtime_requests_total{endpoint="/v1/models",status="401"}' in metrics.text
    assert call(srv, "GET", "/health").status_code == 200
    rotate(srv, key_file, ROTATED)
    try:
        for method, path, body, ok in ROUTES:
            assert call(srv, method, path, body, key=ROTATED).status_code == ok, path
            assert_unauthorized(call(srv, method, path, body, key=KEY), path)
    finally:
        rotate(srv, key_file, KEY)
    with httpx.Client(timeout=10) as plain, pytest.raises(httpx.HTTPError):  # the port speaks TLS only
        plain.get(srv.url.replace("https://", "http://") + "/health").raise_for_status()


def test_tls_with_the_official_clients(tls: tuple[Server, Path, Path]) -> None:
    import ssl

    import httpx2
    import openai
    from typesafe_sdk import Noul, RetryPolicy, TypeSafeAuthenticationError, TypeSafeClient

    srv, cert, _ = tls
    context = ssl.create_default_context(cafile=str(cert))
    questions = {"billing": Noul(instructions="Is this message about billing?")}
    for key in (KEY, WRONG):
        with httpx2.Client(verify=context) as http, TypeSafeClient(
            api_key=key, base_url=srv.url, http_client=http, retry=RetryPolicy(max_retries=0), compression=False,
        ) as client:
            if key == WRONG:
                with pytest.raises(TypeSafeAuthenticationError):
                    client.system_one(state=STATE, questions=questions)
                continue
            result = client.system_one(state=STATE, questions=questions)
            assert result.model == DECIDER and result.request_id
    with openai.DefaultHttpxClient(verify=context) as http:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, http_client=http)
        assert len(client.embeddings.create(model="emb", input=["tls"]).data) == 1


def test_the_access_log_can_be_turned_off(tls: tuple[Server, Path, Path]) -> None:
    srv, _, _ = tls
    r = call(srv, "POST", "/v1/decisions", DECISIONS, key=KEY, headers={"X-Request-Id": "quiet-1"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "quiet-1"
    assert access_lines(srv) == [] and "quiet-1" not in srv.log()


# ---- asset references -------------------------------------------------------------------------


def test_asset_references_are_refused_with_their_own_reasons(keyed: Server) -> None:
    image = {"type": "image", "data_base64": "iVBORw0KGgo="}
    cases = [({"": image}, "asset_reference_empty", 1),
             ({"<" + "r" * 1023 + ">": image}, "asset_reference_too_long", 1024),
             ({f"<{i:03d}{'x' * 1000}>": image for i in range(66)}, "asset_references_too_long", 65536)]
    for assets, reason, limit in cases:
        r = call(keyed, "POST", "/v1/decisions", {**DECISIONS, "assets": assets}, key=KEY)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        assert (r.json()["error"]["reason"], r.json()["error"]["limit"]) == (reason, limit)
        assert "<r" not in r.json()["error"]["message"]  # a fixed reason; the reference itself is not echoed
        s1 = call(keyed, "POST", "/v1/systemone", {**SYSTEMONE, "assets": assets}, key=KEY)
        assert s1.status_code == 400 and (s1.json()["reason"], s1.json()["limit"]) == (reason, limit)


def test_unauthorized_bodies_in_each_schema() -> None:
    from edge_runtime.api.access import unauthorized_response

    for schema in ("vllm-sr/5.0", "vllm-sr/4.0"):
        for path in ("/v1/systemone", "/v1/systemone/batch"):
            r = unauthorized_response(path, schema)
            body = orjson.loads(r.body)
            validate_response(path, "post", 401, body)
            assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
            assert body["detail"]["error_type"] == "authentication_error" and body["code"] == "unauthorized"
            assert ("error" in body) == (schema == "vllm-sr/4.0")
    r = unauthorized_response("/v1/embeddings", "vllm-sr/4.0")
    error = orjson.loads(r.body)["error"]
    assert set(error) == {"code", "message"} and error["code"] == "unauthorized"


def test_errors_outside_the_routes_carry_a_request_id(server: Server) -> None:
    for method, path in (("GET", "/v1/nope"), ("DELETE", "/v1/models"), ("GET", "/nope")):
        r = server.client.request(method, path, headers={"X-Request-Id": "err-1"})
        assert r.status_code in (404, 405) and r.headers["x-request-id"] == "err-1", path
    big = server.client.post("/v1/embeddings", content=b"x" * (2 * 1048576),
                             headers={"content-type": "application/json", "X-Request-Id": "big-1"})
    assert big.status_code == 413 and big.headers["x-request-id"] == "big-1"


def test_a_path_no_route_takes_is_checked_stamped_and_logged(keyed: Server) -> None:
    # Answered by an error handler, not a route: the guard still asks for the key, keeps the id and logs it.
    refused = keyed.client.get("/v1/nope", headers={"X-Request-Id": "nope-1"})
    assert_unauthorized(refused, "/v1/nope")
    assert refused.headers["x-request-id"] == "nope-1"
    missing = keyed.client.get("/v1/nope", headers={"X-Request-Id": "nope-2", "Authorization": f"Bearer {KEY}"})
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "nope-2"
    deadline = time.monotonic() + 30
    while not {"nope-1", "nope-2"} <= {line["id"] for line in access_lines(keyed)}:
        assert time.monotonic() < deadline, keyed.log()
        time.sleep(0.05)
    by_id = {line["id"]: line for line in access_lines(keyed)}
    assert (by_id["nope-1"]["status"], by_id["nope-2"]["status"]) == (401, 404)
    assert by_id["nope-2"]["route"] == "/v1/nope" and by_id["nope-2"]["timings"] == {}


def test_spellings_of_a_v1_path_do_not_skip_the_key(keyed: Server) -> None:
    for path in ("/%761/models", "/v1/models/", "//v1/models", "/v1/./models", "/v1%2Fmodels", "/V1/models"):
        r = keyed.client.get(path)  # no key
        assert r.status_code in (401, 404), (path, r.status_code)
