"""bench.int8_quality's pure helpers: reading STS files and scoring embeddings (no model, no timing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.int8_quality import nearest, quality, read_sts


def test_read_sts_takes_the_official_tab_file_and_a_three_column_csv(tmp_path: Path) -> None:
    official = tmp_path / "sts-dev.csv"
    official.write_text("main-captions\tMSRvid\t2012test\t0000\t5.000\tA man dances.\tA man is dancing.\n"
                        "main-news\theadlines\t2013\t0001\t0.500\tStocks fell.\tIt rained, \"a lot\".\n",
                        encoding="utf-8")
    assert read_sts(official) == [("A man dances.", "A man is dancing.", 5.0),
                                  ("Stocks fell.", 'It rained, "a lot".', 0.5)]
    three = tmp_path / "stsb-en-dev.csv"
    three.write_text('A man dances.,A man is dancing.,5.0\nStocks fell.,"It rained, a lot.",0.5\n', encoding="utf-8")
    assert read_sts(three)[1] == ("Stocks fell.", "It rained, a lot.", 0.5)
    empty = tmp_path / "empty.csv"
    empty.write_text("nothing here\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="no STS pairs"):
        read_sts(empty)


def test_quality_scores_spearman_cosines_and_nearest_neighbours() -> None:
    rng = np.random.default_rng(0)
    texts = [f"t{i}" for i in range(8)]
    ref = rng.normal(size=(8, 16))
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    pairs = [(texts[i], texts[j], float(ref[i] @ ref[j])) for i, j in ((0, 1), (2, 3), (4, 5), (6, 7), (0, 7))]
    index = {t: i for i, t in enumerate(texts)}
    same = quality(ref, ref, nearest(ref), pairs, index)
    assert same["spearman"] == pytest.approx(100.0) and same["nn_agreement"] == 1.0
    assert same["min_cosine"] == pytest.approx(1.0)
    # swapping two rows changes both their cosines to the reference and their neighbours
    moved = ref[[1, 0, 2, 3, 4, 5, 6, 7]]
    q = quality(moved, ref, nearest(ref), pairs, index)
    assert q["min_cosine"] < 1.0 and q["nn_agreement"] < 1.0
    assert np.all(nearest(ref) != np.arange(8))  # never a row's own index
