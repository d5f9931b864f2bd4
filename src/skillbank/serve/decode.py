"""Greedy decoding of one batch whose finished rows leave the batch.

``model.generate`` keeps every row of a batch in every step until the longest row ends, so a row that
stopped after 30 tokens still pays for the 130 steps of its longest neighbour. Task graphs vary a lot in
length (one node to five), which on a CPU made most of a batch's work padding. Here a row that emits a stop
token (or reaches its cap) is dropped from the input, the attention mask and the KV cache
(``Cache.batch_select_indices``) before the next step, so each step costs only the rows still writing.

The arithmetic per row is that of ``skillbank.model.generate.generate``: the same left padding, position
ids (``cumsum(mask) - 1``), greedy arg-max, stop tokens and text decoding, so the outputs are the same
(tests compare them). Rows may use different LoRA shards: ``adapter_names`` is PEFT's mixed-adapter batch,
each shard applied to its own rows only.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from skillbank.model.prompts import encode_text, stop_token_ids


@dataclass(frozen=True)
class Decoded:
    text: str
    n_tokens: int  # generated, the stop token included
    stopped: bool  # False: it ran into the cap


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


@torch.inference_mode()
def greedy_shrinking(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int,
                     adapter_names: Sequence[str] | None = None) -> list[Decoded]:
    """Greedy-decode rendered prompts as one batch; outputs in input order. ``model``: a causal LM or a
    ``peft.PeftModel`` (with ``adapter_names``, one adapter per prompt)."""
    from transformers import DynamicCache

    model.eval()
    device = next(model.parameters()).device
    stops = set(stop_token_ids(tokenizer, model))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops)
    ids, mask = _left_pad([encode_text(tokenizer, p) for p in prompts], pad_id)
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    live = list(range(len(prompts)))  # original index of each row still in the batch
    names = list(adapter_names) if adapter_names is not None else None
    tokens: list[list[int]] = [[] for _ in prompts]
    stopped = [False] * len(prompts)
    cache = DynamicCache()

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    # transformers renamed past_key_values to cache (5.x deprecates the old name); use what this one takes.
    cache_arg = "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"

    def forward(input_ids, position_ids):
        extra = {"adapter_names": names} if names is not None else {}
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                    logits_to_keep=1, **{cache_arg: cache}, **extra)
        return out.logits[:, -1, :]

    logits = forward(ids, positions)
    last_pos = positions[:, -1]
    for _ in range(max_new_tokens):
        nxt = logits.argmax(dim=-1)  # [b]
        keep = []
        for row, (i, t) in enumerate(zip(live, nxt.tolist())):
            tokens[i].append(t)
            if t in stops:
                stopped[i] = True
            elif len(tokens[i]) < max_new_tokens:
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(live):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, nxt, last_pos = mask[index], nxt[index], last_pos[index]
            live = [live[r] for r in keep]
            if names is not None:
                names = [names[r] for r in keep]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        last_pos = last_pos + 1
        logits = forward(nxt[:, None], last_pos[:, None])
    results = []
    for i, toks in enumerate(tokens):
        body = toks[:-1] if stopped[i] else toks
        results.append(Decoded(tokenizer.decode(body, skip_special_tokens=True).strip(), len(toks), stopped[i]))
    return results
