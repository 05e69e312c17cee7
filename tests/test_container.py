"""The baked CPU image (scripts/images.sh cpu-defaults) run as an edge site runs it: its own command,
from its own filesystem, as uid 10001, with the root filesystem read-only except the image's declared
volumes (tests/support/container_harness.py says how, and what still differs from `docker run`). Then the
images without packages (CPU, and GPU falling back to the CPU) with a packages directory mounted at
/models, as docs/deployment.md runs them.

Long group: `make test-container` builds the baked image if it is missing and runs this; it needs root
and podman. IMAGE=... names another image built from Dockerfile.cpu with BAKE_DEFAULTS=1; the
mounted-packages runs skip an image that is not built (`make images` builds all three).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.container_harness import Container, image_config, podman
from tests.support.readme import curl_examples
from tests.support.server_harness import ROOT

pytestmark = [pytest.mark.heavy, pytest.mark.container]

IMAGE = os.environ.get("IMAGE", "localhost/edge-runtime:cpu-defaults")
# Images without packages and the models file a site would mount with them.
MOUNTED = {"localhost/edge-runtime:cpu": "models.container.yaml",
           "localhost/edge-runtime:gpu": "models.container-gpu.yaml"}
READY_WITHIN_S = 180.0  # loading, warming and self-checking both default models on 2 shared cores
STOP_WITHIN_S = 30.0  # Docker's default stop timeout is 10 s; Kubernetes' grace period is 30 s
DECISIONS = {"model": "sparrow-nano", "state": "I was charged twice for my order. Please refund me today.",
             "questions": {"billing": {"type": "noul", "instructions": "Is this message about billing?"}}}


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    if os.geteuid() != 0 or not shutil.which("podman") or not shutil.which("unshare"):
        pytest.skip("needs root, podman and util-linux (make test-container)")
    if subprocess.run(["podman", "image", "exists", IMAGE]).returncode != 0:
        pytest.skip(f"{IMAGE} is not built: make images (scripts/images.sh cpu-defaults)")
    return image_config(IMAGE)


@pytest.fixture(scope="module")
def rootfs(config: dict[str, Any]) -> Iterator[Path]:
    path = Path(podman("image", "mount", IMAGE))
    try:
        yield path
    finally:
        podman("image", "unmount", IMAGE)


@pytest.fixture(scope="module")
def container(rootfs: Path, config: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    c = Container(rootfs, config, tmp_path_factory.mktemp("container") / "container.log")
    try:
        yield c
    finally:
        c.close()


def test_the_image_declares_what_the_run_relies_on(config: dict[str, Any]) -> None:
    assert config["User"] == "10001:10001"
    assert config["Cmd"][:4] == ["python", "-m", "edge_runtime", "serve"]
    assert config["WorkingDir"] == "/srv"
    test = config["Healthcheck"]["Test"]  # kept only in Docker's image format (scripts/images.sh)
    assert test[0] == "CMD" and "/health/live" in test[-1]


def test_the_image_carries_no_build_settings(rootfs: Path) -> None:
    # The pip settings and CA bundle were build secrets: mounted for single RUN steps, never written.
    for leftover in ("etc/pip.conf", "etc/pip-ca.crt", "run/secrets", "opt/convert", "src"):
        assert not (rootfs / leftover).exists(), leftover
    assert not list((rootfs / "opt" / "venv").glob("**/torch/__init__.py"))  # torch stayed in the builder


def wait_ready(container: Container) -> tuple[float, set[str]]:
    """Poll until /health is ready: (seconds to the first /health/live 200, /health statuses seen)."""
    first_live = None
    statuses: set[str] = set()
    deadline = container.started + READY_WITHIN_S
    while time.monotonic() < deadline:
        assert container.proc.poll() is None, container.log()
        try:
            if first_live is None and container.request("GET", "/health/live").status_code == 200:
                first_live = time.monotonic() - container.started
            health = container.request("GET", "/health")
        except Exception:  # not listening yet
            time.sleep(0.05)
            continue
        statuses.add(health.json()["status"])
        if health.status_code == 200 and first_live is not None:
            return first_live, statuses
        assert health.status_code in (200, 503), health.text
        if health.status_code == 503:
            assert health.headers["retry-after"] == "5", health.headers
        time.sleep(0.1)
    pytest.fail(f"not ready after {READY_WITHIN_S}s (saw {statuses}):\n{container.log()}")


def test_serves_as_uid_10001_with_a_read_only_root(container: Container) -> None:
    # /health/live answers at once: well inside the HEALTHCHECK's start period, whatever the models do.
    start_period = container.config["Healthcheck"]["StartPeriod"] / 1e9
    first_live, statuses = wait_ready(container)
    assert first_live < start_period, (first_live, start_period)
    assert statuses <= {"starting", "loading", "warming", "ready"}, statuses  # never degraded or failed
    print(f"\n/health/live after {first_live:.2f}s; ready after {time.monotonic() - container.started:.1f}s "
          f"(statuses seen: {sorted(statuses)}); {container.describe()}")

    assert container.uid_of_init() == (10001, 10001)
    # Writes fail everywhere outside the declared volumes, for the server's own user.
    probe = container.exec(["sh", "-c", "touch /srv/probe || touch /tmp/probe || touch /models/probe; echo $?"],
                           timeout=10)
    volumes = container.volumes
    if not volumes:
        assert "Read-only file system" in probe.stderr and probe.stdout.strip() == "1", probe


def test_one_request_of_each_default_model(container: Container) -> None:
    models = {m["id"]: m for m in container.request("GET", "/v1/models").json()["data"]}
    assert {"minilm-embedding", "sparrow-nano"} <= models.keys()
    # The image's models file serves the repository's models.yaml variants (deploy/models.container.yaml).
    assert models["minilm-embedding"]["variant"] == "int8" and models["minilm-embedding"]["device"] == "cpu"

    emb = container.request("POST", "/v1/embeddings",
                            json={"model": "minilm-embedding", "input": ["reset my password", "the station"]})
    assert emb.status_code == 200, emb.text
    vectors = [d["embedding"] for d in emb.json()["data"]]
    assert len(vectors) == 2 and len(vectors[0]) == 384
    assert abs(sum(v * v for v in vectors[0]) - 1.0) < 1e-3

    dec = container.request("POST", "/v1/decisions", json=DECISIONS)
    assert dec.status_code == 200, dec.text
    assert dec.json()["model"] == "sparrow-nano" and "server-timing" in dec.headers


def test_the_image_healthcheck_passes_against_the_running_server(container: Container) -> None:
    hc = container.config["Healthcheck"]
    assert hc["Test"][0] == "CMD"
    result = container.exec(hc["Test"][1:], timeout=hc["Timeout"] / 1e9)
    assert result.returncode == 0, result.stdout + result.stderr


def test_sigterm_stops_pid_1_cleanly(container: Container) -> None:
    # Python as PID 1 ignores SIGTERM unless it handles it: the server must, or `docker stop` waits
    # out its timeout and kills it.
    assert container.request("GET", "/health").status_code == 200
    started = time.monotonic()
    code = container.terminate(STOP_WITHIN_S)
    took = time.monotonic() - started
    log = container.log()
    assert code == 0, f"exit {code}:\n{log}"
    assert "Traceback" not in log, log
    print(f"\nexit 0 {took:.2f}s after SIGTERM")


@pytest.mark.parametrize("image", sorted(MOUNTED), ids=lambda i: i.rsplit(":", 1)[1])
def test_image_without_packages_serves_a_mounted_models_directory(
        image: str, rootfs: Path, tmp_path: Path) -> None:
    if subprocess.run(["podman", "image", "exists", image]).returncode != 0:
        pytest.skip(f"{image} is not built: make images")
    # The site's directory: its models.yaml and the packages (here the baked image's, bound in place).
    site = tmp_path / "models"
    site.mkdir()
    shutil.copy(ROOT / "deploy" / MOUNTED[image], site / "models.yaml")
    binds: list[tuple[Path, str]] = [(site, "/models")]
    for name in ("minilm-embedding", "sparrow-nano"):
        (site / name).mkdir()
        binds.append((rootfs / "models" / name, f"/models/{name}"))
    root = Path(podman("image", "mount", image))
    c = Container(root, image_config(image), tmp_path / "container.log", binds=tuple(binds))
    try:
        wait_ready(c)
        models = {m["id"]: m for m in c.request("GET", "/v1/models").json()["data"]}
        # No GPU here: the GPU image's `device: auto` falls back to the CPU and says so.
        assert {m["device"] for m in models.values()} == {"cpu"}, models
        emb = c.request("POST", "/v1/embeddings", json={"model": "minilm-embedding", "input": "hello"})
        assert emb.status_code == 200, emb.text
        assert c.request("POST", "/v1/decisions", json=DECISIONS).status_code == 200
        assert c.terminate(STOP_WITHIN_S) == 0, c.log()
        print("\n" + "\n".join(line for line in c.log().splitlines() if "ready in" in line or "CUDA" in line))
    finally:
        c.close()
        podman("image", "unmount", image)


# ---- the arm64 image under emulation -------------------------------------------------------------------

ARM64_IMAGE = os.environ.get("ARM64_IMAGE", "localhost/edge-runtime:cpu-defaults-arm64")
#: loading, self-checking and probing both default models under qemu-user: some 250x slower than native
ARM64_READY_WITHIN_S = 1800.0
#: the emulated core: plain NEON without SVE, the class whose rows pad to a multiple of 8
ARM64_CPU = "cortex-a72"


def test_the_arm64_image_serves_the_readme_requests_under_emulation(tmp_path: Path) -> None:
    """scripts/images.sh cpu-defaults-arm64, run as an arm64 edge node would run it, under QEMU: its models
    load with the goldens converted on x86 checked with the pair's tolerance, rows padded to 8, and the
    README's requests are answered. /sys stays empty: under qemu-user onnxruntime's cpuinfo crashes on
    the host's (docs/deployment.md); on a real node the image runs as it is."""
    if os.geteuid() != 0 or not shutil.which("podman") or not shutil.which("unshare"):
        pytest.skip("needs root, podman and util-linux (make test-container)")
    if "enabled" not in _read(Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")):
        pytest.skip("qemu-aarch64 is not registered with binfmt_misc (scripts/qemu_binfmt.sh, as root)")
    if subprocess.run(["podman", "image", "exists", ARM64_IMAGE]).returncode != 0:
        pytest.skip(f"{ARM64_IMAGE} is not built: scripts/images.sh cpu-defaults-arm64 (make images)")
    config = image_config(ARM64_IMAGE)
    assert podman("image", "inspect", "--format", "{{.Architecture}}", ARM64_IMAGE) == "arm64"
    root = Path(podman("image", "mount", ARM64_IMAGE))
    c = Container(root, config, tmp_path / "container.log", env=(f"QEMU_CPU={ARM64_CPU}",), sysfs=False)
    try:
        deadline = time.monotonic() + ARM64_READY_WITHIN_S
        while time.monotonic() < deadline:
            assert c.proc.poll() is None, c.log()
            try:
                if c.request("GET", "/health").status_code == 200:
                    break
            except Exception:  # not listening yet
                pass
            time.sleep(1.0)
        else:
            pytest.fail(f"not ready after {ARM64_READY_WITHIN_S}s:\n{c.log()}")
        ready_s = time.monotonic() - c.started
        models = {m["id"]: m for m in c.request("GET", "/v1/models").json()["data"]}
        for m in models.values():
            check = m["self_check"]
            assert check["status"] == "passed" and check["checked_on"] == "aarch64", check
            assert check["golden_class"] == "x86_64" and check["tolerance"] > 1e-3, check
            assert m["engine_args"]["row_multiple"] == 8 and m["numerics"] == "exact", m["engine_args"]
        assert models["minilm-embedding"]["engine_args"]["grouping"] == "padded"
        for path, body in curl_examples():
            response = c.request("POST", path, json=body)
            assert response.status_code == 200, response.text
            assert response.json()["model"] == body["model"]
        assert c.terminate(STOP_WITHIN_S) == 0, c.log()
        print(f"\narm64 image ({ARM64_CPU}, emulated) ready after {ready_s:.0f}s; "
              + "; ".join(f"{k}: self-check {v['self_check']['max_abs_diff']:.3g}" for k, v in models.items()))
    finally:
        c.close()
        podman("image", "unmount", ARM64_IMAGE)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
