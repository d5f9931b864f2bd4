"""Request and response bodies of the HTTP API (they are also its OpenAPI schema).

Request bodies are validated strictly - a number is not a string, a string is not a number, as in OpenAI's
API - and their schema states the rules the service enforces, including those it checks in code with its own
messages (non-blank text, non-empty lists, the family name pattern): those are written here as JSON Schema
next to the field (``json_schema_extra``), and the limits that come from the service's config (text length,
list length) are filled in by :mod:`skillbank.serve.openapi`. What JSON Schema cannot say (a rule between two
fields, a prompt's length in tokens, a grammar that must compile) is in the field's description.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from skillbank.memory.bank import FAMILY_NAME

NON_BLANK = r"\S"  # search semantics: at least one character that is not white space
# Record text: non-blank, and no control character but tab, line feed and carriage return (they would be
# learned as tokens of the request; see skillbank.serve.learn_jobs.text_problem).
PLAIN_TEXT = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]*$"
RECORD_TEXT = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]*$"
STRICT = ConfigDict(strict=True, extra="forbid")


def _integral(value: Any) -> Any:
    """JSON has one number type: 2.0 is the integer 2 (JSON Schema says so too), and is taken as one."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def Int(**constraints):
    """An integer, strictly (not "2", not true, not 2.5), within ``constraints`` (ge, le). The constraints come
    before the validator so that the schema states them as minimum / maximum."""
    return Annotated[int, Field(**constraints), BeforeValidator(_integral)]
OPEN = ConfigDict(strict=True, extra="allow")  # OpenAI's objects: unknown fields are accepted and ignored


class ErrorBody(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, not_found, too_large, unauthorized, forbidden, conflict, "
                                  "rate_limited, timeout, upstream_error or internal_error")
    param: Optional[str] = None


class ErrorResponse(BaseModel):
    """Every error answer: ``{"error": {"message", "type", "param"}}`` (the OpenAI shape)."""

    error: ErrorBody


# -- /v1/plan ------------------------------------------------------------------------------------------
REQUEST_TEXT = {"type": "string", "pattern": NON_BLANK, "maxLength": 4000}  # maxLength: the config's


class PlanRequest(BaseModel):
    model_config = STRICT

    request: Annotated[Union[str, list[str]], WithJsonSchema({
        "anyOf": [REQUEST_TEXT, {"type": "array", "items": REQUEST_TEXT, "minItems": 1, "maxItems": 64}],
        "description": "One raw request, or a list of them: each non-blank, of at most max_request_chars "
                       "characters (413 beyond), at most max_list of them (413 beyond). A request whose prompt "
                       "does not fit the base model's context is a 413 too (its length in tokens).",
        "examples": ["Book a table at Nopa for Friday, then text Ana the confirmation"]})]
    shard: Optional[str] = Field(None, description="Force this shard instead of routing by content (404 when the "
                                                   "bank has no such shard).")
    max_new_tokens: Optional[Int(ge=1)] = Field(None, description="Generation cap (at most the service's).")
    explain: Optional[bool] = Field(False, description="Add `explain` to each plan: why it got its scope verdict "
                                                       "and route (what `skillbank plan --explain` prints).")


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
    failed: bool = Field(False, description="the shard could not serve this request (its files damaged or "
                                            "missing, its adapter failing to load or to generate): nothing was "
                                            "generated, `error` says why and names the shard; the call's other "
                                            "requests are answered as usual")
    constrained: bool = Field(False, description="decoded under a grammar (the shard's, or the client's "
                                                 "structured_outputs): only its skills and declared arguments")
    graph: Optional[dict[str, Any]] = Field(description="canonical task graph {task_nodes, task_links}; null when "
                                                        "invalid or out of scope")
    error: Optional[str] = Field(description="why the generated output is not a valid graph, or why the shard "
                                             "failed (see failed); null when valid or out of scope (see reason)")
    raw: str = Field(description="the executor's text as generated")
    tokens: int = Field(description="tokens generated")
    truncated: bool = Field(description="generation did not stop: it hit the token cap (or a grammar dead end)")
    batch_size: int
    timings: Timings
    mean_logprob: Optional[float] = Field(None, description="the executor's mean token log-probability of `raw` "
                                                            "(confidence.executor_logprob); null when nothing was "
                                                            "generated or the upstream does not report it")
    explain: Optional[dict[str, Any]] = Field(None, description="present when the call asked `explain: true`: "
                                                                "scope_margin, scope_family, top_families [{family, "
                                                                "p}], counted_words [{word, score}], values "
                                                                "[{kind, text}] (spans read as argument values), context "
                                                                "[sentence] (left out of routing as scene-setting), "
                                                                "top_skills [{skill, p}] (the chosen shard's skill "
                                                                "prior), and for a gate with an outlier corpus "
                                                                "outside (+1: like the learned families' mean, -1: "
                                                                "like the corpus's) with outside_like, the corpus "
                                                                "category it is likest to where outside < 0; for a "
                                                                "family with negatives closest_negative {kind, "
                                                                "source, request, own_minus_negatives}")


