"""bench/swap.py: its accounting (which answers count as failed or as answered by the wrong version),
a tiny run of the bench on fixture packages (the report's accounting, never its timings), and, heavy,
the soak of issue 25 over the default models."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import swap
from bench.swap import Config, Sample, Served, Version, account, allowed_versions

TIMELINE = [(100.0, "aaaa0000"), (200.0, "bbbb1111"), (300.0, "aaaa0000")]


def sample(sent: float, received: float, version: str | None, status: int = 200) -> Sample:
    return Sample("emb", 0.0, sent, received, received - sent, status, version, None if status == 200 else "x")


def test_allowed_versions_are_the_one_active_at_send_and_those_activated_before_the_answer() -> None:
    assert allowed_versions(TIMELINE, 150.0, 160.0) == {"aaaa0000"}
    assert allowed_versions(TIMELINE, 199.0, 201.0) == {"aaaa0000", "bbbb1111"}
    assert allowed_versions(TIMELINE, 201.0, 250.0) == {"bbbb1111"}  # sent after the switch: only the new
    assert allowed_versions(TIMELINE, 150.0, 350.0) == {"aaaa0000", "bbbb1111"}
    assert allowed_versions(TIMELINE, 50.0, 60.0) == set()  # before any version was active


def test_account_counts_failures_and_answers_by_a_version_not_active_when_accepted() -> None:
    samples = [sample(150.0, 150.1, "aaaa0000"), sample(199.9, 200.2, "aaaa0000"),
               sample(201.0, 201.1, "aaaa0000"),  # accepted after the switch, answered by the old version
               sample(210.0, 210.1, "bbbb1111"), sample(211.0, 211.1, None, status=503)]
    figures = account("t", samples, {"emb": TIMELINE})
    assert (figures.sent, figures.answered, figures.failed, figures.wrong_version) == (5, 4, 1, 1)
    assert figures.versions_seen == {"emb": ["aaaa0000", "bbbb1111"]}
    assert any("503" in f for f in figures.failures) and any("outside" in f for f in figures.failures)


def test_a_tiny_swap_run_answers_every_request_with_an_active_version(tmp_path: Path) -> None:
    from converters.encoder.fixture import build_fixture

    root = tmp_path / "packages"
    emb_a = build_fixture("embedding", root / "emb-a", seed=0)
    # the same weights under another version, as the real bench's fp32 beside int8: one output space
    # (other weights would be held pinned by the embedding-space guard, not promoted)
    emb_b = build_fixture("embedding", root / "emb-b", seed=0, version="1.0.1")
    from converters.sparrow.export import build_sparrow_package
    from converters.versions import sparrow_repacked

    sparrow_a = build_sparrow_package(root / "sparrow-a")
    sparrow_b = sparrow_repacked(root / "sparrow-b")
    models = [Served("emb", "embeddings", Version(emb_a, "fp32"), Version(emb_b, "fp32"), {"threads": 1}),
              Served("sparrow-nano", "decisions", Version(sparrow_a, "fp32"), Version(sparrow_b, "fp32"),
                     {"threads": 1})]
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    tiny = Config(seconds=2.0, rate=20.0, lead_s=0.3, threads=4, warmup_s=0.5)
    report = swap.measure(models, root, tiny, log_dir, long=False)
    base, during = report.runs
    for run in report.runs:
        assert run.sent > 0 and run.answered == run.sent and run.failed == 0 and run.wrong_version == 0, run
    assert set(base.versions_seen) == {"emb", "sparrow-nano"}
    digests = {m.name: {swap.digest8(m.a.package), swap.digest8(m.b.package)} for m in models}
    assert all(len(d) == 2 for d in digests.values())  # the re-packed sparrow is another digest
    assert {name: set(v) for name, v in base.versions_seen.items()} == \
        {m.name: {swap.digest8(m.a.package)} for m in models}
    assert [(s.name, s.old, s.new) for s in report.swaps] == [
        (m.name, *pair) for m in models
        for pair in ((swap.digest8(m.a.package), swap.digest8(m.b.package)),
                     (swap.digest8(m.b.package), swap.digest8(m.a.package)))]
    assert all(s.released_at is not None and s.released_at >= s.activated_at for s in report.swaps)
    assert set(during.versions_seen) <= set(digests)
    assert report.ok()
    tables = swap.tables(report, tiny, models)
    assert [t.title.split(" ")[0] for t in tables] == ["Open-loop", "Swaps"]


@pytest.mark.heavy
def test_soak_of_100_swaps_of_each_default_model(tmp_path: Path) -> None:
    packages = swap.ROOT / "models"
    swap.ensure_versions(packages)
    models = swap.default_models(packages)
    cfg = Config(seconds=5.0, rate=20.0, soak=100)
    report = swap.measure(models, packages, cfg, tmp_path, long=True)
    assert report.soak is not None
    assert report.soak["run"].failed == 0 and report.soak["run"].wrong_version == 0, report.soak["run"].failures
    assert len(report.soak["swaps"]) == 100 * len(models)
    assert report.soak["growth"] is not None and abs(report.soak["growth"]) <= swap.SOAK_RSS_GOAL, report.soak["rss"]
    assert report.long_request is not None and report.long_request["answered_by_old"], report.long_request
