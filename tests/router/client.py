"""The Router's runtime client, re-told in Python: the requests it builds and the checks it applies.

Each function cites the Go function it follows, in vllm-project/semantic-router
``src/semantic-router/pkg/modelservice/`` (client.go f40858d6, surfaces.go 8887e8b9, health.go dc714a07,
group.go 0b2b70f0, cards.go 006e1a87, bundle.go 38e05f84, fusion.go 7db69848, timing.go 98c1e26d,
answer_check.go f9acb6b2) and ``pkg/modelruntime/serving/`` (prepare.go 076351ef, classify.go 928f93d3,
windows.go c7af674f, spans.go bb61440a, validate.go c93b210b, embedding.go 032c990c, relevance.go
270707a0) with ``pkg/modelruntime/tasks`` (ValidateLabelScores, ValidateWindowCoverage,
ValidateRelevanceScores). A check that fails raises ``RouterRefused`` with the error the Router would
return; an item the Router would turn into ``invalid_model_output`` comes back as that error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from tests.router import api
from tests.router.goshapes import DecodeError, decode, decode_vector

#: The contract major this suite speaks: ours (api_version 5.0.0), where the public Router speaks "2"
#: (health.go ``RuntimeAPIMajor``); the rule is the Router's, the number the contract's.
CONTRACT_MAJOR = "5"

#: validate.go ``validateDistribution``: a label distribution sums to one within this.
DISTRIBUTION_TOLERANCE = 1e-3
#: answer_check.go ``probabilitySumTolerance``.
ANSWER_SUM_TOLERANCE = 0.02


class RouterRefused(AssertionError):
    """The Router would not accept the answer: ``kind`` is its error (ErrFailed, ErrRejected,
    ErrCapability, ErrInvalidResult, ErrInputLimit, ...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def finite(*values: float | None) -> bool:
    """surfaces.go ``finite``: no NaN and no infinity (absent values count as zero)."""
    return all(v is None or math.isfinite(v) for v in values)


# -- the exchange ---------------------------------------------------------------------------------------


@dataclass
class Exchange:
    """One HTTP exchange as the generated client parses it (openapi.gen.go ``Parse*Response``)."""

    status: int
    body: Any  # the 200 type, api.ErrorResponse for a listed error status, or None (not parsed)
    headers: httpx.Headers
    raw: Any


def exchange(client: httpx.Client, path: str, body: Any = None) -> Exchange:
    """GET (body None) or POST ``path`` and decode the answer as the generated client does: JSON only
    when Content-Type contains "json" and the status is one the operation lists; a decode error fails
    the call (raised as DecodeError)."""
    if body is None:
        response = client.get(path)
    else:
        response = client.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})
    parsed: Any = None
    raw: Any = None
    listed = api.PARSED_STATUSES[path]
    if "json" in response.headers.get("content-type", "") and response.status_code in listed:
        raw = response.json()
        ok_type = api.BODY_200[path]
        if response.status_code == 200 or path == "/health":
            parsed = decode(ok_type, raw)
        else:
            parsed = decode(api.ErrorResponse, raw)
    return Exchange(response.status_code, parsed, response.headers, raw)


def status_error(status: int, body: api.ErrorBody | None) -> None:
    """surfaces.go ``statusError``: raise the package error a non-200 surface status becomes."""
    if status == 200:
        return
    message = f"{body.code} ({body.message})" if body is not None else str(status)
    if status == 429:
        raise RouterRefused("ErrOverloaded", message)
    if status == 503:
        raise RouterRefused("ErrUnavailable", message)
    if status in (400, 404, 413, 422):
        raise RouterRefused("ErrRejected", message)
    raise RouterRefused("ErrFailed", message)


# -- Server-Timing ----------------------------------------------------------------------------------------

SERVER_PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize")


@dataclass
class Timing:
    """timing.go ``exchangeTiming``: the phases and total read from Server-Timing (milliseconds)."""

    total: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    reported: bool = False


