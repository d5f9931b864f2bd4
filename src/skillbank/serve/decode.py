"""Greedy decoding of a batch whose rows come and go: iteration-level ("continuous") batching.

``model.generate`` keeps every row of a batch in every step until the longest row ends, and takes no new
row before that, so a row that stopped after 30 tokens still pays for the 130 steps of its longest
neighbour and a new request waits for all of them. Task graphs vary a lot in length (one node to five), which
on a CPU made most of a static batch's work padding. :class:`RowBatch` instead

- drops a row from the input, the attention mask and the KV cache as soon as it emits a stop token or
  reaches its own cap (``Cache.batch_select_indices``), so a step costs only the rows still writing;
- takes new rows between two steps: they are prefilled together, then their KV cache and attention mask are
  left-padded (or the batch's are) to a common length and concatenated - masked padding, exactly as the
  left padding of an ordinary batch; columns that no live row attends to any more are cut off.

The arithmetic per row is that of ``skillbank.model.generate.generate``: the same left padding, position
ids (``cumsum(mask) - 1``), greedy arg-max, stop tokens and text decoding, so the outputs are the same
(tests compare them). Rows may use different LoRA shards: with several shards in the batch each forward
passes PEFT's ``adapter_names`` (mixed-adapter batch, each shard applied to its own rows only); with one,
that shard is simply the active adapter.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

import torch.nn.functional as F

from skillbank.model.generate import left_pad
from skillbank.model.prompts import encode_text, stop_token_ids


@dataclass(frozen=True)
class Decoded:
    text: str
    n_tokens: int  # generated, the stop token included
    stopped: bool  # False: it ran into the cap


@dataclass
class Row:
    key: Any  # the caller's handle for this row
    adapter: str | None
    cap: int
    tokens: list[int] = field(default_factory=list)


class RowBatch:
    """The rows being decoded together. ``add`` rows, then ``step`` until ``rows`` is empty.

    model: a causal LM or a ``peft.PeftModel`` whose adapters the rows name; base: the LoadedBase owning it
    (to switch the active adapter when all rows use one)."""

    def __init__(self, model, tokenizer, base=None):
        self.model, self.tokenizer, self.base = model, tokenizer, base
        self.device = next(model.parameters()).device
        self.stops = set(stop_token_ids(tokenizer, model))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stops)
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        # transformers renamed past_key_values to cache (5.x deprecates the old name): use what it takes.
        self._cache_arg = "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"
        self.rows: list[Row] = []
        self._reset()

    def _reset(self) -> None:
        self.cache = self.mask = self.last_pos = self.logits = None
        self.rows = []

    def _forward(self, cache, input_ids, mask, position_ids, adapters: list[str | None]):
        extra = {}
        names = set(adapters)
        if None not in names:
            if len(names) > 1 or self.base is None:
                extra["adapter_names"] = list(adapters)
            elif self.base.active_adapter != adapters[0]:
                self.base.activate(adapters[0])  # cheaper than a mixed batch of one shard
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                         logits_to_keep=1, **{self._cache_arg: cache}, **extra)
        return out.logits[:, -1, :]

    @torch.inference_mode()
    def add(self, prompts: Sequence[str], keys: Sequence[Any], adapters: Sequence[str | None], caps: Sequence[int]) -> None:
        """Prefill new rows (rendered prompt strings) and join them to the batch."""
        from transformers import DynamicCache

        ids, mask = left_pad([encode_text(self.tokenizer, p) for p in prompts], self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        cache = DynamicCache()
        logits = self._forward(cache, ids, mask, positions, list(adapters))
        new_rows = [Row(k, a, c) for k, a, c in zip(keys, adapters, caps)]
        if not self.rows:
            self.cache, self.mask, self.last_pos, self.logits = cache, mask, positions[:, -1], logits
            self.rows = new_rows
            return
        old_w, new_w = self.mask.shape[1], mask.shape[1]
        width = max(old_w, new_w)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            # [b, kv_heads, length, head_dim]: pad the length on the left, then stack the rows
            mine.keys = torch.cat([F.pad(mine.keys, (0, 0, width - old_w, 0)), F.pad(theirs.keys, (0, 0, width - new_w, 0))])
            mine.values = torch.cat([F.pad(mine.values, (0, 0, width - old_w, 0)),
                                     F.pad(theirs.values, (0, 0, width - new_w, 0))])
        self.mask = torch.cat([F.pad(self.mask, (width - old_w, 0)), F.pad(mask, (width - new_w, 0))])
        self.last_pos = torch.cat([self.last_pos, positions[:, -1]])
        self.logits = torch.cat([self.logits, logits])
        self.rows += new_rows

    @torch.inference_mode()
    def step(self, drop: set | None = None) -> list[tuple[Row, Decoded | None]]:
        """Pick every row's next token, retire rows that stopped (and rows whose key is in ``drop``), run the
        model once for the rest. Returns the retired rows with their outputs (None for a dropped row)."""
        if not self.rows:
            return []
        nxt = self.logits.argmax(dim=-1)  # [b]
        done, keep = [], []
        for r, (row, t) in enumerate(zip(self.rows, nxt.tolist())):
            row.tokens.append(t)
            if drop and row.key in drop:
                done.append((row, None))
                continue
            if t in self.stops:
                done.append((row, self._decoded(row, True)))
            elif len(row.tokens) >= row.cap:
                done.append((row, self._decoded(row, False)))
            else:
                keep.append(r)
        if not keep:
            self._reset()
            return done
        if len(keep) < len(self.rows):
            index = torch.tensor(keep, device=self.device)
            self.cache.batch_select_indices(index)
            self.mask, nxt, self.last_pos = self.mask[index], nxt[index], self.last_pos[index]
            self.rows = [self.rows[r] for r in keep]
            start = int((self.mask.sum(0) > 0).nonzero()[0])  # columns left of it are padding for every row
            if start > 0:
                for layer in self.cache.layers:
                    layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
                self.mask = self.mask[:, start:]
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=-1)
        self.last_pos = self.last_pos + 1
        self.logits = self._forward(self.cache, nxt[:, None], self.mask, self.last_pos[:, None],
                                    [row.adapter for row in self.rows])
        return done

    def _decoded(self, row: Row, stopped: bool) -> Decoded:
        body = row.tokens[:-1] if stopped else row.tokens
        return Decoded(self.tokenizer.decode(body, skip_special_tokens=True).strip(), len(row.tokens), stopped)


def greedy_shrinking(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int,
                     adapter_names: Sequence[str] | None = None, base=None) -> list[Decoded]:
    """Greedy-decode rendered prompts as one batch whose finished rows leave it; outputs in input order."""
    batch = RowBatch(model, tokenizer, base)
    adapters = list(adapter_names) if adapter_names is not None else [None] * len(prompts)
    batch.add(prompts, list(range(len(prompts))), adapters, [max_new_tokens] * len(prompts))
    out: dict[int, Decoded] = {}
    while batch.rows:
        out.update((row.key, d) for row, d in batch.step())
    return [out[i] for i in range(len(prompts))]
