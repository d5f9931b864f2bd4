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


class Confidence(BaseModel):
    route: float = Field(description="Address Memory p(shard | request) of the routed shard (of the closest one when "
                                     "out of scope); 1 when the shard was forced")
    scope_margin: Optional[float] = Field(description="out-of-scope score minus its threshold: below 0 no learned "
                                                      "family covers the request; null when not checked (shard "
                                                      "forced, check off, or a bank without scope statistics) "
                                                      "or when the request has no words to score")
    executor_logprob: Optional[float] = Field(description="the executor's mean token log-probability of its output "
                                                          "(<= 0); null when nothing was generated, or in upstream "
                                                          "mode (the upstream does not report it)")


class PlanResult(BaseModel):
    request: str
    shard: Optional[str] = Field(description="the shard that generated the graph; null when out of scope")
    routed: bool = Field(description="False when the shard was forced")
    probabilities: dict[str, float] = Field(description="Address Memory p(shard | request); {shard: 1} when forced")
    out_of_scope: bool = Field(False, description="no learned family covers the request: nothing was generated "
                                                  "(shard, graph null; valid false) and `reason` says why")
    reason: Optional[str] = Field(None, description="why the request is out of scope; null otherwise")
    confidence: Confidence
    valid: bool
    constrained: bool = Field(False, description="decoded under a grammar (the shard's, or the client's "
                                                 "structured_outputs): only its skills and declared arguments")
    graph: Optional[dict[str, Any]] = Field(description="canonical task graph {task_nodes, task_links}; null when "
                                                        "invalid or out of scope")
    error: Optional[str] = Field(description="why the generated output is not a valid graph; null when valid or "
                                             "out of scope (see reason)")
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


class ChatOptions(BaseModel):
    """skillbank's own extension of a chat completion request."""

    model_config = ConfigDict(extra="forbid")

    format: Optional[Literal["text", "tool_calls"]] = Field(
        None, description='"tool_calls": answer in OpenAI tool_calls form; "text": the graph as JSON text in '
                          "message.content; default: tool_calls when the request has tools or tool_choice")


class ChatRequest(BaseModel):
    """OpenAI chat completion request. The last user message is the request; sampling settings are accepted
    and ignored (decoding is greedy: a plan should not depend on luck).

    The answer is the task graph as JSON text in ``message.content``, or - when the request carries ``tools``
    or ``tool_choice`` (other than "none"), as OpenAI function-calling clients send, or
    ``"skillbank": {"format": "tool_calls"}`` - OpenAI ``tool_calls``: one call per node (see ChatChoiceMessage)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field("skillbank", description='"skillbank" routes by content; a shard name forces that shard')
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    n: int = Field(1, ge=1)
    stream: bool = False
    tools: Optional[list[dict[str, Any]]] = Field(
        None, description="OpenAI function tools. Their presence asks for the tool_calls form; the plan's calls are "
                          "the routed shard's own skills whatever the list names")
    tool_choice: Union[str, dict[str, Any], None] = Field(
        None, description='asks for the tool_calls form, except "none" (then the graph is JSON text)')
    skillbank: Optional[ChatOptions] = Field(None, description="skillbank's own options; format overrides "
                                                               "tools/tool_choice")


class ToolCallFunction(BaseModel):
    name: str = Field(description="the node's skill id, as the bank names it (it may contain '::')")
    arguments: str = Field(description='JSON object text {argument name: value}; a value "<node-j>" is the output '
                                       "of call_j, kept verbatim")


class ToolCall(BaseModel):
    id: str = Field(description="call_<n>, n the node's 0-based index in the graph: <node-n> names its output")
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatChoiceMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = Field(description="the graph as JSON text (text form); null in tool_calls form; the "
                                               "reason when out of scope (or, in tool_calls form, when the output "
                                               "is not a valid graph)")
    tool_calls: Optional[list[ToolCall]] = Field(None, description="tool_calls form: one call per node, in the "
                                                                   "graph's order; the links are in skillbank.links")


class ChatChoice(BaseModel):
    index: int
    message: ChatChoiceMessage
    finish_reason: Literal["stop", "length", "tool_calls"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str = Field(description='the shard that generated the answer; "skillbank" when out of scope')
    choices: list[ChatChoice]
    usage: Usage
    skillbank: dict[str, Any] = Field(
        description="routing details: shard, routed, probabilities, valid, error, out_of_scope, reason, confidence "
                    "{route, scope_margin, executor_logprob}, timings, and links: the graph's task_links [{source, target}] "
                    "between skill ids (null without a valid graph) - the tool_calls form's dependencies")


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
    total: int = Field(description="shards in the bank")
    offset: int = Field(description="index (0-based) of the first shard in this page")
    next_offset: Optional[int] = Field(description="offset of the next page; null on the last one")
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
    recipe: Literal["auto", "paper", "small-cpu"] = Field(
        "auto", description="'auto': small-cpu for bases under 1B parameters (the embedded one), else paper")
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
