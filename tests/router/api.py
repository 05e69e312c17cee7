"""The Router's generated contract types, field by field.

Every class mirrors the Go type of the same name in vllm-project/semantic-router
``src/semantic-router/pkg/modelservice/api/openapi.gen.go`` (commit 6b39a2dd92ff, contract major 2);
``goshapes.decode`` applies encoding/json's rules to them. Named string types list the constants the
generated code defines; the Router checks them only where ``routerchecks`` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.router.goshapes import ANY, BOOL, FLOAT64, INT, STRING, Map, Named, Ptr, Slice, go

# -- named string types (openapi.gen.go "Defines values for ...") ----------------------------------

STATES = ("starting", "loading", "warming", "ready", "degraded", "failed")
HealthStatus = Named("HealthStatus", STATES)
ModelHealthStatus = Named("ModelHealthStatus", STATES)
ModelCardStatus = Named("ModelCardStatus", STATES)
LivenessStatus = Named("LivenessStatus", ("alive",))
ItemError = Named("ItemError", ("deadline_exceeded", "invalid_input", "invalid_model_output", "invalid_question",
                                "max_length_exceeded", "scan_budget_exceeded", "unavailable"))
ErrorBodyCode = Named("ErrorBodyCode", ("internal_error", "invalid_request", "model_not_found", "not_ready",
                                        "overloaded", "request_too_large", "unsupported_surface"))
HeadCardKind = Named("HeadCardKind", ("scores", "sequence", "token"))
ClassifyResponseKind = Named("ClassifyResponseKind", ("scores", "sequence", "token"))
HeadCardOverflow = Named("HeadCardOverflow", ("reject", "truncate", "window"))
HeadCardReduction = Named("HeadCardReduction", ("max", "span_union"))
GoldenStatusStatus = Named("GoldenStatusStatus", ("failed", "matched", "pending", "unverified"))
ProfileInfoNumerics = Named("ProfileInfoNumerics", ("approximate", "exact"))
AnswerInputCoverage = Named("AnswerInputCoverage", ("complete",))


# -- health -----------------------------------------------------------------------------------------


@dataclass
class ModelHealth:
    """Go ``api.ModelHealth``: one model's state in /health."""

    reason: str | None = go("reason", Ptr(STRING))
    status: str = go("status", ModelHealthStatus)


@dataclass
class Health:
    """Go ``api.Health`` (GET /health, decoded on 200 and 503; health.go ``Client.health``)."""

    api_version: str = go("api_version", STRING)
    model: str | None = go("model", Ptr(STRING))
    models: dict[str, ModelHealth] | None = go("models", Ptr(Map(ModelHealth)))
    reason: str | None = go("reason", Ptr(STRING))
    status: str = go("status", HealthStatus)


@dataclass
class Liveness:
    """Go ``api.Liveness`` (GET /health/live)."""

    api_version: str = go("api_version", STRING)
    status: str = go("status", LivenessStatus)


# -- /v1/models -------------------------------------------------------------------------------------


@dataclass
class HeadWindow:
    """Go ``api.HeadWindow`` (serving ``modelservice.Window``)."""

    overlap: int = go("overlap", INT)
    tokens: int = go("tokens", INT)


@dataclass
class HeadCard:
    """Go ``api.HeadCard``: one classify head of a card (cards.go ``decodeHead``)."""

    default_threshold: float | None = go("default_threshold", Ptr(FLOAT64))
    inputs: list[str] | None = go("inputs", Ptr(Slice(STRING)))
    kind: str = go("kind", HeadCardKind)
    labels: list[str] | None = go("labels", Slice(STRING))
    name: str = go("name", STRING)
    operating_point_sha256: str | None = go("operating_point_sha256", Ptr(STRING))
    overflow: str | None = go("overflow", Ptr(HeadCardOverflow))
    reduction: str | None = go("reduction", Ptr(HeadCardReduction))
    thresholds: list[float] | None = go("thresholds", Ptr(Slice(FLOAT64)))
    window: HeadWindow | None = go("window", Ptr(HeadWindow))


