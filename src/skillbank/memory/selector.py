"""The selector interface every router over a bank speaks, and the registry of selector kinds.

Every selector speaks scikit-learn: ``partial_fit(requests, labels)`` (labels are shard/family names;
a label never seen before adds a class - families arrive one stage at a time and nothing is declared
in advance, so a family not yet learned can never be chosen), ``predict``, ``predict_proba`` (columns in
``classes_`` order), ``save(dir)`` and ``load(dir)``. Learned state ends in ``_``.

On disk a selector is a directory: ``selector.json`` (kind, hyperparameters, classes, counts) plus an
``.npz`` of arrays where needed - no pickles.

The registry names each kind's class by module path and is resolved on first use, so this module imports
no implementation: :mod:`skillbank.memory.address` (the Address Memory) and :mod:`skillbank.memory.selectors`
(the other routers) import it, never each other in a circle.
"""
from __future__ import annotations

import importlib
import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Sequence

import numpy as np

from skillbank.errors import SelectorError
from skillbank.jsonfile import read_json

SELECTOR_FORMAT = 1
#: Arrays whose key ends so are saved one .npy file each and loaded memory-mapped (see Selector.save).
MAPPED_SUFFIX = "class_scatter"
#: kind -> "module:Class". One table: a new selector kind is added here.
SELECTOR_KINDS = {
    "hashing-nb": "skillbank.memory.address:HashingNBAddress",
    "tfidf-logreg": "skillbank.memory.address:TfidfLogRegAddress",
    "embed-lda-nb": "skillbank.memory.selectors.embedding:EmbeddingLDANBAddress",
    "epi": "skillbank.memory.selectors.model_based:EPISelector",
    "adaptercl": "skillbank.memory.selectors.model_based:AdapterCLSelector",
    "self-route": "skillbank.memory.selectors.model_based:SelfRouteSelector",
    "oracle": "skillbank.memory.selectors.model_based:OracleSelector",
    "address-compete": "skillbank.memory.selectors.model_based:AddressCompeteSelector",
}


def selector_class(kind: str, where: str = "") -> type["Selector"]:
    if kind not in SELECTOR_KINDS:
        raise SelectorError(f"{where}unknown selector kind {kind!r}; known: {sorted(SELECTOR_KINDS)}")
    module, name = SELECTOR_KINDS[kind].split(":")
    cls = getattr(importlib.import_module(module), name)
    if getattr(cls, "kind", None) != kind:
        raise SelectorError(f"selector registry: {SELECTOR_KINDS[kind]} declares kind {cls.kind!r}, not {kind!r}")
    return cls


def check_requests(requests: Sequence[str], what: str = "requests") -> list[str]:
    if isinstance(requests, str):
        raise SelectorError(f"{what} must be a list of strings, got a single string")
    reqs = list(requests)
    for i, r in enumerate(reqs):
        if not isinstance(r, str) or not r.strip():
            raise SelectorError(f"{what}[{i}] is empty or not a string: {r!r}")
    return reqs


