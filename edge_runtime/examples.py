"""The contract's Decisions and System One example requests, and `python -m edge_runtime examples`.

The command sends every example to a running server (under the model name given) and checks each
answer's shape: the body must validate against openapi.yaml, and every question must be answered
with its own type, or refused in place or as a whole with the contract's fixed reason where the
model does not declare that question type or modality.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from edge_runtime.api.schema import validate_response

DECISIONS_EXAMPLE_1: dict[str, Any] = {
    "model": "Vela-2.0-0.3B",
    "state": "Write a Python function that merges two sorted lists and explain its running time.",
    "questions": {
        "domain": {
            "type": "choice",
            "instructions": "Which domain does this request belong to?",
            "choices": [
                {"key": "code", "description": "Programming"},
                {"key": "math", "description": "Mathematics"},
                {"key": "other"},
            ],
        },
        "reasoning": {"type": "noul", "instructions": "Does answering this request need multi-step reasoning?"},
        "difficulty": {
            "type": "score",
            "instructions": "How difficult is this request?",
            "levels": ["Trivial", "Moderate", "Hard"],
        },
    },
}
"""Decisions, first `POST /v1/decisions`: a Choice, a Noul and a Score about one text state."""

DECISIONS_EXAMPLE_2: dict[str, Any] = {
    "model": "Vela-2.0-0.3B",
    "state": "My card was charged twice and the parcel never arrived. Write to me at jane.doe@example.com.",
    "questions": {
        "problems": {
            "type": "set",
            "instructions": "Which problems does the customer report?",
            "labels": [
                {"key": "billing", "description": "A payment or charge problem"},
                {"key": "shipping", "description": "A delivery problem"},
                {"key": "account", "description": "A login or account problem"},
            ],
        },
        "contacts": {
            "type": "span",
            "instructions": "Find the personal contact details.",
            "labels": [{"key": "EMAIL_ADDRESS", "description": "An email address"}],
        },
    },
}
"""Decisions, second `POST /v1/decisions`: a Set and a Span question."""

DECISIONS_EXAMPLE_BATCH: dict[str, Any] = {
    "model": "Vela-2.0-0.3B",
    "states": {
        "doc_1": {
            "state": {"request": "How long is the refund window?",
                      "candidate": "Refunds are accepted within 30 days of purchase."},
            "questions": {"relevance": {
                "type": "noul",
                "instructions": "Does the candidate passage contain information that helps answer the request?",
            }},
        },
        "doc_2": {
            "state": {"request": "How long is the refund window?",
                      "candidate": "Our offices close on public holidays."},
            "questions": {"relevance": {
                "type": "noul",
                "instructions": "Does the candidate passage contain information that helps answer the request?",
            }},
        },
    },
}
"""Decisions, third `POST /v1/decisions`: a batch, two named entries under `states`."""

SYSTEMONE_EXAMPLE_MEDIA: dict[str, Any] = {
    "model": "d3-turbo",
    "state": "Is the attached receipt complete, and does the clip show it being paid?",
    "images": ["data:image/jpeg;base64,/9j/4AAQSkZJRgABAQ..."],
    "videos": ["data:video/mp4;base64,AAAAIGZ0eXBpc29t..."],
    "questions": {
        "complete": {"type": "noul", "instructions": "Does the receipt show a total, a date and a merchant?"},
        "paid": {"type": "noul", "instructions": "Does the clip show the receipt being paid?"},
    },
}
"""Decisions (images and videos), the `POST /v1/systemone` request with an image and a video."""

SYSTEMONE_EXAMPLE_ASSETS: dict[str, Any] = {
    "model": "d3-lite",
    "state": {"receipt": "<receipt>", "note": "Uploaded by the customer."},
    "assets": {"<receipt>": {"type": "image", "data_base64": "/9j/4AAQSkZJRgABAQ..."}},
    "questions": {
        "complete": {"type": "noul", "instructions": "Does <receipt> show a total, a date and a merchant?"}
    },
}
"""System One compatibility (Assets), the `POST /v1/systemone` request with an image by reference."""

EXAMPLES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("decisions: choice, noul and score", "/v1/decisions", DECISIONS_EXAMPLE_1),
    ("decisions: set and span", "/v1/decisions", DECISIONS_EXAMPLE_2),
    ("decisions: a batch under states", "/v1/decisions", DECISIONS_EXAMPLE_BATCH),
    ("systemone: an image and a video", "/v1/systemone", SYSTEMONE_EXAMPLE_MEDIA),
    ("systemone: an image by reference", "/v1/systemone", SYSTEMONE_EXAMPLE_ASSETS),
)
"""(title, path, request) for every example request of the contract's Decisions section."""