@dataclass
class EmbeddingCard:
    """Go ``api.EmbeddingCard`` (cards.go ``EmbeddingCard``)."""

    dimensions: list[int] | None = go("dimensions", Slice(INT))
    input_types: list[str] | None = go("input_types", Slice(STRING))
    layers: list[int] | None = go("layers", Slice(INT))
    modalities: list[str] | None = go("modalities", Slice(STRING))
    normalized: bool = go("normalized", BOOL)
    pooling: str = go("pooling", STRING)


@dataclass
class RerankExit:
    """Go ``api.RerankExit``."""

    dimension: int = go("dimension", INT)
    layer: int = go("layer", INT)


@dataclass
class RerankCard:
    """Go ``api.RerankCard``."""

    default: RerankExit = go("default", RerankExit)
    exits: list[RerankExit] | None = go("exits", Slice(RerankExit))


@dataclass
class GoldenStatus:
    """Go ``api.GoldenStatus``."""

    checked: int | None = go("checked", Ptr(INT))
    matched: int | None = go("matched", Ptr(INT))
    reference: str | None = go("reference", Ptr(STRING))
    status: str = go("status", GoldenStatusStatus)


@dataclass
class ModelLimits:
    """Go ``api.ModelLimits``."""

    max_input_tokens: int | None = go("max_input_tokens", Ptr(INT))
    max_inputs: int | None = go("max_inputs", Ptr(INT))
    max_levels: int | None = go("max_levels", Ptr(INT))
    max_options: int | None = go("max_options", Ptr(INT))
    max_scan_tokens: int | None = go("max_scan_tokens", Ptr(INT))
    min_levels: int | None = go("min_levels", Ptr(INT))
    min_options: int | None = go("min_options", Ptr(INT))
    truncate_tokens: int | None = go("truncate_tokens", Ptr(INT))


@dataclass
class PluginInfo:
    """Go ``api.PluginInfo``."""

    capabilities: dict[str, Any] | None = go("capabilities", Ptr(Map(ANY)))
    distribution: str | None = go("distribution", Ptr(STRING))
    group: str = go("group", STRING)
    name: str = go("name", STRING)
    version: str | None = go("version", Ptr(STRING))


@dataclass
class ProfileInfo:
    """Go ``api.ProfileInfo``."""

    description: str | None = go("description", Ptr(STRING))
    name: str = go("name", STRING)
    numerics: str = go("numerics", ProfileInfoNumerics)


@dataclass
class ModelCard:
    """Go ``api.ModelCard`` (cards.go ``decodeCard`` reads it into ``modelservice.ModelCard``)."""

    accelerator: str | None = go("accelerator", Ptr(STRING))
    accelerator_validated: bool | None = go("accelerator_validated", Ptr(BOOL))
    device: str | None = go("device", Ptr(STRING))
    dtype: str | None = go("dtype", Ptr(STRING))
    embedding: EmbeddingCard | None = go("embedding", Ptr(EmbeddingCard))
    engine: str | None = go("engine", Ptr(STRING))
    family: str = go("family", STRING)
    golden: GoldenStatus | None = go("golden", Ptr(GoldenStatus))
    heads: list[HeadCard] | None = go("heads", Ptr(Slice(HeadCard)))
    id: str = go("id", STRING)
    licence: str | None = go("licence", Ptr(STRING))
    limits: ModelLimits | None = go("limits", Ptr(ModelLimits))
    manifest_sha256: str | None = go("manifest_sha256", Ptr(STRING))
    model_sha256: str | None = go("model_sha256", Ptr(STRING))
    object: str = go("object", STRING)
    owned_by: str | None = go("owned_by", Ptr(STRING))
    parameters: int | None = go("parameters", Ptr(INT))
    plugins: list[PluginInfo] | None = go("plugins", Ptr(Slice(PluginInfo)))
    presets: list[str] | None = go("presets", Ptr(Slice(STRING)))
    profile: str | None = go("profile", Ptr(STRING))
    profiles: list[ProfileInfo] | None = go("profiles", Ptr(Slice(ProfileInfo)))
    question_types: list[str] | None = go("question_types", Ptr(Slice(STRING)))
    ready: bool = go("ready", BOOL)
    reason: str | None = go("reason", Ptr(STRING))
    repo: str | None = go("repo", Ptr(STRING))
    rerank: RerankCard | None = go("rerank", Ptr(RerankCard))
    revision: str | None = go("revision", Ptr(STRING))
    status: str | None = go("status", Ptr(ModelCardStatus))
    surfaces: list[str] | None = go("surfaces", Slice(STRING))