def server_timing(headers: httpx.Headers) -> Timing:
    """timing.go ``timedExchange`` / ``exchangeTiming.read`` / ``serverTimingDuration``."""
    timing = Timing()
    for value in headers.get_list("server-timing"):
        for entry in value.split(","):
            name, _, params = entry.partition(";")
            duration = _duration(params)
            if duration is None:
                continue
            name = name.strip()
            if name == "total":
                timing.total, timing.reported = duration, True
            elif name in SERVER_PHASES:
                timing.phases[name] = duration
    return timing


def _duration(params: str) -> float | None:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() != "dur":
            continue
        try:
            millis = float(value.strip().strip('"'))
        except ValueError:
            return None
        if math.isnan(millis) or millis < 0 or millis > 24 * 3600 * 1000:
            return None
        return millis
    return None


# -- health and cards ---------------------------------------------------------------------------------------


def health_state(health: api.Health, model: str, served: int) -> tuple[str, str]:
    """health.go ``processHealth.stateOf`` (with ``incompatible``): a model's state and reason."""
    major = health.api_version.split(".", 1)[0]
    if major != CONTRACT_MAJOR:
        return "incompatible", f"the runtime serves contract {health.api_version or 'no api_version'}"
    models = health.models or {}
    if model in models:
        return models[model].status, models[model].reason or ""
    if served == 1 and not models:
        return health.status, health.reason or ""
    return "missing", "the runtime does not serve this model"


def ready_models(health: api.Health, cards: list[api.ModelCard], names: list[str]) -> dict[str, bool]:
    """group.go ``refresh``: a model is ready when its state is "ready" and /v1/models has its card."""
    by_id = {card.id: card for card in cards}
    return {name: health_state(health, name, len(names))[0] == "ready" and name in by_id for name in names}


def acquire(card: api.ModelCard) -> None:
    """serving/prepare.go ``Runtime.acquire``: a card without device or dtype binds nothing."""
    if not card.device or not card.dtype:
        raise RouterRefused("ErrCapability", f"the card of {card.id} reports no device or dtype")


def head_of(card: api.ModelCard, name: str) -> api.HeadCard | None:
    """cards.go ``ModelCard.Head``: the named head, or the first one when name is empty."""
    heads = card.heads or []
    if not name:
        return heads[0] if heads else None
    return next((head for head in heads if head.name == name), None)


def head_accepts(head: api.HeadCard, form: str) -> bool:
    """cards.go ``HeadCard.Accepts``: a head that lists no inputs takes text only."""
    return form in head.inputs if head.inputs else form == "text"


def bind_head(card: api.ModelCard, name: str, kind: str, form: str) -> api.HeadCard:
    """serving/prepare.go ``prepareHead``: serves classify, head found, kind equal, form accepted,
    labels declared, device and dtype reported."""
    if "classify" not in (card.surfaces or []):
        raise RouterRefused("ErrCapability", f"{card.id} does not serve classify")
    head = head_of(card, name)
    if head is None:
        raise RouterRefused("ErrCapability", f"{card.id} has no head {name!r}")
    if head.kind != kind or not head_accepts(head, form):
        raise RouterRefused("ErrCapability", f"head {head.name!r} is a {head.kind} head, not a {kind} head over {form}")
    if not head.labels:
        raise RouterRefused("ErrCapability", f"head {head.name!r} declares no labels")
    acquire(card)
    return head


def bind_embedding(card: api.ModelCard, dimension: int = 0, layer: int = 0) -> api.EmbeddingCard:
    """serving/embedding.go ``Runtime.Embedding`` and ``checkView``."""
    if "embeddings" not in (card.surfaces or []) or card.embedding is None:
        raise RouterRefused("ErrCapability", f"{card.id} does not serve embeddings")
    if dimension and dimension not in (card.embedding.dimensions or []):
        served = card.embedding.dimensions
        raise RouterRefused("ErrCapability", f"{card.id} serves dimensions {served}, not {dimension}")
    if layer and layer not in (card.embedding.layers or []):
        raise RouterRefused("ErrCapability", f"{card.id} serves layer exits {card.embedding.layers}, not {layer}")
    acquire(card)
    return card.embedding