class Selector(ABC):
    """Common interface of every router over a bank of shards."""

    kind: ClassVar[str] = ""
    #: True when the selector keeps no requests (statistics only).
    replay_free: ClassVar[bool] = True
    #: True when :meth:`forget` removes one class exactly (its state is a sum over classes).
    can_forget: ClassVar[bool] = False

    classes_: list[str]

    # -- learning ----------------------------------------------------------------------------
    @abstractmethod
    def partial_fit(self, requests: Sequence[str], labels: Sequence[str] | str) -> "Selector":
        """Update with one stage's requests (labels: one per request, or one label for all)."""

    def partial_fit_catalog(self, docs: Sequence[str], label: str) -> "Selector":
        """Learn what family ``label``'s catalog says about its skills (``docs``: one text per skill, e.g.
        :func:`skillbank.memory.scope.catalog_text`), after its requests. A catalog is not a request, so this keeps
        a router replay-free. Routers that read requests alone keep nothing of it (the paper's Address Memory,
        the offline reference); :class:`~skillbank.memory.selectors.embedding.EmbeddingLDANBAddress` counts it
        when its ``catalog_weight`` is set."""
        return self

    def fit(self, requests: Sequence[str], labels: Sequence[str] | str) -> "Selector":
        self.reset()
        return self.partial_fit(requests, labels)

    @abstractmethod
    def reset(self) -> None:
        """Forget everything learned."""

    def _labels(self, requests: list[str], labels: Sequence[str] | str) -> list[str]:
        if isinstance(labels, str):
            labels = [labels] * len(requests)
        labels = list(labels)
        if len(labels) != len(requests):
            raise SelectorError(f"got {len(requests)} requests but {len(labels)} labels")
        for lab in labels:
            if not isinstance(lab, str) or not lab:
                raise SelectorError(f"labels must be non-empty strings, got {lab!r}")
        return labels

    def check_encoder(self) -> None:
        """Fail now, before a shard is trained, when something this selector embeds with is missing
        (selectors that embed requests override it)."""

    def forget(self, label: str) -> "Selector":
        """Remove one class exactly, as if it had never been learned (selectors whose state is additive)."""
        raise SelectorError(f"{type(self).__name__} cannot forget a class exactly: its statistics mix classes")

    @property
    def forgettable(self) -> bool:
        """Whether this instance's state can :meth:`forget` (and export) one class exactly."""
        return self.can_forget

    def family_selector(self, label: str) -> "Selector":
        """A selector of the same kind holding ``label``'s statistics alone (what a family export carries)."""
        raise SelectorError(f"{type(self).__name__} cannot export one class's statistics: they mix classes")

    def add_family(self, other: "Selector", source: str, label: str) -> "Selector":
        """Add class ``source`` of ``other`` (an exported family) as ``label``: the same as having learned it here."""
        raise SelectorError(f"{type(self).__name__} cannot add one class's statistics: they mix classes")

    def _check_class(self, label: str) -> None:
        if label not in self.classes_:
            raise SelectorError(f"the Address Memory has no class {label!r}; it has {self.classes_}")

    def _check_same_router(self, other: "Selector") -> None:
        """An exported family's statistics merge only into a router of the same kind and settings."""
        if type(other) is not type(self) or other.get_params() != self.get_params():
            raise SelectorError(f"the family's routing statistics were made by another router "
                                f"({getattr(other, 'kind', type(other).__name__)} {other.get_params()}; "
                                f"here {self.kind} {self.get_params()})")

    # -- reading -----------------------------------------------------------------------------
    @abstractmethod
    def predict_proba(self, requests: Sequence[str]) -> np.ndarray:
        """Routing probabilities, shape (n_requests, n_classes), columns in ``classes_`` order."""

    def predict(self, requests: Sequence[str]) -> list[str]:
        proba = self.predict_proba(requests)
        return [self.classes_[i] for i in np.argmax(proba, axis=1)]

    def _check_fitted(self) -> None:
        if not getattr(self, "classes_", None):
            raise SelectorError(f"{type(self).__name__} has not learned any shard yet; call partial_fit first")

    # -- persistence -------------------------------------------------------------------------
    @abstractmethod
    def get_params(self) -> dict: ...

    @abstractmethod
    def _state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(JSON-able state, arrays) to save."""

    @abstractmethod
    def _set_state(self, state: dict, arrays: dict[str, np.ndarray]) -> None: ...

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state, arrays = self._state()
        meta = {"format": SELECTOR_FORMAT, "kind": self.kind, "params": self.get_params(), "state": state}
        # Per-class matrices (MAPPED_SUFFIX) go to a .npy file each, read memory-mapped: scoring needs only their
        # sum (saved with the rest), so opening a bank of 1,000 families does not read 600 MB of them
        # (docs/routing.md, "Cost vs the number of families").
        mapped = {k: v for k, v in arrays.items() if k.endswith(MAPPED_SUFFIX)}
        for stale in directory.glob(f"*{MAPPED_SUFFIX}.npy"):  # a state saved here before must not be read back
            if stale.stem not in mapped:
                stale.unlink()
        for key, value in mapped.items():
            # written aside and renamed: a state loaded from here may still map the old file (truncating it in
            # place would pull the pages from under that map)
            aside = directory / f"{key}.npy.partial"
            with open(aside, "wb") as f:
                np.save(f, np.ascontiguousarray(value))
            os.replace(aside, directory / f"{key}.npy")
        arrays = {k: v for k, v in arrays.items() if k not in mapped}
        if arrays:
            # Uncompressed: every learn writes every family's counts, and compressing them made a learn's
            # cost grow with the bank (the counts are sparse already).
            np.savez(directory / "stats.npz", **arrays)
        (directory / "selector.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "Selector":
        return load_selector(directory, expected=cls if cls is not Selector else None)


def load_selector(directory: str | Path, expected: type[Selector] | None = None, **context) -> Selector:
    """Load a saved selector. ``context``: models a model-based selector reads but never saves
    (``base=``, ``execution=``, ``gold=``; see :mod:`skillbank.memory.selectors.model_based`)."""
    directory = Path(directory)
    meta_path = directory / "selector.json"
    meta = read_json(meta_path, SelectorError, expect_format=SELECTOR_FORMAT, what="selector",
                     missing=f"{directory} holds no selector (missing selector.json)")
    kind = meta.get("kind")
    cls = selector_class(kind, f"{meta_path}: ")
    if expected is not None and not issubclass(cls, expected):
        raise SelectorError(f"{meta_path}: holds a {kind!r} selector, not {expected.kind!r}")
    sel = cls(**meta.get("params", {}), **context)
    arrays = {}
    if (directory / "stats.npz").is_file():
        with np.load(directory / "stats.npz") as npz:
            arrays = {k: npz[k] for k in npz.files}
    for path in sorted(directory.glob(f"*{MAPPED_SUFFIX}.npy")):
        try:
            arrays[path.stem] = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise SelectorError(f"{path}: unreadable ({exc})") from None
    sel._set_state(meta.get("state", {}), arrays)
    return sel


def make_selector(kind: str, **params) -> Selector:
    """A fresh selector of ``kind``; ``params``: its hyperparameters plus any context it needs."""
    return selector_class(kind)(**params)
