"""The command line the Router runs us with (upstream `vllm-srun serve`'s), and the models files it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge_runtime import cli
from edge_runtime import config as cfg
from edge_runtime.artifacts import locate
from edge_runtime.config import ConfigError, ServeConfig
from edge_runtime.models_file import load_models_file
from tests.support.server_harness import ROOT


def serve_config(tmp_path: Path, *argv: str) -> ServeConfig:
    return cli._serve_config(cli._parser().parse_args(["serve", *argv]))


def router_file(tmp_path: Path, *entries: dict[str, Any]) -> Path:
    path = tmp_path / "w.models.json"
    path.write_text(json.dumps({"models": list(entries)}))
    return path


def test_the_routers_managed_argv_is_taken_as_it_is(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    models = router_file(tmp_path, {"model": str(package), "revision": "", "name": "m", "device": "cpu",
                                    "profile": "exact"})
    config = serve_config(tmp_path, "--models", str(models), "--uds", str(tmp_path / "w.sock"),
                          "--max-request-bytes", "67108864", "--max-bundle-tasks", "1024",
                          "--cache-dir", str(tmp_path / "hub"), "--threads", "2")
    assert config.uds == tmp_path / "w.sock" and config.max_request_bytes == 64 << 20
    assert config.max_bundle_tasks == 1024 and config.threads == 2
    assert config.drain_seconds == cfg.DEFAULT_MANAGED_DRAIN_SECONDS  # inside the Router's 10 s grace
    (m,) = config.models
    assert (m.name, m.artifact, m.variant, m.batching, m.threads) == ("m", str(package), "auto", "exact", 2)
    assert m.source == package and m.missing is None  # not a package: a source to convert
    assert m.package.parent == tmp_path / "hub" / "edge-runtime-packages"


def test_model_arguments_with_revisions_and_names(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "org/name@v1", "--cache-dir", str(tmp_path), "--served-model-name", "n",
                          "--profile", "batching", "--device", "cuda:1")
    (m,) = config.models
    assert (m.name, m.artifact, m.revision, m.device, m.batching) == ("n", "org/name", "v1", "cuda:1", "padded")
    assert m.missing is not None and "org/name@v1 is not in the Hugging Face cache" in m.missing
    assert config.models_file is None
    two = serve_config(tmp_path, "org/a", "org/b@main", "--cache-dir", str(tmp_path))
    assert [(m.name, m.revision) for m in two.models] == [("a", None), ("b", "main")]
    with pytest.raises(ConfigError, match="apply to one MODEL"):
        serve_config(tmp_path, "org/a", "org/b", "--revision", "v1")
    with pytest.raises(ConfigError, match="not both"):
        serve_config(tmp_path, "org/a", "--models", "models.yaml")
    with pytest.raises(ConfigError, match="conflicts with --revision"):
        serve_config(tmp_path, "org/a@v1", "--revision", "v2")
    with pytest.raises(ConfigError, match="claimed twice"):
        serve_config(tmp_path, "org/a", "other/a")


@pytest.mark.parametrize("flag", list(cli.REFUSED_FLAGS))
def test_flags_this_runtime_cannot_honour_are_refused_with_the_reason(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--models", "models.yaml", flag, "1"])
    assert exited.value.code == 2
    assert f"{flag}: edge-runtime cannot honour it: {cli.REFUSED_FLAGS[flag]}" in capsys.readouterr().err


def test_values_this_runtime_cannot_honour_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--engine", "native", "--models", str(ROOT / "models.yaml")]) == 2
    assert "edge-runtime runs ONNX Runtime" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["serve", "--device", "rocm", "org/a"])
    assert "cpu, cuda, cuda:N or auto" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["serve", "--profile", "turbo", "org/a"])
    assert "invalid choice: 'turbo'" in capsys.readouterr().err


def test_models_files_of_both_shapes_in_one_loader(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "card.json").write_text("{}")
    (package / "MANIFEST.json").write_text("{}")
    path = tmp_path / "models.yaml"
    path.write_text(json.dumps({"models": [
        {"name": "ours", "package": "pkg", "variant": "int8", "threads": 4},
        {"model": "pkg", "name": "theirs", "profile": "fp32", "options": {"aliases": ["t"], "threads": 8,
                                                                          "result_cache_entries": 0}},
        {"model": "org/absent", "revision": "0" * 40, "name": "absent", "memory_budget_gib": 0.5},
    ]}))
    defaults = cfg.EntryDefaults(threads_cap=2, cache_dir=tmp_path / "hub")
    ours, theirs, absent = load_models_file(path, defaults)
    assert (ours.package, ours.variant, ours.threads, ours.artifact) == (package, "int8", 2, None)
    assert (theirs.package, theirs.source, theirs.variant, theirs.aliases) == (package, None, "fp32", ("t",))
    assert theirs.threads == 2 and theirs.result_cache_entries == 0
    assert absent.memory_budget_bytes == 2**29 and absent.missing is not None
    for bad, message in (
        ({"model": "a", "profile": "turbo"}, "profile 'turbo' is not known"),
        ({"model": "a", "engine": "native"}, "runs ONNX Runtime"),
        ({"model": "a", "family": "task_heads"}, "family cannot be chosen"),
        ({"model": "a", "device": "npu"}, "cpu, cuda, cuda:N or auto"),
        ({"model": "a", "options": {"package": "x"}}, "options has unknown keys"),
        ({"model": "a", "package": "x"}, "unknown keys"),
        ({"model": "a", "memory_budget_gib": -1}, "memory_budget_gib"),
    ):
        path.write_text(json.dumps({"models": [bad]}))
        with pytest.raises(ConfigError, match=message):
            load_models_file(path, defaults)


def test_repo_ids_resolve_in_the_cache_layout_only(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    snapshot = hub / "models--org--name" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "card.json").write_text("{}")
    (snapshot / "MANIFEST.json").write_text("{}")
    (hub / "models--org--name" / "refs").mkdir()
    (hub / "models--org--name" / "refs" / "main").write_text("a" * 40 + "\n")
    assert locate("org/name", None, tmp_path, hub).package == snapshot
    assert locate("org/name", "a" * 40, tmp_path, hub).package == snapshot
    assert "no ref 'dev'" in (locate("org/name", "dev", tmp_path, hub).missing or "")
    assert "snapshot " + "b" * 40 in (locate("org/name", "b" * 40, tmp_path, hub).missing or "")
    assert "there is no directory" in (locate("./org/name", None, tmp_path, hub).missing or "")
    local = tmp_path / "org" / "name"  # a directory of that name wins over the cache
    local.mkdir(parents=True)
    assert locate("org/name", None, tmp_path, hub).source == local


def test_devices_prints_what_the_router_reads() -> None:
    out = subprocess.run([sys.executable, "-m", "edge_runtime", "devices"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["auto"] in report["devices"] and report["devices"][0] == "cpu"


def test_math_libraries_get_one_thread_before_numpy_loads(tmp_path: Path) -> None:
    """OpenMP/OpenBLAS/MKL read their thread counts once, when numpy loads: the command line sets them to one
    (the heads' matmuls are small; a BLAS pool's spinning threads took the models' cores) before anything
    loads numpy, whatever --threads says; an operator's own setting is kept."""
    code = (
        "import os, sys\n"
        "from edge_runtime import cli\n"
        "assert 'numpy' not in sys.modules, 'numpy loaded with the command line'\n"
        f"code = cli.main(['check', '--threads', '3', '--device', 'cpu', '--models', {str(tmp_path / 'no.yaml')!r}])\n"
        "print(code, *(os.environ[n] for n in cli.THREAD_ENV))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in cli.THREAD_ENV}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "1", "1", "1"]  # the models file is missing (2); every pool gets 1
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "OPENBLAS_NUM_THREADS": "2"},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["2", "1", "2", "1"]