def bind_rerank(card: api.ModelCard, layer: int = 0, dimension: int = 0) -> api.RerankExit:
    """serving/relevance.go ``Runtime.Relevance`` and ``pairScorerExit``."""
    if "rerank" not in (card.surfaces or []) or card.rerank is None:
        raise RouterRefused("ErrCapability", f"{card.id} does not serve rerank")
    for exit_ in [card.rerank.default, *(card.rerank.exits or [])]:
        if (layer in (0, exit_.layer)) and (dimension in (0, exit_.dimension)):
            acquire(card)
            return exit_
    raise RouterRefused("ErrCapability", f"{card.id} has no pair-scorer exit at layer {layer}, dimension {dimension}")


def answers_type(card: api.ModelCard, question_type: str) -> bool:
    """cards.go ``ModelCard.Answers``: no question_types means choice, noul and score."""
    if "decisions" not in (card.surfaces or []):
        return False
    if not card.question_types:
        return question_type in ("choice", "noul", "score")
    return question_type in card.question_types


def has_preset(card: api.ModelCard, name: str) -> bool:
    """cards.go ``ModelCard.HasPreset``."""
    return "decisions" in (card.surfaces or []) and name in (card.presets or [])


def scans(card: api.ModelCard) -> bool:
    """client.go ``Client.Models`` / ``scans``: a card with limits.max_scan_tokens > 0 takes
    options.max_tokens and question overflow."""
    return card.limits is not None and (card.limits.max_scan_tokens or 0) > 0


# -- requests the Router builds ----------------------------------------------------------------------------


def omitempty(**fields: Any) -> dict[str, Any]:
    """Go's ``json:",omitempty"`` on value fields: a zero value ("", 0, False, empty) is left out."""
    return {key: value for key, value in fields.items() if value}


def classify_request(model: str, inputs: list[dict[str, str]], head: str = "", overflow: str = "",
                     max_tokens: int = 0, window: tuple[int, int] | None = None,
                     threshold: float | None = None, deadline_ms: float | None = None) -> dict[str, Any]:
    """surfaces.go ``encodeClassify``: always the item-list form; options always present."""
    options: dict[str, Any] = {}
    if deadline_ms is not None:  # pointer fields: sent whenever set
        options["deadline_ms"] = deadline_ms
    options.update(omitempty(max_tokens=max_tokens, overflow=overflow))
    if threshold is not None:
        options["threshold"] = threshold
    if window is not None:
        options["window"] = {"tokens": window[0], "overlap": window[1]}
    return {"input": [omitempty(**item) for item in inputs], "options": options, **omitempty(model=model, head=head)}


def content_part(text: str = "", image_url: str = "", audio_wav: str = "") -> dict[str, Any]:
    """surfaces.go ``encodeEmbed``: one input as a content part (text parts too)."""
    if image_url:
        return {"type": "image_url", "image_url": {"url": image_url}}
    if audio_wav:
        return {"type": "input_audio", "input_audio": {"data": audio_wav, "format": "wav"}}
    return {"type": "text", "text": text}


def embed_request(model: str, parts: list[dict[str, Any]], dimensions: int = 0, layer: int = 0,
                  input_type: str = "", overflow: str = "", max_tokens: int = 0) -> dict[str, Any]:
    """surfaces.go ``encodeEmbed``: content parts, ``encoding_format: base64`` always."""
    return {"input": parts, "encoding_format": "base64", "options": omitempty(max_tokens=max_tokens, overflow=overflow),
            **omitempty(model=model, dimensions=dimensions, layer=layer, input_type=input_type)}


def rerank_request(model: str, query: str, documents: list[str], layer: int = 0, dimensions: int = 0,
                   overflow: str = "", max_tokens: int = 0) -> dict[str, Any]:
    """surfaces.go ``encodeRerank`` (no top_n, no return_documents)."""
    return {"query": query, "documents": documents, "options": omitempty(max_tokens=max_tokens, overflow=overflow),
            **omitempty(model=model, layer=layer, dimensions=dimensions)}


