"""A load that fails for a reason that may pass is tried again with back-off (--load-attempts,
--load-retry-seconds); one that will fail the same way (package, artifact, self-check) is not; and a
model waiting for its retry says so, as loading, while the others serve."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edge_runtime import loading
from edge_runtime.config import ModelConfig, ServeConfig
from edge_runtime.engine.errors import SessionError
from edge_runtime.runtime import Runtime


def _runtime(models: tuple[ModelConfig, ...], attempts: int = 3) -> Runtime:
    return Runtime(ServeConfig(models_file=None, models=models, load_attempts=attempts, load_retry_seconds=0.2))


def _flaky(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[float]:
    """create_session fails ``failures`` times (a device that is not there yet), then works."""
    real, tries = loading.create_session, []

    def create(*args: Any, **kwargs: Any) -> Any:
        tries.append(time.monotonic())
        if len(tries) <= failures:
            raise SessionError("the device is not ready yet")
        return real(*args, **kwargs)

    monkeypatch.setattr(loading, "create_session", create)
    return tries


def test_a_load_that_may_pass_is_retried_with_back_off(
        fixture_package: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    tries = _flaky(monkeypatch, failures=2)
    runtime = _runtime((ModelConfig(name="emb", package=fixture_package("embedding"), device="cpu", threads=1),))
    seen: list[tuple[str, str | None]] = []
    loader = threading.Thread(target=runtime.load_all)
    loader.start()
    while loader.is_alive():
        model = runtime.models["emb"]
        seen.append((model.status, model.reason))
        time.sleep(0.02)
    try:
        model = runtime.models["emb"]
        assert model.status == "ready" and model.attempts == 3 and model.reason is None
        waits = [b - a for a, b in zip(tries, tries[1:])]
        assert waits[0] >= 0.2 and waits[1] >= 0.4  # 0.2 s, then twice as long
        assert ("failed", "the device is not ready yet") not in seen  # never reported failed between tries
        assert any(s == "loading" and r and r.startswith("load attempt 1 of 3 failed") for s, r in seen), seen
    finally:
        runtime.close()


def test_attempts_run_out_and_lasting_failures_are_never_retried(
        fixture_package: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tries = _flaky(monkeypatch, failures=100)
    runtime = _runtime((ModelConfig(name="flaky", package=fixture_package("embedding"), device="cpu", threads=1),
                        ModelConfig(name="absent", package=tmp_path / "absent", device="cpu", threads=1)))
    runtime.load_all()
    try:
        flaky, absent = runtime.models["flaky"], runtime.models["absent"]
        assert (flaky.status, flaky.attempts, len(tries)) == ("failed", 3, 3)
        assert flaky.reason == "the device is not ready yet"
        assert (absent.status, absent.attempts) == ("failed", 1)  # a package error is never retried
    finally:
        runtime.close()


def test_a_stop_ends_the_wait_for_a_retry(fixture_package: Callable[..., Path],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _flaky(monkeypatch, failures=100)
    runtime = Runtime(ServeConfig(models_file=None, load_attempts=5, load_retry_seconds=60.0, models=(
        ModelConfig(name="emb", package=fixture_package("embedding"), device="cpu", threads=1),)))
    loader = threading.Thread(target=runtime.load_all)
    loader.start()
    time.sleep(0.5)
    started = time.monotonic()
    runtime.close()
    loader.join(10)
    assert not loader.is_alive() and time.monotonic() - started < 5
