"""Deployment files: YAML that parses, manifests that agree with each other, the images and the server."""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from edge_runtime.config import ServeConfig
from edge_runtime.models_file import load_models_file

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s" / "base"  # the base; deploy/k8s/kustomization.yaml and the overlays build on it
DOCKERFILES = [ROOT / "Dockerfile.cpu", ROOT / "Dockerfile.gpu"]
# The models file each image carries as /models/models.yaml.
CONTAINER_MODELS = {"Dockerfile.cpu": "models.container.yaml", "Dockerfile.gpu": "models.container-gpu.yaml"}


# -- helpers ------------------------------------------------------------------------------------------

def k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None)
    return docs


def one(kind: str) -> dict[str, Any]:
    found = [d for d in k8s_docs() if d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per logical line: continuations joined, comments and blanks dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    out = []
    for line in logical:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


def image_cmd(path: Path) -> list[str]:
    cmds = [exec_form(rest) for word, rest in dockerfile_instructions(path) if word == "CMD"]
    assert cmds, f"{path.name} has no CMD"
    return cmds[-1]


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def main_container() -> dict[str, Any]:
    containers = one("Deployment")["spec"]["template"]["spec"]["containers"]
    named = [c for c in containers if c["name"] == "edge-runtime"]
    assert len(named) == 1
    return named[0]


def served_get_paths() -> set[str]:
    from edge_runtime.api.app import create_app

    config = ServeConfig(models_file=Path("models.yaml"), models=())
    app = create_app(config)
    return {route.uri for route in app.router.routes if "GET" in route.methods}


def cpu_cores(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


# -- YAML parses --------------------------------------------------------------------------------------

def test_every_yaml_under_deploy_parses_into_mappings() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert files, "deploy/ has no YAML"
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
        assert docs, f"{path} is empty"
        assert all(isinstance(d, dict) for d in docs), path


def test_manifests_have_api_version_kind_and_name() -> None:
    kinds = set()
    for doc in k8s_docs():
        assert doc.get("apiVersion") and doc.get("kind"), doc
        kinds.add(doc["kind"])
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"]
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap"} <= kinds


def test_kustomization_lists_every_manifest() -> None:
    listed = set(one("Kustomization")["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


# -- the Deployment agrees with the server and the image ----------------------------------------------

def test_probes_use_paths_the_server_serves() -> None:
    container = main_container()
    readiness = container["readinessProbe"]["httpGet"]["path"]
    liveness = container["livenessProbe"]["httpGet"]["path"]
    assert readiness == "/health"  # 503 until every model is ready: gates traffic
    assert liveness == "/health/live"  # 200 while loading: restarts only a stalled process
    served = served_get_paths()
    assert readiness in served and liveness in served, served
    metrics_path = one("Deployment")["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
    assert metrics_path in served


def test_container_port_matches_the_image_cmd_and_the_service() -> None:
    cmd = image_cmd(ROOT / "Dockerfile.cpu")
    port = int(flag(cmd, "--port"))
    container = main_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": port}
    assert int(flag(container["args"], "--port")) == port
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in ("http", port)
    annotations = one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port
    service_ports = one("Service")["spec"]["ports"]
    assert [p["targetPort"] for p in service_ports] == ["http"]
    expose = [rest for word, rest in dockerfile_instructions(ROOT / "Dockerfile.cpu") if word == "EXPOSE"]
    assert expose == [str(port)]


def test_deployment_args_are_the_image_cmd_with_the_configmap_models_file() -> None:
    cmd = image_cmd(ROOT / "Dockerfile.cpu")
    args = main_container()["args"]
    models_file = flag(args, "--models")
    key_file = flag(args, "--api-key-file")
    without_keys = [a for a in args if a not in ("--api-key-file", key_file)]
    assert without_keys == [models_file if a == flag(cmd, "--models") else a for a in cmd]
    assert flag(args, "--host") == "0.0.0.0"
    mounts = {m["name"]: m["mountPath"] for m in main_container()["volumeMounts"]}
    # The key file comes from a Secret mounted as a directory (a subPath mount would never see a rotation).
    assert Path(key_file).parent == Path(mounts["api-keys"])
    volumes = {v["name"]: v for v in one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["api-keys"]["secret"]["secretName"] and not volumes["api-keys"]["secret"].get("optional")
    assert all("subPath" not in m for m in main_container()["volumeMounts"] if m["name"] == "api-keys")
    assert Path(models_file).parent == Path(mounts["config"])
    assert Path(models_file).name in one("ConfigMap")["data"]


def test_configmap_models_file_is_valid_and_threads_match_the_cpus(tmp_path: Path) -> None:
    text = one("ConfigMap")["data"]["models.yaml"]
    path = tmp_path / "models.yaml"
    path.write_text(text, encoding="utf-8")
    models = load_models_file(path)
    packages_mount = Path({m["name"]: m["mountPath"] for m in main_container()["volumeMounts"]}["packages"])
    for m in models:
        assert m.package.parent == packages_mount, m
        assert m.threads is not None, f"{m.name}: threads must be explicit in a CPU-limited pod"
    resources = main_container()["resources"]
    requested = cpu_cores(resources["requests"]["cpu"])
    assert cpu_cores(resources["limits"]["cpu"]) == requested  # Guaranteed QoS, no throttled spinning
    assert sum(m.threads or 0 for m in models) == requested


def test_pods_run_as_non_root_with_a_read_only_root_filesystem() -> None:
    spec = one("Deployment")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    for container in spec["containers"] + spec.get("initContainers", []):
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True, container["name"]
        assert ctx["allowPrivilegeEscalation"] is False, container["name"]
    users = {rest for path in DOCKERFILES for word, rest in dockerfile_instructions(path) if word == "USER"}
    assert users == {f"{spec['securityContext']['runAsUser']}:{spec['securityContext']['runAsGroup']}"}


def test_packages_volume_is_filled_by_the_init_container() -> None:
    spec = one("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (init,) = spec["initContainers"]
    target = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["packages"]
    assert init["command"][-1].rstrip("/") == target
    assert "emptyDir" in volumes["packages"] and "configMap" in volumes["config"]
    assert volumes["config"]["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]


def test_service_hpa_and_pdb_select_the_deployment() -> None:
    deployment = one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert one("Service")["spec"]["selector"].items() <= labels.items()
    assert one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    target = one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    hpa = one("HorizontalPodAutoscaler")["spec"]
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]


# -- the Dockerfiles ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_cmd_healthcheck_and_models_file(path: Path) -> None:
    cmd = image_cmd(path)
    assert cmd[:4] == ["python", "-m", "edge_runtime", "serve"]
    assert flag(cmd, "--models") == "/models/models.yaml"
    assert flag(cmd, "--host") == "0.0.0.0"
    health = [rest for word, rest in dockerfile_instructions(path) if word == "HEALTHCHECK"]
    assert len(health) == 1
    probe = exec_form(health[0][health[0].index("CMD") + 3:].strip())
    assert probe[:2] == ["python", "-c"]
    assert f"http://127.0.0.1:{flag(cmd, '--port')}/health/live" in probe[2]
    copies = [rest for word, rest in dockerfile_instructions(path) if word == "COPY"]
    assert f"deploy/{CONTAINER_MODELS[path.name]} /models/models.yaml" in copies


def test_dockerfiles_copy_only_paths_that_exist_and_are_not_ignored() -> None:
    ignored = [
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in DOCKERFILES:
        for word, rest in dockerfile_instructions(path):
            if word != "COPY" or rest.startswith("--from"):
                continue
            *sources, _dest = shlex.split(rest)
            for source in sources:
                assert (ROOT / source).exists(), f"{path.name}: COPY {source} does not exist"
                assert not any(fnmatch.fnmatch(source.rstrip("/"), pat) for pat in ignored), source


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_from_names_a_base_argument_or_an_earlier_stage(path: Path) -> None:
    # buildah (podman build) does not resolve a stage name built from an ARG (`FROM packages-${X}`):
    # it looks for an image of that name. Bases come from ARGs; stages are named literally.
    stages: list[str] = []
    for word, rest in dockerfile_instructions(path):
        if word != "FROM":
            continue
        source, *alias = rest.split()
        assert source in ("${PYTHON_IMAGE}", "${CUDA_IMAGE}") or source in stages, f"{path.name}: FROM {source}"
        if alias:
            assert alias[0].upper() == "AS" and "$" not in alias[1]
            stages.append(alias[1])
    assert "packages" in stages


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_bake_defaults_converts_in_the_packages_stage_with_a_cpu_torch(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "python -m converters default --out /models" in text
    assert 'if [ "${BAKE_DEFAULTS}" = 1 ]' in text and "else mkdir /models" in text
    assert '"torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "${TORCH_INDEX_URL}"}' in text
    assert "torch.version.cuda is None" in text  # a CUDA torch fails the build


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_network_step_mounts_the_package_index_secrets(path: Path) -> None:
    # scripts/build_with_pip_settings.py passes the building machine's pip settings this way; a RUN
    # that installs without them cannot reach the indexes behind a proxy, and a COPY would leave them.
    mounts = "--mount=type=secret,id=pip.conf,target=/etc/pip.conf --mount=type=secret,id=pip-ca,target=/etc/pip-ca.crt"
    runs = [rest for word, rest in dockerfile_instructions(path) if word == "RUN"]
    installing = [r for r in runs if "pip install" in r]
    assert installing
    for run in installing:
        assert run.startswith(mounts), run[:120]
    assert "pip.conf" not in " ".join(rest for word, rest in dockerfile_instructions(path) if word in ("COPY", "ADD"))


@pytest.mark.parametrize("name", sorted(CONTAINER_MODELS.values()))
def test_container_models_files_point_at_the_packages_under_models(name: str) -> None:
    models = load_models_file(DEPLOY / name)
    assert {m.name: str(m.package) for m in models} == {
        "minilm-embedding": "/models/minilm-embedding",
        "sparrow-nano": "/models/sparrow-nano",
    }
    assert all(m.threads for m in models)  # a container's CPUs are few: threads are explicit


def test_cpu_image_serves_the_variants_and_devices_of_models_yaml() -> None:
    repo = {m.name: (m.variant, m.device, m.aliases) for m in load_models_file(ROOT / "models.yaml")}
    image = {m.name: (m.variant, m.device, m.aliases) for m in load_models_file(DEPLOY / "models.container.yaml")}
    assert image == repo


def test_gpu_image_serves_float_variants_that_may_use_cuda() -> None:
    # int8 is built for CPUs (integer GEMMs); the GPU profile serves fp32 and lets CUDA take it.
    models = load_models_file(DEPLOY / "models.container-gpu.yaml")
    assert {m.variant for m in models} == {"fp32"} and {m.device for m in models} == {"auto"}


def _build_args(path: Path) -> dict[str, str]:
    """Every ARG with a default in a Dockerfile, by name (the last one wins, as in a stage that redeclares)."""
    found: dict[str, str] = {}
    for word, rest in dockerfile_instructions(path):
        name, sep, value = rest.partition("=")
        if word == "ARG" and sep:
            found[name] = value
    return found


def test_gpu_image_base_and_onnxruntime_gpu_agree_on_the_cuda_major_version() -> None:
    # onnxruntime-gpu 1.27.0 and later link libcudart.so.13: on a CUDA 12 base the provider cannot
    # load, and the build's provider check (which needs no GPU) would not notice.
    args = _build_args(ROOT / "Dockerfile.gpu")
    image, version = args["CUDA_IMAGE"], args["ORT_GPU_VERSION"]
    repository, _, tag = image.partition(":")
    assert repository == "nvidia/cuda" and "-cudnn-runtime-" in tag, image
    cuda_major = int(tag.split(".")[0])
    ort_minor = tuple(int(x) for x in version.split(".")[:2])
    assert cuda_major == (13 if ort_minor >= (1, 27) else 12), (image, version)
    # Python 3.11 comes from the base's own packages: Ubuntu 22.04 has python3.11, 24.04 does not.
    assert "apt-get install -y --no-install-recommends python3.11" in (ROOT / "Dockerfile.gpu").read_text()
    assert tag.endswith("-ubuntu22.04"), image
    # scripts/images.sh's stand-in names the same CUDA major version; the docs name the image and wheel.
    assert f"localhost/standin/cuda:{cuda_major}-cudnn-runtime-bookworm" in (ROOT / "scripts" / "images.sh").read_text()
    deployment = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    assert f"`{image}`" in deployment and f"onnxruntime-gpu=={version}" in deployment


def test_gpu_image_states_its_onnxruntime_skew_against_the_cpu_pin() -> None:
    # The CPU image installs the project's pin; the GPU image replaces it with onnxruntime-gpu, whose
    # version can differ. The difference must be stated where an operator reads about the image.
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    cpu_pin = pyproject.split('"onnxruntime==', 1)[1].split('"', 1)[0]
    gpu = _build_args(ROOT / "Dockerfile.gpu")["ORT_GPU_VERSION"]
    if gpu != cpu_pin:
        for path in (ROOT / "Dockerfile.gpu", ROOT / "docs" / "deployment.md"):
            text = path.read_text(encoding="utf-8")
            assert gpu in text and cpu_pin in text and "scripts/ort_version_skew.py" in text, path.name


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_takes_edge_runtimes_own_argv_and_any_other_command(path: Path) -> None:
    """The Router's process manager appends `serve --models F --uds S ...` to the command it runs: the
    entrypoint runs edge-runtime's subcommands as they are, and every other command (the CMD,
    Kubernetes' args) as given."""
    entry = [exec_form(rest) for word, rest in dockerfile_instructions(path) if word == "ENTRYPOINT"]
    copies = [rest for word, rest in dockerfile_instructions(path) if word == "COPY"]
    assert entry == [["/usr/local/bin/edge-runtime-entrypoint"]]
    assert "scripts/container-entrypoint.sh /usr/local/bin/edge-runtime-entrypoint" in copies
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    script = str(ROOT / "scripts" / "container-entrypoint.sh")
    devices = subprocess.run(["sh", script, "devices"], env=env, capture_output=True, text=True, timeout=60)
    assert devices.returncode == 0 and json.loads(devices.stdout)["devices"][0] == "cpu", devices.stderr
    other = subprocess.run(["sh", script, "python", "-c", "print(6 * 7)"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert other.stdout.strip() == "42"