@dataclass
class Question:
    """modelservice ``Question`` (the Router's own form of one question; client.go ``encodeQuestion``)."""

    id: str
    type: str = ""
    instructions: str = ""
    choices: list[tuple[str, str]] = field(default_factory=list)
    levels: list[str] = field(default_factory=list)
    labels: list[tuple[str, str]] = field(default_factory=list)
    preset: str = ""
    threshold: float | None = None
    head: str = ""
    truncate: bool = False


def encode_question(question: Question) -> dict[str, Any]:
    """client.go ``encodeQuestion``: a preset carries only preset, threshold and overflow; choices keep
    ``description: null`` (ChoiceOption.Description has no omitempty); Set and Span labels go as an
    ordered ``criteria`` object (``labelCriteria``)."""
    if question.preset:
        encoded: dict[str, Any] = {"preset": question.preset}
        if question.threshold is not None:
            encoded["threshold"] = question.threshold
        if question.truncate:
            encoded["overflow"] = "truncate"
        return encoded
    encoded = {"type": question.type, "instructions": question.instructions}
    if question.threshold is not None:
        encoded["threshold"] = question.threshold
    if question.labels:
        encoded["criteria"] = {key: (description or None) for key, description in question.labels}
    if question.head:
        encoded["head"] = question.head
    if question.truncate:
        encoded["overflow"] = "truncate"
    if question.choices:
        encoded["choices"] = [{"key": key, "description": description or None} for key, description in question.choices]
    if question.levels:
        encoded["levels"] = list(question.levels)
    return encoded


def decisions_request(model: str, state: str | dict[str, str], questions: list[Question], card: api.ModelCard,
                      max_tokens: int = 0, deadline_ms: float | None = None) -> dict[str, Any]:
    """client.go ``encodeDecisionRequest`` after ``boundedRead``: a model without a scan budget gets
    neither max_tokens nor question overflow."""
    if not scans(card):
        max_tokens = 0
        questions = [Question(**{**q.__dict__, "truncate": False}) for q in questions]
    options: dict[str, Any] = {} if deadline_ms is None else {"deadline_ms": deadline_ms}
    options.update(omitempty(max_tokens=max_tokens))
    return {"state": state, "questions": {q.id: encode_question(q) for q in questions}, "options": options,
            **omitempty(model=model)}


# -- classify answers ------------------------------------------------------------------------------------------


def decode_classify(body: api.ClassifyResponse) -> list[api.ClassifyResult]:
    """surfaces.go ``decodeClassify``: a result holding a non-finite value becomes invalid_model_output."""
    out = []
    for result in body.results or []:
        if result.error is not None:
            out.append(result)
            continue
        values = [*(result.probabilities or []), *(result.scores or [])]
        values += [span.probability for span in result.spans or []]
        for window in result.windows or []:
            values += [*(window.probabilities or []), *(window.scores or [])]
        if not finite(*values):
            result = api.ClassifyResult(index=result.index, error="invalid_model_output")
        out.append(result)
    return out


def check_classify_results(body: api.ClassifyResponse, inputs: int, head: api.HeadCard) -> list[api.ClassifyResult]:
    """fusion.go ``splitClassify`` (one result per input, indices in range, each once) and serving/classify.go
    ``Runtime.classify`` (labels equal the prepared head's, in order); results in input order."""
    if body.labels != head.labels:
        raise RouterRefused("ErrInvalidResult", f"labels {body.labels} differ from the head's {head.labels}")
    results = decode_classify(body)
    if len(results) != inputs or sorted(r.index for r in results) != list(range(inputs)):
        raise RouterRefused("ErrFailed", "classify response does not match its inputs")
    return sorted(results, key=lambda r: r.index)


def check_distribution(values: list[float] | None, labels: int) -> None:
    """serving/validate.go ``validateDistribution``: non-empty, each in [0, 1], sum within 1e-3 of one."""
    if not values or len(values) != labels:
        raise RouterRefused("ErrInvalidResult", f"label distribution {values} is not one per label")
    if any(not (0.0 <= p <= 1.0) for p in values) or abs(sum(values) - 1.0) > DISTRIBUTION_TOLERANCE:
        raise RouterRefused("ErrInvalidResult", f"label distribution {values} is not a distribution")