@dataclass
class ProcessLimits:
    """Go ``api.ProcessLimits``."""

    max_bundle_tasks: int = go("max_bundle_tasks", INT)
    max_request_bytes: int = go("max_request_bytes", INT)


@dataclass
class ModelList:
    """Go ``api.ModelList`` (GET /v1/models; client.go ``Client.Models``)."""

    api_version: str = go("api_version", STRING)
    data: list[ModelCard] | None = go("data", Slice(ModelCard))
    limits: ProcessLimits = go("limits", ProcessLimits)
    object: str = go("object", STRING)


# -- shared response parts --------------------------------------------------------------------------


@dataclass
class Usage:
    """Go ``api.Usage``."""

    input_tokens: int = go("input_tokens", INT)
    output_tokens: int = go("output_tokens", INT)


@dataclass
class InputUsage:
    """Go ``api.InputUsage``: one input's tokenizer facts (surfaces.go ``InputUsage``)."""

    processed_tokens: int = go("processed_tokens", INT)
    tokens: int = go("tokens", INT)
    tokens_lower_bound: bool | None = go("tokens_lower_bound", Ptr(BOOL))
    truncated: bool = go("truncated", BOOL)
    windows: int | None = go("windows", Ptr(INT))


@dataclass
class Representation:
    """Go ``api.Representation``."""

    dimension: int = go("dimension", INT)
    layer: int = go("layer", INT)
    modality: str | None = go("modality", Ptr(STRING))
    model_sha256: str = go("model_sha256", STRING)
    normalized: bool | None = go("normalized", Ptr(BOOL))


@dataclass
class ResponseMeta:
    """Go ``api.ResponseMeta``."""

    accelerator: str | None = go("accelerator", Ptr(STRING))
    compute_ms: float | None = go("compute_ms", Ptr(FLOAT64))
    device: str | None = go("device", Ptr(STRING))
    engine: str | None = go("engine", Ptr(STRING))
    head: str | None = go("head", Ptr(STRING))
    model_sha256: str | None = go("model_sha256", Ptr(STRING))
    numerics: str | None = go("numerics", Ptr(STRING))
    profile: str | None = go("profile", Ptr(STRING))
    queue_ms: float | None = go("queue_ms", Ptr(FLOAT64))
    representation: Representation | None = go("representation", Ptr(Representation))
    revision: str | None = go("revision", Ptr(STRING))


@dataclass
class Span:
    """Go ``api.Span``: code-point offsets, end exclusive."""

    end: int = go("end", INT)
    label: str = go("label", STRING)
    probability: float = go("probability", FLOAT64)
    start: int = go("start", INT)
    text: str = go("text", STRING)


# -- classify ----------------------------------------------------------------------------------------


@dataclass
class TokenProbabilities:
    """Go ``api.TokenProbabilities``."""

    end: int = go("end", INT)
    probabilities: list[float] | None = go("probabilities", Slice(FLOAT64))
    start: int = go("start", INT)


@dataclass
class ClassifyWindow:
    """Go ``api.ClassifyWindow``: content-token offsets, end exclusive."""

    end: int = go("end", INT)
    probabilities: list[float] | None = go("probabilities", Ptr(Slice(FLOAT64)))
    scores: list[float] | None = go("scores", Ptr(Slice(FLOAT64)))
    start: int = go("start", INT)