class PlanResponse(BaseModel):
    plans: list[PlanResult]


# -- /v1/chat/completions ---------------------------------------------------------------------------
ROLES = ("system", "user", "assistant", "tool", "function", "developer")
TEXT_PART = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
OTHER_PART = {"type": "object", "properties": {"type": {"not": {"const": "text"}}}}
# What makes a message the request: a user message with non-blank text (as a string or a text part).
USER_REQUEST = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"const": "user"},
    "content": {"anyOf": [{"type": "string", "pattern": NON_BLANK},
                          {"type": "array", "contains": {**TEXT_PART, "properties": {
                              "type": {"const": "text"}, "text": {"type": "string", "pattern": NON_BLANK}}}}]}}}


def _content_part(part: dict) -> dict:
    if part.get("type") == "text" and not isinstance(part.get("text"), str):
        raise ValueError("a text content part needs a string 'text'")
    return part


ContentPart = Annotated[dict[str, Any], AfterValidator(_content_part),
                        WithJsonSchema({"anyOf": [TEXT_PART, OTHER_PART]})]


class ChatMessage(BaseModel):
    model_config = OPEN

    role: Literal[ROLES]
    content: Union[str, list[ContentPart], None] = Field(
        None, description="text, or content parts (text parts are joined with line breaks); the request is the "
                          "last user message with text, at most max_request_chars characters (413 beyond)")
    name: Optional[str] = None


class ChatOptions(BaseModel):
    """skillbank's own extension of a chat completion request."""

    model_config = STRICT

    format: Optional[Literal["text", "tool_calls"]] = Field(
        None, description='"tool_calls": answer in OpenAI tool_calls form; "text": the graph as JSON text in '
                          "message.content; default: tool_calls when the request has tools or tool_choice")


class FunctionDefinition(BaseModel):
    model_config = OPEN

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class FunctionTool(BaseModel):
    model_config = OPEN

    type: Literal["function"]
    function: FunctionDefinition


class CustomTool(BaseModel):
    model_config = OPEN

    type: Literal["custom"]
    custom: dict[str, Any]


class ToolName(BaseModel):
    model_config = OPEN

    name: str


class NamedFunctionChoice(BaseModel):
    model_config = OPEN

    type: Literal["function"]
    function: ToolName


class NamedCustomChoice(BaseModel):
    model_config = OPEN

    type: Literal["custom"]
    custom: ToolName


class AllowedToolsChoice(BaseModel):
    model_config = OPEN

    type: Literal["allowed_tools"]
    allowed_tools: dict[str, Any]


class ResponseFormat(BaseModel):
    model_config = OPEN

    type: Literal["text", "json_object", "json_schema"]


Tool = Annotated[Union[FunctionTool, CustomTool], Field(discriminator="type")]
ToolChoiceObject = Annotated[Union[NamedFunctionChoice, NamedCustomChoice, AllowedToolsChoice],
                             Field(discriminator="type")]
Penalty = Optional[Annotated[float, Field(ge=-2, le=2)]]


