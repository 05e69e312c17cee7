"""The README's start path: the repository's models.yaml over the default packages answers its curl example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from converters.sparrow.export import build_sparrow_package
from tests.support.readme import curl_examples
from tests.support.server_harness import ROOT, Server, write_models_file


def test_readme_has_exactly_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^    (make \w+)$", setup, flags=re.M)
    assert commands == ["make serve", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_repository_models_yaml_serves_the_readme_example(minilm_package: Path, tmp_path: Path) -> None:
    sparrow = build_sparrow_package(tmp_path / "defaults")
    built = {minilm_package.name: minilm_package, sparrow.name: sparrow}
    entries = yaml.safe_load((ROOT / "models.yaml").read_text())["models"]
    for entry in entries:
        name = Path(entry["package"]).name
        assert name in built, f"models.yaml names {name}, which `converters default` does not build"
        entry["package"] = str(built[name])
    server = Server(write_models_file(tmp_path / "models.yaml", entries))
    try:
        server.wait()
        examples = curl_examples()
        assert examples, "the README shows no curl example"
        for path, body in examples:
            response = server.client.post(path, json=body)
            assert response.status_code == 200, response.text
            assert response.json()["model"] == body["model"]
            if path == "/v1/decisions":  # the default model answers the README's routing question sensibly
                assert response.json()["answers"]["tool"]["choice"] == "refunds"
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["scripts/serve.sh", "scripts/test.sh", "scripts/bootstrap.sh", ".ci/run"])
def test_scripts_are_executable(path: str) -> None:
    assert (ROOT / path).stat().st_mode & 0o111
