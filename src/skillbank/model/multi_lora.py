"""Mixed-shard batches in one gathered LoRA pass: every row of a batch gets its own shard's update at once.

A LoRA layer adds ``scale * (x @ A^T) @ B^T`` to the frozen projection ``x @ W^T``. When the rows of a batch
belong to different shards, PEFT's ``adapter_names`` path runs, in every LoRA layer, one sub-batch pass per
distinct adapter (index the rows, two matmuls, index-add back): the cost grows with the number of shards in the
batch - on this CPU a 16-row decode step of 5 shards cost 1.40x a one-shard step, of 16 shards 1.98x
(``bench/mixed_batch.py``; the gathered path: 1.01x and 1.08x). Punica (BGMV) and S-LoRA avoid that loop by gathering each
row's own LoRA matrices and applying all of them in one batched matmul; :class:`StackedLoRA` does the same
with plain torch ops:

- per LoRA layer, the A matrices of every loaded adapter stacked into one tensor ``[slots + 1, in, R]`` and the
  B matrices, scale folded in, into ``[slots + 1, R, out]`` (stored transposed, ready for ``bmm``). Adapters of
  a lower rank are padded to the layer's largest rank ``R`` with zeros, and an adapter that has no LoRA on a
  layer (``layers_to_transform``) is zeros there: zero rows and columns add exact zeros. The last slot is all
  zeros: a row that uses the bare base (PEFT's ``"__base__"``) gets no update;
- for one forward, each row's slot index; every LoRA layer then computes ``base_layer(x)`` plus
  ``bmm(bmm(x, A[slots]), B[slots])``: two ``index_select`` and two ``bmm`` whatever the number of shards.

Measured on this CPU (batch 16, hidden 576, r 16, one thread, one decode token): the delta gathered per row
took 45-70 us per layer; grouping the rows by shard first (``index_select`` of the shards present, the rows
scattered into per-shard blocks for one ``bmm`` and gathered back) took 75-110 us with 16 shards and was even
with 4 shards of 4 rows - the scatter and gather cost what the smaller copy saves. A masked dense product over
all the stacked adapters (no copies) was no faster in a whole decode step, and its cost grows with the
adapters loaded (and with the prompt length at prefill) rather than with the rows in the batch.

Written by hand because PEFT has no gathered multi-LoRA inference path (its mixed batch is the per-adapter
loop above), and vLLM's / S-LoRA's kernels need a GPU server. PEFT's modules stay what they are - training and
saving use them unchanged: the stacks are copies, and only inside :meth:`StackedLoRA.applied` (one forward)
do the LoRA layers take the gathered path instead of their own ``forward``.

Copies go stale when the adapters change. Before each mixed batch the stack follows the model's adapters
(:meth:`StackedLoRA.sync`): a removed or replaced adapter frees its slot, a new one is copied into a free slot
(the stacks double when none is left), and only an adapter that does not fit the stacks (a layer not stacked,
a larger rank, another dtype) rebuilds them; an adapter whose weights changed in place (an optimizer step, ``load_state_dict``, an in-place edit under
``no_grad``: every one of them bumps the tensors' version counter) is copied again before a forward that uses
it. Writes through ``.data`` bypass that counter and are not seen.

What the gathered path does not do is refused (:class:`UnsupportedLoRA`), never approximated: LoRA variants
(DoRA, aLoRA, ...), a LoRA bias, merged adapters, LoRA on layers other than ``Linear`` (embeddings, convs,
quantized linears), adapters of several dtypes in one layer, and dropout on the LoRA input while a layer is in
training mode (at inference dropout is the identity; in training it is random per row, which only PEFT's own
path applies). ``use_rslora`` needs nothing: it only changes the scale, read from the layer. ``fan_in_fan_out``
needs nothing either: it is the base layer's weight layout (GPT-2's Conv1D), and the base layer is called as
PEFT calls it; the LoRA A and B are ordinary ``nn.Linear`` either way.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Sequence

import torch

from skillbank.errors import ModelError

BASE = "__base__"  # a row with this adapter name decodes with the bare base model (PEFT's name for it)


def _plain():
    """No autograd, and ordinary tensors even when called under ``inference_mode`` (where decoding runs): an
    inference tensor could not be refreshed in place later by a caller outside that mode."""
    stack = ExitStack()
    stack.enter_context(torch.inference_mode(False))
    stack.enter_context(torch.no_grad())
    return stack


class UnsupportedLoRA(ModelError):
    """The model holds a LoRA configuration the gathered path cannot apply exactly."""


class _Layer:
    """One PEFT LoRA ``Linear``: its stacked weights and the forward that replaces its own during a batch."""

    __slots__ = ("module", "a", "b", "forward", "dropout", "rows")

    def __init__(self, module, a: torch.Tensor, b: torch.Tensor, dropout: bool, rows: list):
        self.module, self.dropout, self.rows = module, dropout, rows
        self.set_stacks(a, b)

    def set_stacks(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.a, self.b = a, b
        self.forward = _gathered_forward(self.module, a, b, self.rows)


def _problems(path: str, module, names: Sequence[str]) -> list[str]:
    """Why adapters ``names`` on one LoRA layer cannot be applied by the gathered path (empty: they can)."""
    from peft.tuners.lora.layer import Linear

    if type(module) is not Linear:  # noqa: E721 - subclasses (quantized linears) compute differently
        return [f"{path} is a {type(module).__name__}; only peft's lora.Linear is stacked"]
    problems = []
    if module.merged:
        problems.append(f"{path} has merged adapters {module.merged_adapters} (unmerge them first)")
    for n in names:
        if n in module.lora_variant:
            problems.append(f"adapter {n!r} on {path} is a LoRA variant "
                            f"({type(module.lora_variant[n]).__name__}, e.g. DoRA)")
        if module.lora_bias.get(n):
            problems.append(f"adapter {n!r} on {path} has a LoRA bias")
    return problems


class StackedLoRA:
    """The LoRA weights of every adapter of ``model`` (a ``peft.PeftModel``), stacked per LoRA layer.

    Each adapter has a slot; slot 0 is all zeros (:data:`BASE`). ``names``: the adapters held, in slot order.
    Build one per model; :meth:`sync` brings it in line with the model's adapters after some were added or
    removed, copying only the new ones (a bank that keeps ``max_resident`` shards evicts and loads one at a
    time: rebuilding every slot then cost ~15 ms per resident shard on this CPU, at every eviction). Use it with
    ``with stack.applied(adapters): model(...)``."""

    def __init__(self, model):
        from peft.tuners.lora import LoraLayer

        if not hasattr(model, "peft_config"):
            raise ModelError("a mixed-shard batch needs the PeftModel holding the shards (LoadedBase.peft), "
                             f"got {type(model).__name__}")
        self.model = model
        names = tuple(model.peft_config)
        problems = self._config_problems(names)
        layers = []
        for path, module in model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            held = [n for n in names if n in module.lora_A or n in getattr(module, "lora_embedding_A", {})]
            if not held:
                continue
            problems += _problems(path, module, held)
            dtypes = {module.lora_A[n].weight.dtype for n in held if n in module.lora_A} | \
                     {module.lora_B[n].weight.dtype for n in held if n in module.lora_B}
            if len(dtypes) > 1:
                problems.append(f"{path} holds adapters of several dtypes {sorted(map(str, dtypes))}")
            layers.append((module, held))
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            raise UnsupportedLoRA(f"the gathered multi-LoRA path cannot apply this model's adapters exactly: {shown}")

        self.slot: dict[str, int] = {}
        self._free: list[int] = []
        self.capacity = len(names)
        self.layers: list[_Layer] = []
        self._layer_of: dict[int, int] = {}  # id(module) -> index in self.layers
        # Per slot (index 0 unused): the tensors its copies came from, their version counters' sum at the last
        # copy, and a mark: its scale on the first layer holding it (PEFT's set_scale changes every layer at
        # once) and that layer's lora_A module (a re-added adapter of the same name has new modules).
        self._sources: list[list[tuple[int, torch.Tensor, torch.Tensor]]] = [[] for _ in range(self.capacity + 1)]
        self._versions = [-1] * (self.capacity + 1)
        self._marks: list[tuple[Any, str, float, Any] | None] = [None] * (self.capacity + 1)
        self._slot_name: list[str | None] = [None] * (self.capacity + 1)
        self.copies = 0  # slots written (a test reads it: a sync copies only what changed)
        # Slot per row, set for the duration of one forward. The layers' forwards hold this list, not the stack:
        # no reference cycle, so dropping the stack frees its copies at once rather than at the next GC.
        self._rows: list[torch.Tensor | None] = [None]
        with _plain():
            for module, held in layers:
                rank = max(module.lora_A[n].weight.shape[0] for n in held)
                weight = module.lora_A[held[0]].weight
                a = weight.new_zeros((self.capacity + 1, module.in_features, rank))
                b = weight.new_zeros((self.capacity + 1, rank, module.out_features))
                self._layer_of[id(module)] = len(self.layers)
                self.layers.append(_Layer(module, a, b, False, self._rows))
        for name in names:
            self._attach(name)

    def _config_problems(self, names) -> list[str]:
        from peft.tuners.lora import LoraConfig
        return [f"adapter {n!r} is a {type(self.model.peft_config[n]).__name__}, not LoRA" for n in names
                if not isinstance(self.model.peft_config[n], LoraConfig)]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.slot, key=self.slot.get))

    # -- keeping up with the model's adapters ----------------------------------------------------------------
    def _holding(self, name: str) -> list[tuple[Any, Any]]:
        """(module, its _Layer or None) for every LoRA layer of the model that holds adapter ``name``."""
        from peft.tuners.lora import LoraLayer
        return [(m, self._layer_of.get(id(m))) for m in self.model.modules()
                if isinstance(m, LoraLayer) and (name in m.lora_A or name in getattr(m, "lora_embedding_A", {}))]

    def _fits(self, name: str) -> bool:
        """Whether adapter ``name`` goes into the existing stacks: its layers are stacked ones, its rank fits,
        its dtype matches, and nothing about it is refused."""
        if self._config_problems([name]):
            return False
        for module, index in self._holding(name):
            if index is None or _problems("", module, [name]):
                return False
            entry = self.layers[index]
            w = module.lora_A[name].weight
            if w.shape[0] > entry.a.shape[2] or w.dtype != entry.a.dtype:
                return False
        return True

    def _grow(self, capacity: int) -> None:
        with _plain():
            for entry in self.layers:
                a = entry.a.new_zeros((capacity + 1,) + tuple(entry.a.shape[1:]))
                b = entry.b.new_zeros((capacity + 1,) + tuple(entry.b.shape[1:]))
                a[:self.capacity + 1].copy_(entry.a)
                b[:self.capacity + 1].copy_(entry.b)
                entry.set_stacks(a, b)
        extra = capacity - self.capacity
        self._sources += [[] for _ in range(extra)]
        self._versions += [-1] * extra
        self._marks += [None] * extra
        self._slot_name += [None] * extra
        self.capacity = capacity

    def _attach(self, name: str) -> None:
        """Give adapter ``name`` a slot (a freed one, or a new one) and copy its weights there."""
        if not self._free and len(self.slot) >= self.capacity:
            self._grow(max(2 * self.capacity, self.capacity + 1))
        i = self._free.pop() if self._free else len(self.slot) + 1
        sources, mark = [], None
        for module, index in self._holding(name):
            entry = self.layers[index]
            entry.dropout = entry.dropout or getattr(module.lora_dropout[name], "p", 0.0) > 0
            sources.append((index, module.lora_A[name].weight, module.lora_B[name].weight))
            if mark is None:
                mark = (module, name, module.scaling[name], module.lora_A[name])
        with _plain():  # a freed slot may hold a larger-rank adapter's columns, or layers this one lacks
            for entry in self.layers:
                entry.a[i].zero_()
                entry.b[i].zero_()
        self.slot[name], self._slot_name[i], self._sources[i], self._marks[i] = i, name, sources, mark
        self._copy(i)

    def _release(self, name: str) -> None:
        i = self.slot.pop(name)
        self._sources[i], self._marks[i], self._versions[i], self._slot_name[i] = [], None, -1, None
        self._free.append(i)

    def _stale(self, name: str) -> bool:
        """Adapter ``name`` as copied is not the model's any more (removed, re-added, or rescaled)."""
        if name not in self.model.peft_config:
            return True
        mark = self._marks[self.slot[name]]
        if mark is None:
            return False
        module, _, scale, lora_a = mark
        return name not in module.lora_A or module.lora_A[name] is not lora_a or module.scaling.get(name) != scale

    def sync(self) -> bool:
        """Follow the model's adapters: drop the slots of removed (or replaced) ones, copy in the new ones.
        False when a new adapter does not fit these stacks (a layer not stacked, a larger rank, another
        dtype, or something refused): build a new :class:`StackedLoRA` then."""
        for name in [n for n in self.slot if self._stale(n)]:
            self._release(name)
        new = [n for n in self.model.peft_config if n not in self.slot]
        if not all(self._fits(n) for n in new):
            return False
        for name in new:
            self._attach(name)
        return True

    def forget(self, name: str) -> None:
        """Release adapter ``name``'s slot now (it is being deleted): its weights are not kept alive here."""
        if name in self.slot:
            self._release(name)

    def current(self) -> bool:
        """Whether the model holds exactly the adapters copied here (same names, same modules, same scales);
        weights edited in place are caught per forward instead (:meth:`applied`)."""
        return set(self.model.peft_config) == set(self.slot) and not any(self._stale(n) for n in self.slot)

    def _version(self, i: int) -> int:
        return sum(a._version + b._version for _, a, b in self._sources[i])

    def _copy(self, i: int) -> None:
        """(Re)write slot ``i`` from the adapter's own weights: A transposed, B transposed with its scale."""
        name = self._slot_name[i]
        with _plain():
            for index, a, b in self._sources[i]:
                entry = self.layers[index]
                r = a.shape[0]  # columns past r stay zero: a slot is zeroed before its adapter is attached
                entry.a[i, :, :r].copy_(a.t())
                entry.b[i, :r, :].copy_(b.t() * entry.module.scaling[name])
        self._versions[i] = self._version(i)
        self.copies += 1

    # -- one forward ---------------------------------------------------------------------------------------
    def slots(self, adapters: Sequence[str]) -> list[int]:
        """Each row's slot; :data:`BASE` is the zero slot."""
        try:
            return [0 if a == BASE else self.slot[a] for a in adapters]
        except KeyError as exc:
            raise ModelError(f"no adapter named {exc.args[0]!r}; loaded: {list(self.names)}") from None

    @contextmanager
    def applied(self, adapters: Sequence[str]):
        """Within this block, every stacked LoRA layer applies row ``i``'s adapter ``adapters[i]`` to row ``i``
        (the first dimension of its input) in one gathered operation; outside it they are PEFT's again."""
        slots = self.slots(adapters)
        for i in set(slots):
            if i and self._version(i) != self._versions[i]:
                self._copy(i)  # trained or edited in place since it was copied
        training = [e for e in self.layers if e.dropout and e.module.training]
        if training:
            raise UnsupportedLoRA("the gathered multi-LoRA path is for inference: LoRA dropout is on and "
                                  f"{len(training)} LoRA layers are in training mode (call model.eval())")
        device = self.layers[0].a.device if self.layers else None
        self._rows[0] = torch.tensor(slots, dtype=torch.long, device=device)
        patched = []
        try:
            for e in self.layers:
                # Set on the instance, past nn.Module.__setattr__: the module's __call__ (and its hooks) then
                # runs this forward; deleting it brings back the class's.
                e.module.__dict__["forward"] = e.forward
                patched.append(e)
            yield self
        finally:
            for e in patched:
                e.module.__dict__.pop("forward", None)
            self._rows[0] = None

    @property
    def nbytes(self) -> int:
        """Memory the stacks take (they are copies of the adapters' weights, plus rank padding and free slots)."""
        return sum(e.a.numel() * e.a.element_size() + e.b.numel() * e.b.element_size() for e in self.layers)


def _gathered_forward(module, a: torch.Tensor, b: torch.Tensor, current: list):
    """The forward a LoRA ``Linear`` runs inside :meth:`StackedLoRA.applied`: its base layer, plus row i's
    ``x_i @ A[slot_i] @ B[slot_i]`` for every row at once (``current[0]``: the slots)."""

    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        result = module.base_layer(x, *args, **kwargs)
        if module.disable_adapters:  # inside peft's disable_adapter(): the bare base, as PEFT does
            return result
        rows = current[0]
        if x.shape[0] != rows.shape[0]:
            raise ModelError(f"a mixed-shard forward got {x.shape[0]} rows but {rows.shape[0]} adapter names")
        h = x.reshape(x.shape[0], -1, x.shape[-1]).to(a.dtype)  # [rows, tokens, in]
        delta = torch.bmm(torch.bmm(h, a.index_select(0, rows)), b.index_select(0, rows))
        return result + delta.reshape(result.shape).to(result.dtype)

    return forward