@dataclass(frozen=True)
class ExampleResult:
    title: str
    status: int
    outcome: str  # answered | refused | wrong
    problems: tuple[str, ...]


def _entries(request: dict[str, Any], body: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    if "states" in request:
        states = body.get("states") or {}
        return [(f"states.{name}", entry["questions"], states.get(name) or {})
                for name, entry in request["states"].items()]
    return [("", request["questions"], body)]


def _option_keys(question: dict[str, Any]) -> list[str]:
    if "choices" in question:
        return [c["key"] for c in question["choices"]]
    if "labels" in question:
        return [c["key"] for c in question["labels"]]
    if "levels" in question:
        return [str(i) for i in range(len(question["levels"]))]
    criteria = question.get("criteria")
    if isinstance(criteria, dict):
        return list(criteria)
    return [str(i) for i in range(len(criteria or []))]


def answer_problems(request: dict[str, Any], body: dict[str, Any]) -> list[str]:
    """What is wrong with a 200 answer's shape, question by question (empty when it is right)."""
    problems: list[str] = []
    for where, questions, entry in _entries(request, body):
        answers = entry.get("answers") or {}
        for qid, question in questions.items():
            qtype, at = question["type"], f"{where}.answers.{qid}".lstrip(".")
            answer = answers.get(qid)
            if isinstance(answer, dict) and answer.get("error"):
                if not answer.get("reason"):
                    problems.append(f"{at} failed without a reason")
                continue
            keys = _option_keys(question)
            if qtype in ("set", "span") and not isinstance((entry.get("thresholds") or {}).get(qid), (int, float)):
                problems.append(f"{where}.thresholds.{qid} is missing".lstrip("."))
            if qtype == "set":
                missing = [k for k in keys if (answers.get(f"{qid}.{k}") or {}).get("type") != "noul"]
                selected = ((entry.get("sets") or {}).get(qid) or {}).get("selected")
                if missing or not isinstance(selected, list) or not set(selected) <= set(keys):
                    problems.append(f"{at}: a set answers each label as a noul and lists sets.{qid}.selected")
                continue
            if not isinstance(answer, dict):
                problems.append(f"{at} is missing")
                continue
            expected = "noul" if qtype == "span" else qtype
            if answer.get("type") != expected:
                problems.append(f"{at} has type {answer.get('type')!r}, not {expected!r}")
            elif qtype in ("choice", "score"):
                probabilities = answer.get("probabilities") or {}
                if list(probabilities) != keys or abs(sum(probabilities.values()) - 1.0) > 1e-6:
                    problems.append(f"{at}.probabilities must be keyed {keys} and sum to 1")
                if qtype == "choice" and answer.get("choice") not in keys:
                    problems.append(f"{at}.choice is not one of {keys}")
            elif qtype == "span" and not isinstance((entry.get("spans") or {}).get(qid), list):
                problems.append(f"{where}.spans.{qid} is missing".lstrip("."))
            if expected == "noul" and not 0.0 <= float(answer.get("noul", -1)) <= 1.0:
                problems.append(f"{at}.noul is not a probability")
    return problems


def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, Any]:
    data = json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _reason(body: Any) -> str | None:
    """The fixed reason of a refusal, in the contract's shape or System One's flat one."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("reason"):
            return str(error["reason"])
        if body.get("reason"):
            return str(body["reason"])
    return None


def run_examples(url: str, model: str, timeout: float = 60.0) -> list[ExampleResult]:
    """Send every example (renamed to ``model``) to the server at ``url`` and judge each answer."""
    results = []
    for title, path, example in EXAMPLES:
        request = {**example, "model": model}
        status, body = _post(url.rstrip("/") + path, request, timeout)
        problems: list[str] = []
        try:
            validate_response(path, "post", status, body)
        except Exception as exc:  # any schema mismatch is a wrong answer
            problems.append(f"the body does not match openapi.yaml: {exc}".splitlines()[0])
        if status == 200:
            problems += answer_problems(request, body)
            outcome = "answered"
        elif status in (400, 422) and _reason(body):
            outcome = "refused"
        else:
            problems.append(f"status {status} without a fixed reason")
            outcome = "wrong"
        results.append(ExampleResult(title, status, "wrong" if problems else outcome, tuple(problems)))
    return results


def main(url: str, model: str) -> int:
    """Print one line per example; 0 when every example was answered or refused in the contract's shape."""
    results = run_examples(url, model)
    for r in results:
        print(f"{r.outcome:9} {r.status}  {r.title}")
        for problem in r.problems:
            print(f"          - {problem}")
    return 0 if all(r.outcome != "wrong" for r in results) else 1