class ChatRequest(BaseModel):
    """OpenAI chat completion request. The request to plan is the last user message with text; OpenAI's
    parameters are checked with OpenAI's types and ranges (a wrong one is a 400 naming it) and otherwise
    ignored: decoding is greedy (a plan should not depend on luck), so ``n`` must be 1 and ``stream`` false.
    Fields this service does not know are accepted and ignored, except vLLM's ``structured_outputs``
    ``{"grammar": <Lark>}`` (or ``guided_grammar``), which constrains decoding (400 if it does not compile).

    The answer is the task graph as JSON text in ``message.content``, or - when the request carries ``tools``
    or ``tool_choice`` (other than "none"), as OpenAI function-calling clients send, or
    ``"skillbank": {"format": "tool_calls"}`` - OpenAI ``tool_calls``: one call per node (see ChatChoiceMessage)."""

    model_config = OPEN

    model: str = Field("skillbank", description='"skillbank" routes by content; a shard name forces that shard '
                                                "(404 for any other name)")
    messages: Annotated[list[ChatMessage], Field(min_length=1, json_schema_extra={
        "contains": USER_REQUEST, "description": "at least one user message with non-blank text: the last "
                                                 "such message is the request (400 without one)"})]
    max_tokens: Optional[Int(ge=1)] = None
    max_completion_tokens: Optional[Int(ge=1)] = None
    n: Annotated[Optional[Int(ge=1, le=128)], WithJsonSchema(
        {"anyOf": [{"const": 1}, {"type": "null"}], "description": "1 only: decoding is greedy (400 otherwise)"})
    ] = None
    stream: Annotated[Optional[bool], WithJsonSchema(
        {"anyOf": [{"const": False}, {"type": "null"}], "description": "false only: a task graph is returned "
                                                                        "whole (400 otherwise)"})] = None
    temperature: Optional[Annotated[float, Field(ge=0, le=2)]] = None
    top_p: Optional[Annotated[float, Field(ge=0, le=1)]] = None
    frequency_penalty: Penalty = None
    presence_penalty: Penalty = None
    logit_bias: Optional[dict[str, Annotated[float, Field(ge=-100, le=100)]]] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Int(ge=0, le=20)] = None
    seed: Optional[Int()] = None
    stop: Union[str, Annotated[list[str], Field(max_length=4)], None] = None
    stream_options: Optional[dict[str, Any]] = None
    response_format: Optional[ResponseFormat] = None
    user: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    store: Optional[bool] = None
    parallel_tool_calls: Optional[bool] = None
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high", "xhigh"]] = None
    service_tier: Optional[Literal["auto", "default", "flex", "scale", "priority"]] = None
    modalities: Optional[list[Literal["text", "audio"]]] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None
    tools: Optional[list[Tool]] = Field(
        None, description="OpenAI tools. Their presence asks for the tool_calls form; the plan's calls are the "
                          "routed shard's own skills whatever the list names")
    tool_choice: Union[Literal["none", "auto", "required"], ToolChoiceObject, None] = Field(
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
    engine: Literal["llama.cpp", "torch", "upstream"] = Field(description="what generates the plans")
    shards: int
    queue_depth: int
    learning: Optional[str] = Field(description="id of the learn job running, if any")
    version: int


# -- /v1/families ---------------------------------------------------------------------------------------
class TrainOverrides(BaseModel):
    """TrainConfig fields a learn call may override, with their types and ranges
    (skillbank.train.executor.TrainConfig; the LoRA rank at most 512, the largest vLLM serves)."""

    model_config = STRICT

    rank: Int(ge=1, le=512) = None
    alpha: float = Field(None, gt=0)
    dropout: float = Field(None, ge=0, lt=1)
    target_modules: list[Annotated[str, Field(pattern=NON_BLANK)]] = Field(None, min_length=1)
    layers_to_transform: Optional[list[Int(ge=0)]] = Field(None, min_length=1)
    lr: float = Field(None, gt=0, lt=1)
    epochs: Int(ge=1) = None
    batch_size: Int(ge=1) = None
    grad_accum: Int(ge=1) = None
    warmup_ratio: float = Field(None, ge=0, lt=1)
    weight_decay: float = Field(None, ge=0)
    max_grad_norm: Optional[float] = Field(None, gt=0)
    max_length: Optional[Int(ge=8)] = None
    seed: Int() = None
    target_format: Literal["json", "compact"] = None
    system_prompt: str = None
    precision: Literal["auto", "fp32", "bf16"] = None


def _without_defaults(schema: dict) -> dict:
    """A model's schema to inline: its fields' ``default: null`` means "not given", not a value to send."""
    props = {k: {kk: vv for kk, vv in v.items() if kk not in ("default", "title")}
             for k, v in schema["properties"].items()}
    return {"type": "object", "properties": props, "additionalProperties": False}


TRAIN_SCHEMA = _without_defaults(TrainOverrides.model_json_schema())
RECORD_STRING = {"type": "string", "pattern": RECORD_TEXT}
GRAPH_SCHEMA = {
    "type": "object", "required": ["task_nodes", "task_links"], "additionalProperties": False,
    "description": "a task graph (skillbank.graph): nodes in topological order, each <node-j> argument value "
                   "naming an earlier node, links between the nodes' tasks, no cycle",
    "properties": {
        "task_nodes": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["task", "arguments"], "additionalProperties": False,
            "properties": {"task": RECORD_STRING, "arguments": {"type": "array", "items": {
                "type": "object", "required": ["name", "value"], "additionalProperties": False,
                "properties": {"name": RECORD_STRING,
                               "value": {"anyOf": [{"type": "string", "pattern": PLAIN_TEXT},
                                                   {"type": "number"}, {"type": "boolean"}]}}}}}}},
        "task_links": {"type": "array", "items": {
            "type": "object", "required": ["source", "target"], "additionalProperties": False,
            "properties": {"source": RECORD_STRING, "target": RECORD_STRING}}}}}
