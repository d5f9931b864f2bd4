"""The closed-book prompt: a fixed system instruction plus ``Plan the following request: <request>``.

Nothing else enters the prompt -- no family label, skill name, catalog or example. The
system instruction is a setting: :data:`PAPER_SYSTEM_PROMPT` is the paper's (Figure A1, ~120 tokens),
:data:`DEFAULT_SYSTEM_PROMPT` a short one. A fine-tuned executor learns the output format from its
targets, and on a small CPU prompt tokens dominate training cost (every example pays for them in the
forward and backward pass), so the short one is the default; bench/train_probe.py measures both.

The prompt is rendered with the tokenizer's chat template, thinking disabled (``enable_thinking=False``,
ignored by templates without it), ending with the opened assistant turn. The training target is the
serialised graph followed by the template's end-of-turn token, so greedy generation stops there.
Prompt and target are tokenized separately, exactly as at inference (the model continues the prompt's
token ids), so no token straddles the boundary.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from skillbank.errors import ModelError

PAPER_SYSTEM_PROMPT = (
    "You are a task-automation planner. Return exactly one JSON object and no other text. The JSON object "
    "must have exactly these two keys in this order: task_nodes, task_links. task_nodes is a non-empty "
    "topologically ordered list. Every node has exactly task and arguments. task is an exact canonical skill "
    "identifier. arguments is a list of objects with exactly name and value. task_links is a list of objects "
    "with exactly source and target. Use <node-i> when an argument consumes node i. Use the minimum skills "
    "needed. Do not emit markdown, explanation, a skill list, a plan, or text before or after JSON."
)
DEFAULT_SYSTEM_PROMPT = "You are a task-automation planner. Reply with the task graph only."
USER_TEMPLATE = "Plan the following request: {request}"
IGNORE_INDEX = -100  # label of positions that carry no loss (prompt and padding)


def messages(request: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> list[dict]:
    """The chat messages for one request. An empty ``system_prompt`` still gives an (empty) system turn,
    so templates that insert their own default system text (SmolLM2's is 20 tokens) do not."""
    return [{"role": "system", "content": system_prompt},
            {"role": "user", "content": USER_TEMPLATE.format(request=request.strip())}]


def _template(tokenizer, msgs: list[dict], add_generation_prompt: bool) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError("the base model's tokenizer has no chat template; use an instruction-tuned model")
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         enable_thinking=False)


def render_prompt(tokenizer, request: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """The prompt string for ``request``: chat template applied, ending with the open assistant turn."""
    return _template(tokenizer, messages(request, system_prompt), add_generation_prompt=True)


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` as written: the chat template already contains every special token."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_ids(tokenizer, request: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> list[int]:
    return encode_text(tokenizer, render_prompt(tokenizer, request, system_prompt))


def end_of_turn_id(tokenizer) -> int:
    """The token that closes an assistant turn in the chat template (``<|im_end|>``, ``<|eot_id|>``, ...).

    Found by rendering a one-word assistant reply and tokenizing what the template writes after it; when
    that is not a single special token, the tokenizer's EOS is used.
    """
    cached = getattr(tokenizer, "_skillbank_eot_id", None)
    if cached is not None:
        return cached
    sentinel = "SKILLBANKSENTINEL"
    msgs = messages("x", "s") + [{"role": "assistant", "content": sentinel}]
    text = _template(tokenizer, msgs, add_generation_prompt=False)
    after = text[text.rfind(sentinel) + len(sentinel):]
    ids = encode_text(tokenizer, after)
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    eot = ids[0] if ids and ids[0] in special else tokenizer.eos_token_id
    if eot is None:
        raise ModelError("cannot find the end-of-turn token: the tokenizer has no EOS and the chat template "
                         "writes no special token after an assistant reply")
    try:
        tokenizer._skillbank_eot_id = int(eot)
    except AttributeError:  # a tokenizer that refuses new attributes: just recompute next time
        pass
    return int(eot)


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """Every id that ends a generation: end-of-turn, the tokenizer's EOS, the model's generation-config EOS."""
    ids = {end_of_turn_id(tokenizer)}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update([int(gen_eos)] if isinstance(gen_eos, int) else [int(i) for i in gen_eos])
    return sorted(ids)


@dataclass(frozen=True)
class Example:
    """One tokenized training pair.

    input_ids: prompt ids followed by target ids (the last one is the end-of-turn token), length L.
    labels: length L; IGNORE_INDEX on the prompt, the token id on every target position, so the loss
        (next-token prediction, shifted by one inside the loss) covers exactly the target tokens.
    n_prompt: number of prompt tokens (L - n_prompt target tokens).
    """

    input_ids: list[int]
    labels: list[int]
    n_prompt: int

    @property
    def n_target(self) -> int:
        return len(self.input_ids) - self.n_prompt


def hash_examples(hasher, examples: Sequence[Example]) -> None:
    """Feed tokenized examples, in order, into a hashlib ``hasher``: the part of a training's identity that the
    stage cache's keys and the fit checkpoints' fingerprints share."""
    for ex in examples:
        hasher.update(json.dumps([ex.input_ids, ex.labels]).encode())


def build_example(tokenizer, request: str, target: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> Example:
    """Tokenize one (request, serialised target) pair with a label mask over the target only."""
    p = prompt_ids(tokenizer, request, system_prompt)
    t = encode_text(tokenizer, target) + [end_of_turn_id(tokenizer)]
    return Example(input_ids=p + t, labels=[IGNORE_INDEX] * len(p) + t, n_prompt=len(p))