def check_scores(values: list[float] | None, labels: int) -> None:
    """tasks ``ValidateLabelScores``: non-empty, each finite and in [0, 1]."""
    if not values or len(values) != labels or any(not (0.0 <= s <= 1.0) for s in values):
        raise RouterRefused("ErrInvalidResult", f"label scores {values} are not one probability per label")


def check_spans(text: str, spans: list[api.Span] | None) -> None:
    """serving/spans.go ``byteSpans`` and validate.go ``validateSpans``: code-point offsets inside the text,
    span text equal to them, ordered and non-overlapping, labelled, probability in [0, 1]."""
    previous_end = 0
    for span in spans or []:
        if not (0 <= span.start < span.end <= len(text)) or text[span.start:span.end] != span.text:
            raise RouterRefused("ErrInvalidResult", f"span {span} does not match its input range")
        if span.start < previous_end or not span.label or not (0.0 <= span.probability <= 1.0):
            raise RouterRefused("ErrInvalidResult", f"span {span} overlaps, has no label or no probability")
        previous_end = span.end


def check_window_coverage(result: api.ClassifyResult) -> None:
    """tasks ``ValidateWindowCoverage`` over serving/windows.go's windows: complete, ordered, gap-free."""
    windows = result.windows or []
    usage = result.input
    content = windows[-1].end if windows else 0
    if not windows or usage is None or usage.truncated or usage.tokens != usage.processed_tokens \
            or usage.tokens < content:
        raise RouterRefused("ErrInvalidResult", "window result does not declare complete input coverage")
    start = end = 0
    for i, window in enumerate(windows):
        if window.start < 0 or window.end < window.start or window.end > content or (i == 0 and window.start != 0) \
                or window.start > end or (i > 0 and (window.start <= start or window.end <= end)):
            raise RouterRefused("ErrInvalidResult", f"window offsets invalid or leave a gap at {i}")
        start, end = window.start, window.end


ITEM_ERRORS = {"max_length_exceeded": "ErrInputLimit", "scan_budget_exceeded": "ErrScanBudget",
               "invalid_input": "ErrInvalidInput", "invalid_model_output": "ErrInvalidResult",
               "deadline_exceeded": "DeadlineExceeded", "unavailable": "ErrUnavailable"}


def item_error(code: str) -> str:
    """serving/classify.go ``itemError``: the binding error an item code becomes (others: ErrFailed)."""
    return ITEM_ERRORS.get(code, "ErrFailed")


# -- embeddings and rerank answers ---------------------------------------------------------------------------


@dataclass
class Embedded:
    """surfaces.go ``EmbedResponse``: one vector, usage and error per input, in input order."""

    vectors: list[list[float] | None]
    inputs: list[api.InputUsage | None]
    errors: list[str]


def decode_embed(body: api.EmbeddingsResponse) -> Embedded:
    """surfaces.go ``decodeEmbed``: index in range, an error or a vector per item (decodeVector)."""
    data = body.data or []
    out = Embedded([None] * len(data), [None] * len(data), [""] * len(data))
    for item in data:
        if not 0 <= item.index < len(data):
            raise RouterRefused("ErrFailed", f"embedding index {item.index} is out of range")
        out.inputs[item.index] = item.input
        if item.error is not None:
            out.errors[item.index] = item.error
            continue
        if item.embedding is None:
            raise RouterRefused("ErrFailed", f"embedding {item.index} has no vector")
        try:
            out.vectors[item.index] = decode_vector(item.embedding)
        except DecodeError as exc:
            raise RouterRefused("ErrFailed", str(exc)) from exc
    return out


