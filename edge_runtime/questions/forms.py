"""The request forms question types share: keyed lists and objects, text content, thresholds."""

from __future__ import annotations

from typing import Any

from edge_runtime.questions.base import DecisionOption, Json, Malformed


def keyed_object(crit: Any, field: str) -> tuple[DecisionOption, ...]:
    """The criteria form: ``{key: description}`` in request order."""
    if not isinstance(crit, dict):
        raise Malformed(f"{field} must be an object of keys to descriptions")
    out = []
    for key, desc in crit.items():
        check_key(key, field)
        out.append(DecisionOption(key, description(desc, f"{field}[{key!r}]")))
    return tuple(out)


def keyed_list(items: Any, field: str) -> tuple[DecisionOption, ...]:
    """The list form: ``[{key, description?}]`` with distinct keys."""
    if not isinstance(items, list):
        raise Malformed(f"{field} must be a list of {{key, description}}")
    out, seen = [], set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise Malformed(f"{field}[{i}] must be an object {{key, description}}")
        extra = sorted(set(item) - {"key", "description"})
        if extra:
            raise Malformed(f"{field}[{i}] does not take {extra}")
        if "key" not in item:
            raise Malformed(f"{field}[{i}] needs a key")
        key = item["key"]
        check_key(key, f"{field}[{i}].key")
        if key in seen:
            raise Malformed(f"{field}[{i}].key {key!r} is a duplicate")
        seen.add(key)
        out.append(DecisionOption(key, description(item.get("description"), f"{field}[{i}].description")))
    return tuple(out)


def keyed_options(raw: dict[str, Any], list_form: str, qtype: str) -> tuple[tuple[DecisionOption, ...], str]:
    """The options of a question that takes criteria or ``list_form``, and which field gave them."""
    if "criteria" in raw and list_form in raw:
        raise Malformed(f"{qtype} questions take criteria or {list_form}, not both")
    if list_form in raw:
        return keyed_list(raw[list_form], list_form), list_form
    if "criteria" in raw:
        return keyed_object(raw["criteria"], "criteria"), "criteria"
    raise Malformed(f"{qtype} questions need criteria or {list_form}")


def check_key(key: Any, where: str) -> None:
    """Keys are non-blank strings that UTF-8 can encode."""
    if not isinstance(key, str) or not key.strip():
        raise Malformed(f"{where}: keys must be non-blank strings")
    if not encodable(key):
        raise Malformed(f"{where}: a key holds an unpaired surrogate")


def description(value: Any, where: str) -> Json | None:
    """An option's description: None (the option is read by its key) or text content."""
    return None if value is None else text(value, where)


def optional_text(value: Any, where: str) -> Json | None:
    return None if value is None else text(value, where)


def text(value: Any, where: str) -> Json:
    """Text content: a non-blank string, or a non-empty object or array."""
    if isinstance(value, str):
        if not value.strip():
            raise Malformed(f"{where} is blank")
    elif isinstance(value, (dict, list)):
        if not value:
            raise Malformed(f"{where} is empty")
    else:
        raise Malformed(f"{where} must be a string, an object or an array")
    if not json_encodable(value):
        raise Malformed(f"{where} holds an unpaired surrogate")
    return value


def required_instructions(instructions: Json | None, qtype: str) -> Json:
    if instructions is None:
        raise Malformed(f"{qtype} questions need instructions")
    return instructions


def threshold(value: Any) -> float | None:
    """A probability threshold from 0 to 1, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise Malformed("threshold must be a number from 0 to 1")
    return float(value)


# json.loads accepts escaped lone surrogates ("\ud800"); no tokenizer can read them, so they are
# refused while parsing rather than failing later inside a forward.


def encodable(s: str) -> bool:
    """True when UTF-8 can encode ``s`` (no unpaired surrogates)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_encodable(value: Json) -> bool:
    """True when every string (and key) in a decoded JSON value is encodable."""
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, dict):
        return all(encodable(k) and json_encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(json_encodable(v) for v in value)
    return True
