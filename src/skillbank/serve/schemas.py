"""Request and response bodies of the HTTP API (they are also its OpenAPI schema)."""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class ErrorBody(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, not_found, too_large, unauthorized, forbidden, conflict, "
                                  "rate_limited, timeout, upstream_error or internal_error")
    param: Optional[str] = None


class ErrorResponse(BaseModel):
    """Every error answer: ``{"error": {"message", "type", "param"}}`` (the OpenAI shape)."""

    error: ErrorBody


# -- /v1/plan ------------------------------------------------------------------------------------------
class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request: Union[str, list[str]] = Field(description="One raw request, or a list of them.",
                                           examples=["Book a table at Nopa for Friday, then text Ana the confirmation"])
    shard: Optional[str] = Field(None, description="Force this shard instead of routing by content.")
    max_new_tokens: Optional[int] = Field(None, ge=1, description="Generation cap (at most the service's).")


class Timings(BaseModel):
    queue_ms: float = Field(description="waiting for a batch to start")
    route_ms: float = Field(description="Address Memory routing")
    generate_ms: float = Field(description="generation of the batch this request was in")
    total_ms: float = Field(description="from arrival to answer")


class PlanResult(BaseModel):
    request: str
    shard: str = Field(description="the shard that generated the graph")
    routed: bool = Field(description="False when the shard was forced")
    probabilities: dict[str, float] = Field(description="Address Memory p(shard | request); {shard: 1} when forced")
    valid: bool
    constrained: bool = Field(False, description="decoded under a grammar (the shard's, or the client's "
                                                 "structured_outputs): only its skills and declared arguments")
    graph: Optional[dict[str, Any]] = Field(description="canonical task graph {task_nodes, task_links}; null when invalid")
    error: Optional[str] = Field(description="why the output is not a valid graph; null when valid")
    raw: str = Field(description="the executor's text as generated")
    tokens: int = Field(description="tokens generated")
    truncated: bool = Field(description="generation did not stop: it hit the token cap (or a grammar dead end)")
    batch_size: int
    timings: Timings


class PlanResponse(BaseModel):
    plans: list[PlanResult]


# -- /v1/chat/completions ---------------------------------------------------------------------------
class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: Union[str, list[dict[str, Any]], None] = None


class ChatRequest(BaseModel):
    """OpenAI chat completion request. The last user message is the request; sampling settings are accepted
    and ignored (decoding is greedy: a plan should not depend on luck)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field("skillbank", description='"skillbank" routes by content; a shard name forces that shard')
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    n: int = Field(1, ge=1)
    stream: bool = False


class ChatChoiceMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatChoiceMessage
    finish_reason: Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str = Field(description="the shard that generated the answer")
    choices: list[ChatChoice]
    usage: Usage
    skillbank: dict[str, Any] = Field(description="routing details: shard, probabilities, valid, error")


# -- models, shards, health ---------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "skillbank"
    root: Optional[str] = None
    parent: Optional[str] = None
    skills: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ShardInfo(BaseModel):
    name: str
    index: int
    skills: list[dict[str, Any]] = Field(description="{id} per skill, with description and arguments when known")
    target_format: str
    created: str
    train_examples: Optional[int] = None


class ShardList(BaseModel):
    bank: str
    base: dict[str, Any]
    version: int = Field(description="increases each time a learned family is picked up")
    shards: list[ShardInfo]


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    mode: Literal["local", "upstream"]
    shards: int
    queue_depth: int
    learning: Optional[str] = Field(description="id of the learn job running, if any")
    version: int


# -- /v1/families ---------------------------------------------------------------------------------------
class LearnRequest(BaseModel):
    """JSON form of a learn call (the other form is the JSONL file itself as the body, settings in the query)."""

    model_config = ConfigDict(extra="forbid")

    family: str = Field(description="new family name: 1-64 letters, digits, '_' or '-'")
    records: Union[str, list[dict[str, Any]]] = Field(
        description='JSON Lines text, one {"id", "family", "request", "graph"} record per line, or a list of records')
    recipe: Literal["paper", "small-cpu"] = "paper"
    train: dict[str, Any] = Field(default_factory=dict, description="TrainConfig field overrides, e.g. {\"epochs\": 2}")
    skills: Optional[list[str]] = Field(None, description="the family's skill ids (default: those the records use)")


class LoadAdapterRequest(BaseModel):
    """vLLM's ``/v1/load_lora_adapter`` body."""

    lora_name: str
    lora_path: str


class LearnJobInfo(BaseModel):
    job: str
    family: str
    state: Literal["queued", "loading", "training", "publishing", "done", "failed", "cancelled"]
    records: int
    progress: dict[str, Any]
    error: Optional[str]
    result: dict[str, Any]
    created: float
    finished: Optional[float]


class LearnJobList(BaseModel):
    jobs: list[LearnJobInfo]
