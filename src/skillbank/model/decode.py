"""Greedy decoding of a batch whose rows come and go: iteration-level ("continuous") batching.

Used by :func:`skillbank.model.generate.generate` (offline: a finished row's slot is refilled from the queue)
and by the service's engine (online: requests join between steps).

``model.generate`` keeps every row of a batch in every step until the longest row ends, and takes no new
row before that, so a row that stopped after 30 tokens still pays for the 130 steps of its longest
neighbour and a new request waits for all of them. Task graphs vary a lot in length (one node to five), which
on a CPU made most of a static batch's work padding. :class:`RowBatch` instead

- drops a row from the input, the attention mask and the KV cache as soon as it emits a stop token or
  reaches its own cap (``Cache.batch_select_indices``), so a step costs only the rows still writing;
- takes new rows between two steps: they are prefilled together, then their KV cache and attention mask are
  left-padded (or the batch's are) to a common length and concatenated - masked padding, exactly as the
  left padding of an ordinary batch; columns that no live row attends to any more are cut off.

The arithmetic per row is that of ``transformers``' ``generate`` with greedy search: left padding, position
ids (``cumsum(mask) - 1``), arg-max, stop tokens, so the outputs are the same (tests compare them).

Rows may use different LoRA shards. With one shard in the batch, that shard is simply the active adapter. With
several, ``lora`` says how each row gets its own shard's update:

- ``"gathered"``: every LoRA layer applies each row's shard in one gathered, batched operation over stacked
  copies of all the shards' weights (:mod:`skillbank.model.multi_lora`); the step costs about a one-shard step
  whatever the number of shards;
- ``"peft"``: PEFT's ``adapter_names`` (mixed-adapter batch): per LoRA layer one sub-batch pass per distinct
  shard, so a step costs more with every shard in it;
- ``"auto"`` (the default): ``"gathered"``, unless the loaded adapters are something it cannot apply exactly
  (LoRA variants such as DoRA, a LoRA bias, ...): then ``"peft"``, with a logged warning saying why.

Both give the same outputs (tests compare logits and decodes). A row whose adapter is None runs the active
adapter (a batch of only such rows is the model as it is); ``"__base__"`` names the bare base model.

Constrained rows: a row may carry a :class:`~skillbank.model.constrain.RowMatcher` (its shard's grammar). Before
each pick the matcher fills the row's allowed-token bitmask and disallowed logits become -inf, so every row of a
mixed batch follows its own grammar; the picked token is then consumed by the matcher. A row whose grammar
allows no token ends as not stopped, with the reason. The log-probability a row accumulates is read from the
model's own distribution, before masking.

Prefix reuse: every prompt of a shard starts with the same chat-template tokens (system prompt, user-turn
header, the fixed request lead-in: ~30 of ~80 tokens on the built-in stream), and under causal attention
their keys and values depend on nothing after them. :class:`PrefixKV` keeps them per shard (the shard's LoRA
changes k/v, so not across shards) and a joining row prefills only its own tail: a row then reads
``[pad][prefix][pad][tail]``, the middle padding masked exactly like the left padding. Prefill is the part
of a request's cost that batching cannot share, so this matters most when many rows decode together.
Written by hand: transformers' generate has no cross-request prefix cache (vLLM's automatic prefix caching
is the server-side equivalent).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

import torch.nn.functional as F

from skillbank.errors import ModelError
from skillbank.model.multi_lora import BASE, StackedLoRA, UnsupportedLoRA
from skillbank.model.prompts import encode_text, stop_token_ids

log = logging.getLogger("skillbank.model")

LORA_PATHS = ("auto", "gathered", "peft")  # how rows of different shards get their own LoRA (module docstring)


@dataclass(frozen=True)
class Decoded:
    text: str
    n_tokens: int  # generated, the stop token included
    stopped: bool  # False: it ran into the cap or its grammar's dead end
    mean_logprob: float  # of the generated tokens (stop token included), natural log, under the unconstrained model
    reason: str | None = None  # why it did not stop (None when it stopped)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows padded on the left into ids [B, T] and attention mask [B, T] (decoder-only generation
    continues every row from its last position)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


@dataclass
class Row:
    key: Any  # the caller's handle for this row
    adapter: str | None
    cap: int
    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0  # summed over ``tokens``
    matcher: Any = None  # a skillbank.model.constrain.RowMatcher: the row may only write what its grammar allows


class RowBatch:
    """The rows being decoded together. ``add`` rows, then ``step`` until ``rows`` is empty.

    model: a causal LM or a ``peft.PeftModel`` whose adapters the rows name; base: the LoadedBase owning it
    (to switch the active adapter when all rows use one, and holding the stacked shards of ``lora="gathered"``).
    lora: ``"auto"``, ``"gathered"`` or ``"peft"``: how a batch of several shards applies them (module docstring)."""

    def __init__(self, model, tokenizer, base=None, *, reuse_prefixes: bool = True, min_prefix_tokens: int = 8,
                 lora: str = "auto", prefixes: "PrefixKV | None" = None):
        if lora not in LORA_PATHS:
            raise ModelError(f"lora must be one of {list(LORA_PATHS)}, got {lora!r}")
        self.model, self.tokenizer, self.base, self.lora = model, tokenizer, base, lora
        self._stacked: StackedLoRA | None = None  # without a LoadedBase: this batch's own stack
        self._refused: tuple | None = None  # under "auto": the adapter set the gathered path refused
        self._lean: dict = {}  # adapter name -> its LoRA layers' weights, for the one-shard forward (_lean_lora)
        _check_attention_only(model)
        # prefixes: a caller's store, kept across batches (the same model and adapters: it is the caller's to drop
        # when they change); else this batch's own.
        self.prefixes = (prefixes if prefixes is not None else PrefixKV(min_prefix_tokens)) if reuse_prefixes else None
        self.device = next(model.parameters()).device
        self.stops = set(stop_token_ids(tokenizer, model))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stops)
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._cache_arg = cache_keyword(lm)
        self.rows: list[Row] = []
        self._bitmask: torch.Tensor | None = None  # reused allowed-token bitmask, a row per batch row
        self._reset()

    def _reset(self) -> None:
        self.cache = self.mask = self.last_pos = self.logits = None
        self.rows = []

    def forget_prefixes(self) -> None:
        """Drop the reused prefixes (call when the model's adapters change)."""
        self._lean = {}
        if self.prefixes is not None:
            self.prefixes = PrefixKV(self.prefixes.min_tokens)

    def _forward(self, cache, input_ids, mask, position_ids, adapters: list[str | None]):
        extra, mixed = {}, contextlib.nullcontext()
        names = self._named(adapters)
        if names is None:
            mixed = self._lean_lora(None)
        else:
            distinct = set(names)
            if len(distinct) == 1 and self.base is not None and BASE not in distinct:
                if self.base.active_adapter != names[0]:
                    self.base.activate(names[0])  # the plain one-adapter forward: cheaper than any mixed batch
                mixed = self._lean_lora(names[0])
            else:
                stack = self._stack()
                if stack is not None:
                    mixed = stack.applied(names)
                else:
                    extra["adapter_names"] = names
        with mixed:
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                             logits_to_keep=1, **{self._cache_arg: cache}, **extra)
        return out.logits[:, -1, :]

    def _lean_lora(self, name: str | None):
        """A context in which the LoRA layers of adapter ``name`` (None: the model's one active adapter) run
        :func:`_lean_forward` instead of PEFT's own; a null context where that is not exact (see there)."""
        peft = self.base.peft if self.base is not None and self.base.peft is not None else self.model
        if not hasattr(peft, "peft_config"):
            return contextlib.nullcontext()
        if name is None:
            active = list(peft.active_adapters)
            if len(active) != 1:
                return contextlib.nullcontext()
            name = active[0]
        layers = self._lean.get(name)
        if layers is None or (layers and layers[0][0].lora_A._modules.get(name) is not layers[0][2]):
            layers = self._lean[name] = _lean_layers(peft, name)  # first use, or the adapter was loaded again
        return _patched(layers) if layers else contextlib.nullcontext()

    def _named(self, adapters: list[str | None]) -> list[str] | None:
        """Every row's adapter by name, None for a batch of unnamed rows only (the model runs as it is).

        An unnamed row runs the active adapter: next to named rows it is given that adapter's name, so it
        keeps it in a mixed batch; several adapters active together cannot be given to one row."""
        if all(a is None for a in adapters):
            return None
        if None not in adapters:
            return list(adapters)
        peft = self.base.peft if self.base is not None else self.model
        if not hasattr(peft, "peft_config"):
            raise ModelError("rows name adapters, but the model holds none (pass the PeftModel or its LoadedBase)")
        active = list(peft.active_adapters)
        if len(active) != 1:
            raise ModelError(f"rows without an adapter run the active one, but {active or 'none'} are active; "
                             "name every row's adapter in a batch that mixes shards")
        return [active[0] if a is None else a for a in adapters]

    def _stack(self) -> StackedLoRA | None:
        """The stacked shards for a gathered mixed batch; None: use PEFT's per-adapter path."""
        if self.lora == "peft":
            return None
        peft = self.base.peft if self.base is not None else self.model
        key = tuple(getattr(peft, "peft_config", None) or ())
        if self.lora == "auto" and self._refused == key:
            return None  # refused for these very adapters (and said so) already
        try:
            if self.base is not None:
                return self.base.stacked_lora()
            if self._stacked is None or not self._stacked.sync():
                self._stacked = None
                self._stacked = StackedLoRA(self.model)
            return self._stacked
        except UnsupportedLoRA as exc:
            if self.lora == "gathered":
                raise
            log.warning("mixed-shard batches take PEFT's per-adapter path (slower with every shard): %s", exc)
            self._refused = key
            return None

    def add(self, prompts: Sequence[str], keys: Sequence[Any], adapters: Sequence[str | None], caps: Sequence[int],
            matchers: Sequence[Any] | None = None) -> None:
        """Prefill new rows (rendered prompt strings) and join them to the batch. ``matchers``: per row a fresh
        :class:`~skillbank.model.constrain.RowMatcher` (or None: unconstrained)."""
        self.add_ids([encode_text(self.tokenizer, p) for p in prompts], keys, adapters, caps, matchers)

    @torch.inference_mode()
    def add_ids(self, ids: Sequence[list[int]], keys: Sequence[Any], adapters: Sequence[str | None],
                caps: Sequence[int], matchers: Sequence[Any] | None = None) -> None:
        """:meth:`add` for prompts already tokenized."""
        adapters, ids = list(adapters), list(ids)
        heads = self._reused_heads(adapters, ids)  # per row: (reused prefix tokens, their k/v per layer)
        width = max(len(tokens) for tokens, _ in heads)
        cache = growing_cache()
        if width:
            # every row's reused k/v left-padded to the longest prefix: [rows, kv_heads, width, head_dim]
            some = next(kv for h, kv in heads if h)
            for layer in range(len(some)):
                keys_, values_ = ([_left_padded(kv[layer][i] if kv else None, width, some[layer][i]) for _, kv in heads]
                                  for i in (0, 1))
                cache.update(torch.cat(keys_), torch.cat(values_), layer)
        tail_ids, tail_mask = left_pad([t[len(h):] for t, (h, _) in zip(ids, heads)], self.pad_id)
        head_mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h, _ in heads],
                                 dtype=tail_mask.dtype).reshape(len(ids), width)
        mask = torch.cat([head_mask, tail_mask], dim=1).to(self.device)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, width:]
        tail_ids = tail_ids.to(self.device)
        logits = self._forward(cache, tail_ids, mask, positions, adapters)
        matchers = list(matchers) if matchers is not None else [None] * len(ids)
        new_rows = [Row(k, a, c, matcher=m) for k, a, c, m in zip(keys, adapters, caps, matchers)]
        if not self.rows:
            self.cache, self.mask, self.last_pos, self.logits = cache, mask, positions[:, -1], logits
            self.rows = new_rows
            return
        old_w, new_w = self.mask.shape[1], mask.shape[1]
        width = max(old_w, new_w)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            # [b, kv_heads, length, head_dim]: pad the length on the left, then stack the rows
            mine.keys = torch.cat([_left_padded(mine.keys, width), _left_padded(theirs.keys, width)])
            mine.values = torch.cat([_left_padded(mine.values, width), _left_padded(theirs.values, width)])
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
        nxt, dead = self._pick()
        # The confidence Self-route compares: log-probability of each picked token under the model itself,
        # not renormalised over what the grammar allows (a forced token would otherwise look certain).
        picked = torch.log_softmax(self.logits.float(), dim=-1).gather(1, nxt[:, None]).squeeze(1)
        done, keep = [], []
        for r, (row, t, lp) in enumerate(zip(self.rows, nxt.tolist(), picked.tolist())):
            if drop and row.key in drop:
                done.append((row, None))
                continue
            if r in dead:
                done.append((row, self._decoded(row, False, dead[r])))
                continue
            row.tokens.append(t)
            row.logprob += lp
            if row.matcher is not None and not row.matcher.consume(t):
                done.append((row, self._decoded(row, False, f"grammar dead end: {row.matcher.error[:200]}")))
            elif t in self.stops:
                done.append((row, self._decoded(row, True)))
            elif len(row.tokens) >= row.cap:
                done.append((row, self._decoded(row, False, f"hit the token cap ({row.cap}) before the output ended")))
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

    def _pick(self) -> tuple[torch.Tensor, dict[int, str]]:
        """Each row's greedy next token; a constrained row's among the tokens its grammar allows. Also the rows
        whose grammar allows nothing (a dead end: reported, never decoded into a guess)."""
        nxt = self.logits.argmax(dim=-1)
        constrained = [r for r, row in enumerate(self.rows) if row.matcher is not None]
        dead: dict[int, str] = {}
        if constrained:
            # Masking only removes tokens, so where the grammar allows the free pick, the pick stands: asking the
            # matcher about that one token (~2 us) spares filling and applying a whole-vocabulary mask (~70 us,
            # plus a masked arg-max); a trained executor's pick is allowed at most steps.
            picks = nxt.tolist()
            weighed = {r for r in constrained if _weighs(self.rows[r].matcher)}
            constrained = [r for r in constrained if r in weighed or not _allows(self.rows[r].matcher, picks[r])]
        if not constrained:
            return nxt, dead
        from skillbank.model.constrain import apply_bitmask

        words = (self.logits.shape[-1] + 31) // 32
        if self._bitmask is None or self._bitmask.shape[0] < len(self.rows) or self._bitmask.shape[1] != words:
            self._bitmask = torch.full((max(len(self.rows), 16), words), -1, dtype=torch.int32)
        for r in constrained:
            self.rows[r].matcher.fill(self._bitmask, r)
        index = torch.tensor(constrained, device=self.logits.device)
        masked = self.logits[index].float()
        apply_bitmask(masked, self._bitmask[constrained])
        for k, r in enumerate(constrained):
            if r in weighed:  # a skill name chosen under a prior (SkillPrior)
                allowed = torch.isfinite(masked[k]).nonzero().flatten()
                bias = self.rows[r].matcher.bias(allowed.cpu().numpy())
                masked[k, allowed] += torch.as_tensor(bias, device=masked.device)
        best, choice = masked.max(dim=-1)
        nxt[index] = choice
        for r, value in zip(constrained, best.tolist()):
            if value == float("-inf"):
                dead[r] = f"grammar dead end: no token is allowed ({self.rows[r].matcher.error[:200] or 'empty mask'})"
        return nxt, dead

    def _reused_heads(self, adapters: list[str | None], ids: list[list[int]]) -> list:
        """Per row the prefix it can skip (tokens, per-layer k/v); empty when prefix reuse is off."""
        if self.prefixes is None:
            return [([], None) for _ in ids]
        for adapter, tokens in zip(adapters, ids):  # a shard's first prompt seeds its prefix
            if adapter not in self.prefixes.entries and len(tokens) > self.prefixes.min_tokens:
                self.prefixes.seed(adapter, tokens, self._prefix_kv(adapter, tokens[:-1]))
        return [self.prefixes.lookup(a, t) for a, t in zip(adapters, ids)]

    def _prefix_kv(self, adapter: str | None, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values of ``tokens`` (one row, no padding) under ``adapter``, per layer."""
        cache = growing_cache()
        ids = torch.tensor([tokens], device=self.device)
        self._forward(cache, ids, torch.ones_like(ids), torch.arange(len(tokens), device=self.device)[None], [adapter])
        return [(layer.keys, layer.values) for layer in cache.layers]

    def _decoded(self, row: Row, stopped: bool, reason: str | None = None) -> Decoded:
        body = row.tokens[:-1] if stopped else row.tokens
        return Decoded(self.tokenizer.decode(body, skip_special_tokens=True).strip(), len(row.tokens), stopped,
                       row.logprob / max(1, len(row.tokens)), reason)


def _weighs(matcher) -> bool:
    """Whether ``matcher`` weighs its next token by a skill prior (it is choosing a skill name)."""
    active = getattr(matcher, "active", None)
    return active is not None and active()


def _allows(matcher, token: int) -> bool:
    """Whether ``matcher`` says at once that it allows ``token`` (False also where it cannot tell: a matcher
    without ``allows`` is asked for its whole mask)."""
    allows = getattr(matcher, "allows", None)
    return allows is not None and allows(token) is True


# Layer kinds whose cache is plain keys and values along the sequence, which is what joining, trimming and
# prefix reuse edit. A sliding window is applied by the attention mask over cache columns, which for a
# padded row can only narrow its window, and only past the window's length (thousands of tokens).
_KV_LAYER_TYPES = {"full_attention", "sliding_attention", "chunked_attention"}


def _check_attention_only(model) -> None:
    """Refuse models with layers whose cache is not keys/values (linear attention, state-space, conv):
    editing their cache row by row would silently decode wrong tokens."""
    from skillbank.errors import ModelError

    config = getattr(model, "config", None)
    kinds = set(getattr(config, "layer_types", None) or [])
    others = sorted(kinds - _KV_LAYER_TYPES)
    if others:
        raise ModelError(f"row-batch decoding needs attention layers with a key/value cache; "
                         f"{getattr(config, 'model_type', type(model).__name__)} also has layer types {', '.join(others)}")


def _left_padded(kv: torch.Tensor | None, width: int, like: torch.Tensor | None = None) -> torch.Tensor:
    """``kv`` ([rows, kv_heads, length, head_dim], or None for nothing: zeros shaped after ``like``)
    left-padded with zeros to ``width``."""
    if kv is None:
        return like.new_zeros(like.shape[:2] + (width,) + like.shape[3:])
    return F.pad(kv, (0, 0, width - kv.shape[2], 0))


# -- the cache and the one-shard LoRA forward ------------------------------------------------------------------
def cache_keyword(module) -> str:
    """The keyword ``module.forward`` takes its KV cache by: transformers renamed ``past_key_values`` to
    ``cache`` (5.x deprecates the old name)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def growing_cache():
    """A ``DynamicCache`` whose layers append in place (:class:`_GrowingLayer`); a plain one where transformers
    builds its layers otherwise (versions before the ``layer_class_to_replicate`` hook)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if not cache.layers and getattr(cache, "layer_class_to_replicate", None) is not None:
        cache.layer_class_to_replicate = _growing_layer_class()
    return cache


@functools.cache
def _growing_layer_class():
    from transformers.cache_utils import DynamicLayer

    class _GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values are views of a buffer with room to spare: appending a token
        writes into the buffer instead of concatenating, which copied the whole cache of every layer at every
        step (at batch 16 on the built-in requests ~7% of a decode step). Whoever replaces ``keys`` / ``values``
        (row selection, trimming, joining rows: :class:`RowBatch`) simply makes the next append start a new
        buffer from them. The values are those of ``torch.cat``: the same tensors, only stored once."""

        _k = _v = None  # the buffers
        _view = _vview = None  # the views last handed out: anything else in keys/values was put there from outside

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, t = (self.keys.shape[-2] if self.keys.dim() == 4 else 0), key_states.shape[-2]
            if self.keys is not self._view or self.values is not self._vview or n + t > self._k.shape[-2] \
                    or self._k.shape[0] != key_states.shape[0]:
                room = n + t + max(32, n + t)  # doubling: appends cost O(1) per token, amortised
                self._k = key_states.new_empty(key_states.shape[:2] + (room,) + key_states.shape[3:])
                self._v = value_states.new_empty(value_states.shape[:2] + (room,) + value_states.shape[3:])
                if n:
                    self._k[:, :, :n].copy_(self.keys)
                    self._v[:, :, :n].copy_(self.values)
            self._k[:, :, n:n + t].copy_(key_states)
            self._v[:, :, n:n + t].copy_(value_states)
            self.keys, self.values = self._view, self._vview = self._k[:, :, :n + t], self._v[:, :, :n + t]
            return self.keys, self.values

        def batch_select_indices(self, indices):
            """Keep rows ``indices``: their buffers are selected, so the next append needs no new one."""
            if self.keys is not self._view or self.values is not self._vview or self.get_seq_length() == 0:
                return super().batch_select_indices(indices)
            n = self.keys.shape[-2]
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._view, self._vview = self._k[:, :, :n], self._v[:, :, :n]

    return _GrowingLayer


def _lean_layers(peft, name: str) -> list[tuple]:
    """(module, forward, its lora_A) for every LoRA layer of ``peft`` holding adapter ``name``, when PEFT's
    forward there is exactly ``base(x) + B(A(x)) * scale`` (a plain ``Linear`` base, no variant, no LoRA bias,
    not merged, ``name`` its one active adapter; dropout is checked per call); else [] (PEFT's own forward then
    runs everywhere)."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import Linear

    out = []
    for module in peft.modules():
        if not isinstance(module, LoraLayer) or name not in getattr(module, "lora_A", {}):
            continue
        dropout = module.lora_dropout[name]
        if (type(module) is not Linear or type(module.base_layer) is not torch.nn.Linear  # noqa: E721
                or module.merged or name in module.lora_variant or module.lora_bias.get(name)
                or list(module.active_adapters) != [name]
                or not isinstance(dropout, (torch.nn.Identity, torch.nn.Dropout))):
            return []
        out.append((module, _lean_forward(module, name), module.lora_A[name]))
    return out


def _lean_forward(module, name: str):
    """PEFT's LoRA ``Linear`` forward for one active adapter, the same operations in the same order (so the
    same numbers) without its per-call bookkeeping: the base layer, then ``+ B(A(x)) * scale``. ~120 such
    layers run per token on SmolLM2, and PEFT's checks and sub-module calls around two small matmuls were a
    tenth of a batch-1 decode step."""
    base, a, b, dropout = module.base_layer, module.lora_A[name], module.lora_B[name], module.lora_dropout[name]
    plain = type(module).forward

    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or kwargs or module.disable_adapters or module.training or dropout.training \
                or module.lora_A._modules.get(name) is not a or module.lora_B._modules.get(name) is not b:
            return plain(module, x, *args, **kwargs)  # dropout live, adapters off or replaced: PEFT's path
        result = F.linear(x, base.weight, base.bias)
        if getattr(module, "cast_input_dtype_enabled", True) and x.dtype != a.weight.dtype:
            x = x.to(a.weight.dtype)
        return (result + F.linear(F.linear(x, a.weight), b.weight) * module.scaling[name]).to(result.dtype)

    return forward


@contextlib.contextmanager
def _patched(layers: list[tuple]):
    """Within this block each module runs its given forward (set on the instance, as StackedLoRA.applied does)."""
    try:
        for module, forward, _ in layers:
            module.__dict__["forward"] = forward
        yield
    finally:
        for module, _, _ in layers:
            module.__dict__.pop("forward", None)


class PrefixKV:
    """Per shard: the longest token prefix shared by every prompt seen so far, with its keys and values.

    Seeded with a shard's first prompt (all of it but the last token, whose logits the row needs), then cut
    back to the part the next prompts share - a causal model's cached k/v of a prefix is a prefix of the
    cache, so cutting is slicing. A prompt sharing fewer than ``min_tokens`` with it is prefilled whole.
    """

    def __init__(self, min_tokens: int = 8):
        self.min_tokens = min_tokens
        self.entries: dict[str | None, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = {}

    def seed(self, adapter: str | None, prompt: list[int], kv) -> None:
        self.entries[adapter] = (list(prompt[:-1]), kv)

    def lookup(self, adapter: str | None, prompt: list[int]):
        """(prefix tokens, per-layer k/v) to reuse for ``prompt``; ([], None) when ``adapter`` has no entry
        or its entry shares fewer than ``min_tokens`` with ``prompt``."""
        entry = self.entries.get(adapter)
        if entry is None:
            return [], None
        tokens, kv = entry
        limit = min(len(tokens), len(prompt) - 1)
        shared = next((i for i in range(limit) if tokens[i] != prompt[i]), limit)
        if shared < self.min_tokens:
            return [], None
        if shared < len(tokens):
            kv = [(k[:, :, :shared], v[:, :, :shared]) for k, v in kv]
            self.entries[adapter] = (tokens[:shared], kv)
        return tokens[:shared], kv