@dataclass
class ClassifyResult:
    """Go ``api.ClassifyResult``."""

    error: str | None = go("error", Ptr(ItemError))
    index: int = go("index", INT)
    input: InputUsage | None = go("input", Ptr(InputUsage))
    label: str | None = go("label", Ptr(STRING))
    probabilities: list[float] | None = go("probabilities", Ptr(Slice(FLOAT64)))
    scores: list[float] | None = go("scores", Ptr(Slice(FLOAT64)))
    selected: list[str] | None = go("selected", Ptr(Slice(STRING)))
    spans: list[Span] | None = go("spans", Ptr(Slice(Span)))
    tokens: list[TokenProbabilities] | None = go("tokens", Ptr(Slice(TokenProbabilities)))
    windows: list[ClassifyWindow] | None = go("windows", Ptr(Slice(ClassifyWindow)))


@dataclass
class ClassifyResponse:
    """Go ``api.ClassifyResponse``."""

    head: str = go("head", STRING)
    kind: str = go("kind", ClassifyResponseKind)
    labels: list[str] | None = go("labels", Slice(STRING))
    meta: ResponseMeta | None = go("meta", Ptr(ResponseMeta))
    model: str = go("model", STRING)
    results: list[ClassifyResult] | None = go("results", Slice(ClassifyResult))
    usage: Usage = go("usage", Usage)


# -- embeddings ----------------------------------------------------------------------------------------


@dataclass
class Embedding:
    """Go ``api.Embedding``; ``embedding`` is the raw ``EmbeddingVector`` union (surfaces.go ``decodeVector``)."""

    embedding: Any = go("embedding", Ptr(ANY))
    error: str | None = go("error", Ptr(ItemError))
    index: int = go("index", INT)
    input: InputUsage | None = go("input", Ptr(InputUsage))
    object: str = go("object", STRING)


@dataclass
class EmbeddingsUsage:
    """Go ``api.EmbeddingsUsage``."""

    prompt_tokens: int = go("prompt_tokens", INT)
    total_tokens: int = go("total_tokens", INT)


@dataclass
class EmbeddingsResponse:
    """Go ``api.EmbeddingsResponse``."""

    data: list[Embedding] | None = go("data", Slice(Embedding))
    meta: ResponseMeta | None = go("meta", Ptr(ResponseMeta))
    model: str = go("model", STRING)
    object: str = go("object", STRING)
    usage: EmbeddingsUsage = go("usage", EmbeddingsUsage)


# -- rerank ----------------------------------------------------------------------------------------------


@dataclass
class RerankResult:
    """Go ``api.RerankResult``."""

    document: str | None = go("document", Ptr(STRING))
    error: str | None = go("error", Ptr(ItemError))
    index: int = go("index", INT)
    input: InputUsage | None = go("input", Ptr(InputUsage))
    logit: float | None = go("logit", Ptr(FLOAT64))
    relevance_score: float | None = go("relevance_score", Ptr(FLOAT64))


@dataclass
class RerankResponse:
    """Go ``api.RerankResponse``."""

    meta: ResponseMeta | None = go("meta", Ptr(ResponseMeta))
    model: str = go("model", STRING)
    results: list[RerankResult] | None = go("results", Slice(RerankResult))
    usage: Usage = go("usage", Usage)


# -- decisions -------------------------------------------------------------------------------------------


@dataclass
class Answer:
    """Go ``api.Answer``: one question's answer (client.go ``decodeAnswer``)."""

    abstain_probability: float | None = go("abstain_probability", Ptr(FLOAT64))
    choice: str | None = go("choice", Ptr(STRING))
    confidence: float | None = go("confidence", Ptr(FLOAT64))
    error: str | None = go("error", Ptr(ItemError))
    input_coverage: str | None = go("input_coverage", Ptr(AnswerInputCoverage))
    legend: dict[str, str] | None = go("legend", Ptr(Map(STRING)))
    message: str | None = go("message", Ptr(STRING))
    noul: float | None = go("noul", Ptr(FLOAT64))
    probabilities: dict[str, float] | None = go("probabilities", Ptr(Map(FLOAT64)))
    score: float | None = go("score", Ptr(FLOAT64))
    type: str | None = go("type", Ptr(STRING))


@dataclass
class SetAnswer:
    """Go ``api.SetAnswer``."""

    input_coverage: str | None = go("input_coverage", Ptr(AnswerInputCoverage))
    probabilities: dict[str, float] | None = go("probabilities", Map(FLOAT64))
    selected: list[str] | None = go("selected", Slice(STRING))


