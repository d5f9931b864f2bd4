"""What a continual method is to the runner.

The runner (``skillbank.continual.runner``) owns the stream, the stage loop, evaluation, caching, resume
and results; a method owns only its model state and answers four questions:

* ``learn(t, family, records)`` - absorb stage ``t`` (through the shared training loop,
  ``skillbank.train.loop.fit``, adding at most a loss term, a data mix or extra adapters);
* ``queries(t, records)`` - for each evaluated variant (FSM has two: routed and Oracle), which model
  state should answer each held-out request with which prompt, and which shard it was routed to;
* ``model_for(state)`` - a context manager giving the model that generates for a state;
* ``save(dir)`` / ``load(dir)`` - the state after a stage, so an interrupted run resumes exactly.

A *state* names the weights that generate. For trained states it carries a digest of those weights, so
an output cached under it can only ever be reused by identical weights (this is what makes a resumed run
end with the same results as an uninterrupted one).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Iterator, Optional, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field, model_serializer

from skillbank.continual.stage_cache import STORED_ADAPTER, StageCache, under_stored_name
from skillbank.data.records import Record
from skillbank.data.stream import Stream
from skillbank.model.base import LoadedBase, tensors_digest
from skillbank.model.prompts import render_prompt
from skillbank.train.checkpoint import FitCheckpoint
from skillbank.train.executor import TrainConfig, build_examples, common_prefix
from skillbank.train.loop import FitResult, adapter_parameters, fit

Say = Callable[[str], None]


class MethodParams(BaseModel):
    """Hyperparameters of a method beyond the shared LoRA recipe; unknown keys are errors.

    An optional hyperparameter left unset (None) is left out of the dump saved as a run's ``config.json``,
    so adding one does not make runs saved before it look like another configuration."""

    model_config = ConfigDict(extra="forbid")

    @model_serializer(mode="wrap")
    def _without_unset_optionals(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class AddressParams(MethodParams):
    """Hyperparameters of a method that routes requests with its own Address Memory (FSM, routed Progressive)."""

    address_kind: str = Field("", description="Address Memory kind; empty = the run's [address] section")
    address_params: dict = Field(default_factory=dict)

    def resolve(self, ctx: "MethodContext") -> tuple[str, dict]:
        """(kind, params) of the Address Memory: this method's own settings, else the run's [address] section."""
        address = ctx.extras.get("address", {})
        return self.address_kind or address.get("kind", "hashing-nb"), self.address_params or address.get("params", {})


@dataclass(frozen=True)
class Query:
    """One request to answer: generate ``prompt`` with model state ``state``, decode with (fmt, prefix).
    ``route`` is the family a routing method sent it to (None for methods that do not route). ``skills``: the
    skill ids the answering model knows - with constrained decoding on, its output may use only these (and
    their declared arguments); empty: unconstrained."""

    state: str
    prompt: str
    fmt: str
    prefix: str
    route: Optional[str] = None
    skills: tuple[str, ...] = ()


@dataclass
class MethodContext:
    """Everything a method may use: the base (shared by its adapters), the shared recipe, the stream
    (for the catalog - never for data of other stages), its working directory and the run's settings."""

    base: LoadedBase
    train: TrainConfig
    stream: Stream
    order_name: str
    order: list[str]
    workdir: Path  # this method's directory (shared by its orders)
    progress: bool = True
    say: Optional[Say] = None
    extras: dict = field(default_factory=dict)
    #: stage t -> where that stage's training keeps its checkpoint (None: no checkpoints)
    checkpoint_path: Optional[Callable[[int], Path]] = None
    checkpoint_seconds: float = 600.0

    def log(self, message: str) -> None:
        if self.say:
            self.say(message)

    def fit_checkpoint(self, t: int) -> Optional[FitCheckpoint]:
        """The checkpoint of stage ``t``'s training, for :func:`~skillbank.train.loop.fit` (None: none). It
        outlives the training (``keep_final``): the runner removes it once the stage's state is saved."""
        if self.checkpoint_path is None:
            return None
        return FitCheckpoint(self.checkpoint_path(t), every_seconds=self.checkpoint_seconds, keep_final=True)


def address_hint(skill_ids: Sequence[str]) -> str:
    """The correct-skill-address text: the request's gold skill ids, in order (SFT's ``+address`` probe, the
    diagnostics and ``skillbank exp reactivate`` append it to a request)."""
    return "Skill address: " + ", ".join(skill_ids)


def with_text(request: str, text: str) -> str:
    """``request`` with ``text`` appended on its own line (nothing else in the prompt changes)."""
    return f"{request.rstrip()}\n{text}"


def weights_digest(named: dict[str, torch.Tensor]) -> str:
    """A short content digest of some tensors (adapter weights), stable across processes."""
    return tensors_digest(sorted(named.items())).removeprefix("sha256:")[:16]


