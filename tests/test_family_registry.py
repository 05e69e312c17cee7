"""Every registered family has a converter, a fixture and a parity test: adding a family is one folder
plus one registry line, and this test names what else it must bring."""

from __future__ import annotations

import converters.__main__ as converter_cli
from edge_runtime.families.registry import FAMILIES
from tests.support.server_harness import ROOT

#: family -> (the converter kinds that write its packages, the test that checks their parity with the
#: source model's own implementation, and a test name in it that does).
EVIDENCE: dict[str, tuple[tuple[str, ...], str, str]] = {
    "encoder": (("embedding", "sequence-classification", "multi-label", "token-classification", "rerank"),
                "test_converters.py", "test_minilm_matches_sentence_transformers"),
    "multimodal-embedding": (("image-text-embedding", "audio-embedding"), "test_multimodal_embeddings.py",
                             "test_image_text_parity_with_transformers"),
    "sparrow": ((), "test_sparrow.py", "test_parity_with_the_numpy_decider"),
    "decision-codes": (("decision-codes",), "test_decision_codes.py", "test_readout_matches_transformers_logits"),
    "decision2": (("decision2", "decision2-source"), "test_decision2.py",
                  "test_pipeline_golden_questions_against_torch"),
    "vela2": (("vela2", "vela2-source"), "test_vela2_package.py", "test_parity_on_unseen_requests"),
    "decision-vision": (("decision-vision",), "test_decision_vision.py",
                        "test_card_records_parity_at_three_sizes_a_video_and_state_once"),
    "decision3": (("decision3", "decision3-source"), "test_decision3.py",
                  "test_conversion_matches_transformers_5"),
}


def test_every_registered_family_has_a_converter_a_fixture_and_a_parity_test() -> None:
    assert set(FAMILIES) == set(EVIDENCE), "a family was added or removed: name its converter and parity test here"
    for family, (kinds, test_file, test_name) in EVIDENCE.items():
        assert all(kind in converter_cli.CONVERTERS for kind in kinds), (family, kinds)
        assert f"def {test_name}(" in (ROOT / "tests" / test_file).read_text(encoding="utf-8"), (family, test_name)
    # sparrow is converted from its PyPI package by `converters default` (its only source)
    assert "sparrow" in (ROOT / "converters" / "default.py").read_text(encoding="utf-8")


def test_every_kind_the_cli_takes_has_one_converter() -> None:
    kinds = set(converter_cli.KIND_CHOICES) | set(converter_cli.SOURCE_FIXTURE_KINDS)
    assert set(converter_cli.CONVERTERS) == kinds
