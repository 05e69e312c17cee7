"""models.yaml limits.max_scan_tokens: the scan budget of windowed inputs, refused where nothing windows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_runtime.config import ModelConfig, ServeConfig
from edge_runtime.runtime import Runtime
from edge_runtime.service import serve
from edge_runtime.timing import Timing


def _runtime(package: Path, **limits: Any) -> Runtime:
    config = ServeConfig(models_file=package / "models.yaml",
                         models=(ModelConfig(name="m", package=package, device="cpu", threads=1, **limits),))
    runtime = Runtime(config)
    runtime.load_all()
    return runtime


def _classify(runtime: Runtime, text: str, options: dict[str, Any]) -> dict[str, Any]:
    body = {"model": "m", "input": [text], "options": {"overflow": "window", **options}}
    return asyncio.run(serve(runtime, "classify", body, Timing()))["results"][0]


def test_max_scan_tokens_bounds_windowed_inputs(fixture_package: Callable[..., Path]) -> None:
    package = fixture_package("sequence-classification")
    text = "word " * 400
    unbounded = _runtime(package)
    bounded = _runtime(package, max_scan_tokens=100)
    try:
        window = {"window": {"tokens": 32, "overlap": 4}}
        short = text[:100]  # well under 100 tokens
        assert "error" not in _classify(unbounded, short, window)
        assert "error" not in _classify(bounded, short, window)
        over = _classify(bounded, text, window)
        assert over["error"] == "scan_budget_exceeded" and "scan budget of 100 tokens" in over["message"]
        # options.max_tokens still sets the request's own scan budget
        own = _classify(bounded, text, {**window, "max_tokens": 128})
        assert "scan budget of 128 tokens" in own["message"]
    finally:
        unbounded.close()
        bounded.close()


def test_max_scan_tokens_is_refused_on_a_family_that_never_windows(tmp_path: Path) -> None:
    from converters.sparrow.export import build_sparrow_package

    runtime = _runtime(build_sparrow_package(tmp_path), max_scan_tokens=100)
    try:
        model = runtime.models["m"]
        assert model.status == "failed" and "max_scan_tokens" in (model.reason or "")
        assert model.attempts == 1  # a setting the family cannot take fails the same way again: no retry
    finally:
        runtime.close()
