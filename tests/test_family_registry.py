"""Every registered family has a converter, a fixture and a parity test: adding a family is one folder
plus one registry line, and this test names what else it must bring."""

from __future__ import annotations

import re

import converters.__main__ as converter_cli
from edge_runtime.families.registry import CARD_RULES, FAMILIES
from tests.support.server_harness import ROOT

#: family -> its converter's folder under converters/ and the function its fixture is built with.
CONVERTER_FOLDERS: dict[str, tuple[str, str]] = {
    "encoder": ("encoder", "build_fixture_result"),
    "multimodal-embedding": ("multimodal", "build_multimodal_fixture"),
    "sparrow": ("sparrow", "build_sparrow_package"),
    "decision-codes": ("decision_codes", "build_decision_codes_fixture_result"),
    "decision2": ("decision2", "write_decision2_fixture"),
    "vela2": ("vela2", "build_vela2_fixture_result"),
    "decision-vision": ("decision_vision", "build_decision_vision_fixture_result"),
    "decision3": ("decision3", "write_source_fixture"),
    "task-heads": ("task_heads", "build_fixture_result"),
}

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
    "task-heads": (("task-heads", "task-heads-source"), "test_task_heads.py",
                   "test_sequence_head_matches_transformers"),
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


def test_every_family_has_its_converter_folder_with_export_verification_and_fixture() -> None:
    assert set(CONVERTER_FOLDERS) == set(FAMILIES)
    for family, (folder, fixture) in CONVERTER_FOLDERS.items():
        root = ROOT / "converters" / folder
        assert (root / "export.py").is_file(), family
        assert (root / "verify.py").is_file() or folder == "", family  # the encoder's: converters/verify.py
        fixtures = root / ("fixture.py" if (root / "fixture.py").is_file() else "export.py")
        assert f"def {fixture}(" in fixtures.read_text(encoding="utf-8"), (family, fixture)
        # the fixture is what the family's tests build their packages with
        tests = EVIDENCE[family][1]
        users = [t for t in (ROOT / "tests").rglob("*.py") if fixture in t.read_text(encoding="utf-8")]
        assert users, (family, fixture, tests)


def test_packages_names_no_family_and_the_registry_supplies_every_card_rule() -> None:
    """packages/ is a bottom layer: the card rules (kinds, schema, checks, files) come from the registry."""
    surfaces = {surface for kinds in CARD_RULES.kind_surfaces.values() for surface in kinds}  # the contract's
    names = (set(FAMILIES) | set(CARD_RULES.kind_surfaces)) - surfaces
    for path in (ROOT / "edge_runtime" / "packages").iterdir():
        if path.suffix in (".py", ".json"):
            text = path.read_text(encoding="utf-8")
            found = {n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)}
            assert not found, (path.name, sorted(found))
    assert set(CARD_RULES.families) == set(FAMILIES)
    assert all(spec.card.kinds for spec in FAMILIES.values())
