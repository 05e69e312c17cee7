"""The multimodal embedding family's cards: its kinds, its schema (card.schema.json beside this file),
the rules between towers, space, head and limits the schema cannot say, and the files a package holds.

A package holds one graph per tower (text, image, audio). The tower whose graph is model.onnx is
the package's primary graph (its fp32 variant, self-checked by the runtime like any other); the
other towers live under towers/ with their own golden cases, checked by the family at load. Every
tower of a package writes into one space, so a text and an image of one model can be compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_runtime.packages import CARD_FILE, TOKENIZER_FILE, FamilyCard, PackageError, schema_fragment

#: kind -> the surfaces it serves
KINDS: dict[str, tuple[str, ...]] = {"image-text-embedding": ("embeddings",), "audio-embedding": ("embeddings",)}
PRIMARY_GRAPH, PRIMARY_GOLDEN = "model.onnx", "golden.npz"
#: tower -> the limits its card must state
TOWER_LIMITS: dict[str, tuple[str, ...]] = {
    "text": ("max_input_tokens",),
    "image": ("image_max_bytes", "image_source_max_pixels"),
    "audio": ("audio_max_bytes", "audio_max_seconds"),
}
#: tower -> the members it needs beyond the schema's common ones
TOWER_MEMBERS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "image": ("preprocess", "tokens"),
    "audio": ("preprocess", "pooling", "long_audio"),
}


def check_multimodal_card(card: dict[str, Any]) -> None:
    """Raise PackageError (naming card.json) when towers, space, head, variants and limits disagree."""
    def bad(reason: str) -> PackageError:
        return PackageError(CARD_FILE, reason)

    towers: dict[str, Any] = card["towers"]
    space = card["space"]
    if sorted(space["towers"]) != sorted(towers):
        raise bad(f"space.towers {sorted(space['towers'])} must list every tower {sorted(towers)}: "
                  "a package holds one space")
    if sorted(card["modalities"]) != sorted(towers):
        raise bad(f"modalities {sorted(card['modalities'])} must be the towers {sorted(towers)}")
    primary = [name for name, t in towers.items() if t["graph"] == PRIMARY_GRAPH]
    if len(primary) != 1:
        raise bad("exactly one tower must have graph model.onnx (the package's primary graph)")
    graphs = [t["graph"] for t in towers.values()]
    goldens = [t["golden"] for t in towers.values()]
    if len(set(graphs)) != len(graphs) or len(set(goldens)) != len(goldens):
        raise bad("towers must name distinct graphs and golden files")
    if towers[primary[0]]["golden"] != PRIMARY_GOLDEN:
        raise bad("the primary tower's golden file must be golden.npz")
    variants = card["variants"]
    if "fp32" not in variants or variants["fp32"]["file"] != PRIMARY_GRAPH:
        raise bad("a multimodal package has the variant fp32, whose file is model.onnx")
    for variant, entry in variants.items():
        # every other variant has a graph per tower; the primary tower's is the variant's own file
        if variant == "fp32":
            continue
        for name, tower in towers.items():
            own = tower.get("variants", {}).get(variant)
            if own is None:
                raise bad(f"variant {variant} needs towers.{name}.variants.{variant} (every tower has its graph)")
            if (name == primary[0]) != (own["graph"] == entry["file"]):
                raise bad(f"towers.{name}.variants.{variant}.graph must be the variant's file {entry['file']} "
                          "exactly when the tower is the primary one")
            if name == primary[0] and own["golden"] != entry.get("golden", own["golden"]):
                raise bad(f"towers.{name}.variants.{variant}.golden must be the variant's golden {entry['golden']}")
    for name, tower in towers.items():
        extra = sorted(set(tower.get("variants", {})) - set(variants))
        if extra:
            raise bad(f"towers.{name}.variants names {extra}, which are not variants of the package")
    head = card["head"]
    if head["dimension"] not in head["dimensions"] or max(head["dimensions"]) != head["dimension"]:
        raise bad("head.dimensions must contain head.dimension as its largest size")
    for name, tower in towers.items():
        if tower["dimension"] != head["dimension"]:
            raise bad(f"towers.{name}.dimension {tower['dimension']} differs from head.dimension "
                      f"{head['dimension']}: towers of one space give vectors of one size")
        for member in TOWER_MEMBERS[name]:
            if member not in tower:
                raise bad(f"towers.{name} needs {member}")
        for limit in TOWER_LIMITS[name]:
            if limit not in card["limits"]:
                raise bad(f"limits.{limit} is required for the {name} tower")
    audio = towers.get("audio")
    if audio is not None:
        # Whisper encoders: hidden states averaged over the positions that saw sound (positions
        # needed); CLAP: the graph gives the vector (tokens needed, as for images).
        need = "positions" if audio["pooling"] == "mean_real_frames" else "tokens"
        if need not in audio:
            raise bad(f"towers.audio with pooling {audio['pooling']} needs {need}")
        if audio["preprocess"].get("log") not in ("whisper", "clap_db"):
            raise bad("towers.audio.preprocess.log must be whisper or clap_db")


def multimodal_required_files(card: dict[str, Any]) -> dict[str, str]:
    """Files the package must hold: each tower's graph and golden, and tokenizer.json for a text tower."""
    required: dict[str, str] = {}
    for name, tower in card["towers"].items():
        required[tower["graph"]] = f"the graph of the {name} tower"
        required[tower["golden"]] = f"the golden cases of the {name} tower"
        for variant, own in tower.get("variants", {}).items():
            required[own["graph"]] = f"the {variant} graph of the {name} tower"
            required[own["golden"]] = f"the {variant} golden cases of the {name} tower"
    if "text" in card["towers"]:
        required[TOKENIZER_FILE] = "the tokenizer of the text tower"
    return required


def tower_goldens(card: dict[str, Any]) -> list[str]:
    """Every tower's golden file in every variant (the primary tower's are its variants' own too)."""
    return [golden for tower in card["towers"].values()
            for golden in (tower["golden"], *(v["golden"] for v in tower.get("variants", {}).values()))]


CARD = FamilyCard(kinds=KINDS, schema=schema_fragment(Path(__file__).with_name("card.schema.json")),
                  check=check_multimodal_card, files=multimodal_required_files, goldens=tower_goldens)