@dataclass
class DecisionStateResponse:
    """Go ``api.DecisionStateResponse``: one entry of a response's ``states``."""

    answers: dict[str, Answer] | None = go("answers", Map(Answer))
    meta: ResponseMeta | None = go("meta", Ptr(ResponseMeta))
    model: str = go("model", STRING)
    sets: dict[str, SetAnswer] | None = go("sets", Ptr(Map(SetAnswer)))
    span_heads: dict[str, str] | None = go("span_heads", Ptr(Map(STRING)))
    spans: dict[str, list[Span]] | None = go("spans", Ptr(Map(Slice(Span))))
    thresholds: dict[str, float] | None = go("thresholds", Ptr(Map(FLOAT64)))
    usage: Usage = go("usage", Usage)


@dataclass
class DecisionResponse:
    """Go ``api.DecisionResponse`` (/v1/decisions and, through ``CreateSystemOneResponse``, /v1/systemone)."""

    answers: dict[str, Answer] | None = go("answers", Map(Answer))
    meta: ResponseMeta | None = go("meta", Ptr(ResponseMeta))
    model: str = go("model", STRING)
    sets: dict[str, SetAnswer] | None = go("sets", Ptr(Map(SetAnswer)))
    span_heads: dict[str, str] | None = go("span_heads", Ptr(Map(STRING)))
    spans: dict[str, list[Span]] | None = go("spans", Ptr(Map(Slice(Span))))
    states: dict[str, DecisionStateResponse] | None = go("states", Ptr(Map(DecisionStateResponse)))
    thresholds: dict[str, float] | None = go("thresholds", Ptr(Map(FLOAT64)))
    usage: Usage = go("usage", Usage)


# -- errors and bundles ------------------------------------------------------------------------------------


@dataclass
class ErrorBody:
    """Go ``api.ErrorBody``."""

    code: str = go("code", ErrorBodyCode)
    message: str = go("message", STRING)


@dataclass
class ErrorResponse:
    """Go ``api.ErrorResponse`` (alias ``api.Error``): the body of every listed non-200 status."""

    error: ErrorBody = go("error", ErrorBody)


@dataclass
class BundleResult:
    """Go ``api.BundleResult``."""

    classify: ClassifyResponse | None = go("classify", Ptr(ClassifyResponse))
    decisions: DecisionResponse | None = go("decisions", Ptr(DecisionResponse))
    embeddings: EmbeddingsResponse | None = go("embeddings", Ptr(EmbeddingsResponse))
    error: ErrorBody | None = go("error", Ptr(ErrorBody))
    id: str = go("id", STRING)
    rerank: RerankResponse | None = go("rerank", Ptr(RerankResponse))
    status: int = go("status", INT)


@dataclass
class BundleResponse:
    """Go ``api.BundleResponse``."""

    results: list[BundleResult] | None = go("results", Slice(BundleResult))


#: The statuses each generated ``Parse*Response`` decodes a JSON body for (others leave it unread).
PARSED_STATUSES: dict[str, tuple[int, ...]] = {
    "/health": (200, 503),
    "/health/live": (200,),
    "/v1/models": (200,),
    "/v1/bundle": (200, 400, 413, 500),
    "/v1/classify": (200, 400, 404, 413, 422, 429, 500, 503),
    "/v1/decisions": (200, 400, 404, 413, 422, 429, 500, 503),
    "/v1/systemone": (200, 400, 404, 413, 422, 429, 500, 503),
    "/v1/embeddings": (200, 400, 404, 413, 422, 429, 500, 503),
    "/v1/rerank": (200, 400, 404, 413, 422, 429, 500, 503),
}

#: The 200 body type of each operation.
BODY_200: dict[str, type] = {
    "/health": Health, "/health/live": Liveness, "/v1/models": ModelList, "/v1/bundle": BundleResponse,
    "/v1/classify": ClassifyResponse, "/v1/decisions": DecisionResponse, "/v1/systemone": DecisionResponse,
    "/v1/embeddings": EmbeddingsResponse, "/v1/rerank": RerankResponse,
}