class Method(ABC):
    """A continual-learning method over one order of a stream (see the module docstring)."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    Params: ClassVar[type[MethodParams]] = MethodParams
    #: True when a state never depends on the order (FSM's executors): outputs are shared across orders.
    order_independent: ClassVar[bool] = False
    #: True when the method trains (references on a frozen base do not).
    trains: ClassVar[bool] = True
    #: Label of a group of methods whose first stage is the same training under the same recipe (loaded
    #: from a stage cache after the first of them trains it); None: its own.
    first_stage_group: ClassVar[str | None] = None

    @classmethod
    def independent_of_order(cls, params: dict) -> bool:
        """Whether this method's states are shared across orders under ``params`` (a config's
        ``[method_params.<name>]`` table): :attr:`order_independent` unless a parameter makes them depend on it."""
        return cls.order_independent

    @classmethod
    def first_stage_recipe(cls, train: TrainConfig, params: MethodParams) -> TrainConfig | None:
        """The recipe this method's first stage trains its group's shared adapter with under ``train`` and
        ``params`` (None: its first stage is its own). A sweep's cost estimate counts each once."""
        return train if cls.first_stage_group is not None else None

    def __init__(self, ctx: MethodContext, params: MethodParams | None = None):
        self.ctx = ctx
        self.params = params if params is not None else self.Params()

    # -- what every method provides ----------------------------------------------------------
    @abstractmethod
    def learn(self, t: int, family: str, records: Sequence[Record]) -> dict:
        """Absorb stage ``t`` (1-based) from ``records`` of ``family`` only; return a training summary."""

    @abstractmethod
    def queries(self, t: int, records: Sequence[Record]) -> dict[str, list[Query]]:
        """Variant name -> one :class:`Query` per record, after stage ``t``."""

    @abstractmethod
    def model_for(self, state: str):
        """Context manager yielding the model that generates for ``state``."""

    def save(self, directory: Path) -> None:
        """Write the state after the last learned stage into ``directory`` (created by the runner)."""

    def load(self, directory: Path, t: int) -> None:
        """Restore the state written by :meth:`save` after stage ``t``."""

    def close(self) -> None:
        """Drop in-memory adapters (the runner loads a fresh base per method and order anyway)."""

    # -- helpers shared by the methods -------------------------------------------------------------
    @property
    def base(self) -> LoadedBase:
        return self.ctx.base

    @property
    def stream_prefix(self) -> str:
        """The skill-id prefix shared by the whole catalog: one model for every family (sequential methods)
        must write the family part of each id, so only the catalog-wide prefix is stripped."""
        return common_prefix(sorted(self.ctx.stream.catalog.skills))

    def seen_skills(self, t: int) -> tuple[str, ...]:
        """The skills of the families learned in stages 1..t: what one model for every family knows after t."""
        catalog = self.ctx.stream.catalog
        return tuple(s for family in self.ctx.order[:t] for s in catalog.family(family).skills)

    def examples(self, records: Sequence[Record], prefix: str):
        return build_examples(self.base, records, self.ctx.train, prefix)

    def closed_book_prompt(self, request: str) -> str:
        return render_prompt(self.base.tokenizer, request, self.ctx.train.system_prompt)

    @contextmanager
    def adapters_active(self, names: Sequence[str]) -> Iterator[object]:
        yield self.base.activate(list(names))

    def fit_or_reuse(self, t: int, family: str, examples, terms, *, adapter: str, cfg: TrainConfig,
                     active: Sequence[str] | None = None, on_step=None) -> tuple[FitResult, str | None]:
        """Train ``adapter`` (freshly added, or carrying the earlier stages) on stage ``t``'s ``examples``, or load
        it from the run's stage cache when the very same training was done before, by this method or another
        (``skillbank.continual.stage_cache``). Returns the training's result and the cache key it was loaded
        from (None: trained here).

        Only a first stage is looked up: a later one starts from weights only this method's history produced.
        A stage with a loss term or a per-step callback is never shared."""
        cache: StageCache | None = self.ctx.extras.get("stage_cache")
        key = None
        if cache is not None and t == 1 and not terms and on_step is None:
            device = next(self.base.peft.parameters()).device
            start = under_stored_name(adapter_parameters(self.base.peft, adapter), adapter)
            key = cache.key(base_identity=self.base.identity, start_digest=weights_digest(start), examples=examples,
                            train_config=cfg.to_dict(), seed=cfg.seed + t, device=device.type)
            hit = cache.lookup(key)
            if hit is not None:
                self.ctx.log(f"  {self.name} stage {t}: the same training was done before; loading {hit}")
                self.base.remove_adapter(adapter)
                self.base.load_adapter(adapter, hit / STORED_ADAPTER)
                self.base.activate(list(active) if active else [adapter])
                return FitResult(**cache.fit_result(key)), key
        result = fit(self.base, examples, cfg, adapter=adapter, active=active, terms=terms, seed=cfg.seed + t,
                     on_step=on_step, progress=self.ctx.progress, desc=f"{self.name} stage {t} {family}",
                     checkpoint=self.ctx.fit_checkpoint(t))
        if key is not None:
            cache.store(key, lambda d: self.base.save_adapter(adapter, d / STORED_ADAPTER), result)
        return result, None

    @classmethod
    def describe(cls) -> str:
        return cls.title or cls.name