def check_embeddings(embedded: Embedded, inputs: int, dimension: int = 0, full_input: bool = False) -> None:
    """serving/embedding.go ``embeddingResults`` and ``validateEmbeddingResults`` for a call with no failed item."""
    if len(embedded.vectors) != inputs:
        raise RouterRefused("ErrInvalidResult", f"{len(embedded.vectors)} embeddings for {inputs} inputs")
    for i, vector in enumerate(embedded.vectors):
        if embedded.errors[i]:
            raise RouterRefused(item_error(embedded.errors[i]), embedded.errors[i])
        assert vector is not None
        if dimension and len(vector) != dimension:
            raise RouterRefused("ErrInvalidResult", f"embedding dimension {len(vector)} differs from {dimension}")
        usage = embedded.inputs[i]
        if full_input:
            if usage is None:
                raise RouterRefused("ErrCapability", "embedding response omitted input coverage")
            if usage.tokens_lower_bound:
                raise RouterRefused("ErrInputLimit", "embedding token count is only a lower bound")
            if usage.truncated or usage.processed_tokens != usage.tokens:
                raise RouterRefused("ErrInputLimit", "embedding requires complete input coverage")
            if usage.tokens <= 0:
                raise RouterRefused("ErrCapability", "embedding response omitted token counts")


def decode_rerank(body: api.RerankResponse, documents: int) -> list[api.RerankResult]:
    """surfaces.go ``decodeRerank``: every document answered once; no finite logit is invalid_model_output."""
    seen: list[api.RerankResult | None] = [None] * documents
    for result in body.results or []:
        if not 0 <= result.index < documents or seen[result.index] is not None:
            raise RouterRefused("ErrFailed", f"rerank result index {result.index} is invalid")
        if result.error is None and (result.logit is None or not finite(result.logit)):
            result = api.RerankResult(index=result.index, input=result.input, error="invalid_model_output")
        seen[result.index] = result
    if any(r is None for r in seen):
        raise RouterRefused("ErrFailed", "a rerank result is missing")
    return [r for r in seen if r is not None]


def check_relevance(results: list[api.RerankResult]) -> None:
    """serving/relevance.go ``rerankPairs`` and tasks ``ValidateRelevanceScores``."""
    for result in results:
        if result.error:
            raise RouterRefused(item_error(result.error), result.error)
        usage = result.input
        if usage is None or usage.tokens <= 0 or usage.tokens != usage.processed_tokens or usage.truncated:
            raise RouterRefused("ErrInvalidResult", "relevance scoring requires complete paired input usage")


# -- decisions answers ------------------------------------------------------------------------------------------


@dataclass
class RouterAnswer:
    """modelservice ``Answer``: what the Router keeps of one question's answer."""

    type: str = ""
    error: str = ""
    choice: str = ""
    noul: float = 0.0
    score: float = 0.0
    confidence: float = 0.0
    threshold: float = 0.0
    probabilities: dict[str, float] = field(default_factory=dict)
    selected: list[str] = field(default_factory=list)
    spans: list[api.Span] = field(default_factory=list)
    head: str = ""


def _decode_answer(answer: api.Answer) -> RouterAnswer:
    """client.go ``decodeAnswer``."""
    out = RouterAnswer(type=answer.type or "")
    if answer.error is not None:
        out.error = answer.error
        return out
    out.choice = answer.choice or ""
    out.noul, out.score, out.confidence = answer.noul or 0.0, answer.score or 0.0, answer.confidence or 0.0
    out.probabilities = dict(answer.probabilities or {})
    return _checked(out)


def _checked(answer: RouterAnswer) -> RouterAnswer:
    """client.go ``checkedAnswer`` / ``finiteAnswer``."""
    values = [answer.noul, answer.score, answer.confidence, answer.threshold, *answer.probabilities.values()]
    values += [span.probability for span in answer.spans]
    return answer if finite(*values) else RouterAnswer(type=answer.type, error="invalid_model_output")


