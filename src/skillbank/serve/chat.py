"""The OpenAI chat-completions face of the planner: which message is the request, a client's grammar, and the
answer in text or tool_calls form."""
from __future__ import annotations

import json

from skillbank.model.prompts import USER_TEMPLATE
from skillbank.serve import schemas as S
from skillbank.serve.service import ServiceError


def request_of_chat(body: S.ChatRequest) -> str:
    """The request to plan: the last user message with text (a string, or its text parts), without the
    executor's own prompt wording if a client (e.g. another skillbank in --upstream mode) already added it.
    Text parts are joined with line breaks, as vLLM joins them: clients split a message at sentence or
    paragraph ends, and joined with nothing "...in Paris" and "tomorrow..." would read "Paristomorrow"."""
    for msg in reversed(body.messages):
        if msg.role != "user":
            continue
        content = msg.content
        if isinstance(content, list):  # the schema checked that every text part's text is a string
            content = "\n".join(p["text"] for p in content if p.get("type") == "text")
        if isinstance(content, str) and content.strip():
            prefix = USER_TEMPLATE.split("{request}")[0]
            return content[len(prefix):] if content.startswith(prefix) else content
    raise ServiceError(400, "no user message with text content: the last user message with text is the request "
                            "to plan", param="messages")


def grammar_of_chat(body: S.ChatRequest):
    """A client's grammar (vLLM's ``structured_outputs: {"grammar": <Lark>}``, or the older ``guided_grammar``),
    checked here so a bad one is a 400, not a failed generation. None when the client sent none."""
    from skillbank.model.constrain import LarkGrammar, check_lark
    extra = body.model_extra or {}
    structured = extra.get("structured_outputs")
    text = structured.get("grammar") if isinstance(structured, dict) else None
    text = text if text is not None else extra.get("guided_grammar")
    if text is None:
        return None
    if not isinstance(text, str) or not text.strip():
        raise ServiceError(400, "structured_outputs.grammar must be a non-empty Lark grammar", param="structured_outputs")
    problem = check_lark(text)
    if problem:
        raise ServiceError(400, f"structured_outputs.grammar does not compile: {problem}", param="structured_outputs")
    return LarkGrammar(text)


def check_settings(body: S.ChatRequest) -> None:
    """OpenAI settings this service cannot honour (the schema states them; these are the messages)."""
    if body.stream:
        raise ServiceError(400, "stream=true is not supported: a task graph is returned whole", param="stream")
    if body.n not in (None, 1):
        raise ServiceError(400, f"n must be 1 (decoding is greedy), got {body.n}", param="n")


def wants_tool_calls(body: S.ChatRequest) -> bool:
    """Answer in OpenAI tool_calls form? Asked the way function-calling clients ask: a ``tools`` list or a
    ``tool_choice`` ("none" keeps text, as in OpenAI's API); ``skillbank.format`` overrides both."""
    if body.skillbank is not None and body.skillbank.format is not None:
        return body.skillbank.format == "tool_calls"
    if body.tool_choice is not None:
        return body.tool_choice != "none"
    return bool(body.tools)


def tool_calls(graph: dict) -> list[dict]:
    """One OpenAI tool call per node; ``call_<n>`` is node n, so a "<node-n>" argument value names its output."""
    return [{"id": f"call_{i}", "type": "function",
             "function": {"name": node["task"],
                          "arguments": json.dumps({a["name"]: a["value"] for a in node["arguments"]},
                                                  ensure_ascii=False)}}
            for i, node in enumerate(graph["task_nodes"])]


def answer_message(plan: dict, raw: str, tool_form: bool) -> tuple[dict, str]:
    """The assistant message and finish reason for one plan (``service.plan_result``): the graph as JSON text
    or tool calls; the reason in plain words when there is no graph to give (out of scope, a shard that
    failed, or - in tool_calls form - an invalid graph: a framework reading tool_calls gets none, and a person
    reading content gets why)."""
    finish = "length" if plan["truncated"] else "stop"
    if plan["out_of_scope"]:
        return {"role": "assistant", "content": f"No skill in this bank covers that request ({plan['reason']})."}, finish
    if plan["failed"]:
        return {"role": "assistant", "content": f"No plan: {plan['error']}."}, finish
    if tool_form and plan["valid"]:
        return {"role": "assistant", "content": None, "tool_calls": tool_calls(plan["graph"])}, "tool_calls"
    if tool_form:
        return {"role": "assistant", "content": f"No plan: the executor's output is not a valid task graph "
                                                f"({plan['error']})."}, finish
    return {"role": "assistant",
            "content": json.dumps(plan["graph"], ensure_ascii=False) if plan["valid"] else raw}, finish