RECORD_SCHEMA = {
    "type": "object", "required": ["id", "family", "request", "graph"],
    "description": "one record: `family` must be the call's family, ids unique, every string plain text",
    "properties": {"id": {"anyOf": [RECORD_STRING, {"type": "integer"}]}, "family": RECORD_STRING,
                   "request": RECORD_STRING, "graph": GRAPH_SCHEMA,
                   "structure": {"enum": ["single", "chain", "dag", "", None]}}}
RECORDS_SCHEMA = {
    "anyOf": [{"type": "string", "pattern": NON_BLANK,
               "description": "JSON Lines text: one record per line (each line as in the list form)"},
              {"type": "array", "minItems": 1, "items": RECORD_SCHEMA}],
    "description": 'the records, JSON Lines text or a list: {"id", "family", "request", "graph"} each, their '
                   "family the call's, their skills disjoint from the bank's (409-free: 422 otherwise)"}


class LearnRequest(BaseModel):
    """JSON form of a learn call (the other form is the JSONL file itself as the body, settings in the query)."""

    model_config = STRICT

    family: str = Field(description="new family name: 1-64 letters, digits, '_' or '-', starting with a letter or "
                                    "digit (409 when the bank has it)",
                        json_schema_extra={"pattern": FAMILY_NAME.pattern})
    records: Annotated[Union[str, list[dict[str, Any]]], WithJsonSchema(RECORDS_SCHEMA)]
    recipe: Literal["auto", "paper", "small-cpu"] = Field(
        "auto", description="'auto': small-cpu for bases under 1B parameters (the embedded one), else paper")
    train: Annotated[dict[str, Any], WithJsonSchema({
        **TRAIN_SCHEMA, "description": 'TrainConfig field overrides, e.g. {"epochs": 2}'})] = Field(
        default_factory=dict)
    skills: Optional[list[Annotated[str, Field(json_schema_extra={"pattern": NON_BLANK})]]] = Field(
        None, min_length=1, description="the family's skill ids (default: those the records use); the records use "
                                        "no other")


class LoadAdapterRequest(BaseModel):
    """vLLM's ``/v1/load_lora_adapter`` body."""

    model_config = STRICT

    lora_name: str
    lora_path: str = Field(json_schema_extra={"pattern": "^[^\\x00]*$"},
                           description="the shard's directory in this bank (409 for any other path)")


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