def decode_answers(body: api.DecisionResponse | api.DecisionStateResponse,
                   questions: list[Question]) -> dict[str, RouterAnswer]:
    """client.go ``decodeResponse`` / ``decodeQuestionAnswer``: Set answers from ``sets``, Span answers from
    ``spans`` plus their Noul, the rest from ``answers``; a missing set/span answer is invalid_model_output."""
    out: dict[str, RouterAnswer] = {}
    answers = body.answers or {}
    for question in questions:
        answer = answers.get(question.id)
        if answer is not None and answer.error is not None:
            out[question.id] = _decode_answer(answer)
            continue
        threshold = (body.thresholds or {}).get(question.id, 0.0)
        if question.id in (body.sets or {}):
            sa = (body.sets or {})[question.id]
            out[question.id] = _checked(RouterAnswer(type="set", probabilities=dict(sa.probabilities or {}),
                                                     selected=list(sa.selected or []), threshold=threshold))
            continue
        if question.id in (body.spans or {}) and answer is not None:
            decoded = _decode_answer(answer)
            decoded.type = "span"
            if not decoded.error:
                decoded.spans = list((body.spans or {})[question.id])
                decoded.head, decoded.threshold = (body.span_heads or {}).get(question.id, ""), threshold
                decoded = _checked(decoded)
            out[question.id] = decoded
            continue
        if answer is None:
            continue
        if question.type in ("set", "span"):
            out[question.id] = RouterAnswer(type=question.type, error="invalid_model_output")
            continue
        out[question.id] = _decode_answer(answer)
    return out


def answer_fits(question: Question, answer: RouterAnswer) -> bool:
    """answer_check.go ``answerFits`` (``checkAnswers`` skips failed and preset questions)."""
    if answer.type != question.type or not 0.0 <= answer.confidence <= 1.0:
        return False
    if question.type == "choice":
        keys = [key for key, _ in question.choices]
        return _distribution_over(keys, answer.probabilities) and answer.choice in answer.probabilities and \
            answer.probabilities[answer.choice] >= max(answer.probabilities.values())
    if question.type == "noul":
        return 0.0 <= answer.noul <= 1.0
    if question.type == "score":
        keys = [str(i) for i in range(len(question.levels))]
        top = len(keys) - 1
        expected = sum(i * answer.probabilities.get(k, 0.0) for i, k in enumerate(keys))
        return _distribution_over(keys, answer.probabilities) and 0.0 <= answer.score <= top and \
            abs(answer.score - expected) <= ANSWER_SUM_TOLERANCE * top
    return True


def _distribution_over(keys: list[str], probabilities: dict[str, float]) -> bool:
    """answer_check.go ``distributionOver``."""
    if len(probabilities) != len(keys) or any(k not in probabilities for k in keys):
        return False
    if any(not 0.0 <= probabilities[k] <= 1.0 for k in keys):
        return False
    return abs(sum(probabilities[k] for k in keys) - 1.0) <= ANSWER_SUM_TOLERANCE


def checked_answers(body: api.DecisionResponse, questions: list[Question]) -> dict[str, RouterAnswer]:
    """``decode_answers`` then answer_check.go ``checkAnswers``: an answer that does not fit its question
    becomes invalid_model_output."""
    answers = decode_answers(body, questions)
    for question in questions:
        answer = answers.get(question.id)
        if answer is None or answer.error or question.preset or answer_fits(question, answer):
            continue
        answers[question.id] = RouterAnswer(type=answer.type, error="invalid_model_output")
    return answers


# -- bundles ------------------------------------------------------------------------------------------------------


def bundle_parts(tasks: list[dict[str, Any]], limit: int) -> list[list[dict[str, Any]]]:
    """bundle.go ``Bundle.sendLocked``: tasks split into parts of at most max_bundle_tasks, ids "1", "2", ..."""
    numbered = [{"id": str(i + 1), **task} for i, task in enumerate(tasks)]
    size = max(1, limit)
    return [numbered[i:i + size] for i in range(0, len(numbered), size)]


def send_bundle(client: httpx.Client, part: list[dict[str, Any]]) -> list[api.BundleResult]:
    """surfaces.go ``Client.sendBundle`` and bundle.go ``Bundle.send``: 200, one result per task, ids in order."""
    ex = exchange(client, "/v1/bundle", {"tasks": part})
    status_error(ex.status, ex.body.error if isinstance(ex.body, api.ErrorResponse) else None)
    results = ex.body.results or []
    if len(results) != len(part):
        raise RouterRefused("ErrFailed", "bundle response does not match its tasks")
    for task, result in zip(part, results):
        if result.id != task["id"]:
            raise RouterRefused("ErrFailed", f"result {result.id} answers task {task['id']}")
    return results
