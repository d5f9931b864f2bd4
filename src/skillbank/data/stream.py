"""The continual benchmark stream: families, task orders, per-family train/held-out splits.

On disk a stream is a directory::

    stream.json        name, source, seed, family keys in T1..TK order, named orders, build report
    catalog.json       the skill catalog with its family partition (skillbank.data.catalog)
    train/<family>.jsonl
    test/<family>.jsonl

Task orders refer to positions in the family list: O1 = [T1, T2, T3, T4, T5] and O2 = [T3, T1, T5, T2, T4]
(the paper's two orders of five families). With K families O1 is the list order T1..TK; O2 exists only
for five. ``R<seed>`` (``R0``, ``R17``) is a seeded random order of all K families: the same K and seed
always give the same permutation, whatever the families are called. Order names become directory names
in a run (``methods/fsm/R17/``), hence no ``:`` in them.

A run may carve a **validation split** out of each family's training requests
(:meth:`Stream.split_validation`, ``[stream] validation_per_family``): a seeded sample removed from what the
methods train on, so hyperparameters can be selected without looking at the held-out requests. It lives
in memory only (``Stream.validation``); a saved stream directory holds train and test as before.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from skillbank.data.catalog import Catalog
from skillbank.data.records import Record, read_records, write_records
from skillbank.errors import StreamError
from skillbank.jsonfile import read_json

FORMAT_VERSION = 1
ORDERS = {"O1": (1, 2, 3, 4, 5), "O2": (3, 1, 5, 2, 4)}
RANDOM_ORDER = re.compile(r"R([0-9]{1,9})")


def random_order(k: int, seed: int) -> tuple[int, ...]:
    """Positions 1..k in the seeded random order ``R<seed>`` (a string seed: stable across Python versions)."""
    positions = list(range(1, k + 1))
    random.Random(f"skillbank-order:{seed}").shuffle(positions)
    return tuple(positions)


@dataclass
class Stream:
    name: str
    catalog: Catalog
    train: dict[str, list[Record]]
    test: dict[str, list[Record]]
    source: str = ""
    seed: int = 0
    report: dict = field(default_factory=dict)
    validation: dict[str, list[Record]] = field(default_factory=dict)

    @property
    def family_keys(self) -> list[str]:
        return self.catalog.family_keys

    def task_label(self, key: str) -> str:
        """``T1`` .. ``TK`` for a family key (its position in the family list)."""
        return f"T{self.family_keys.index(key) + 1}"

    @property
    def named_orders(self) -> list[str]:
        """The named orders this stream has (saved in stream.json): O1 and O2 for five families, else O1."""
        return list(ORDERS) if len(self.family_keys) == len(ORDERS["O1"]) else ["O1"]

    def order(self, name: str) -> list[str]:
        """Family keys in the arrival order ``O1`` or ``O2``, a seeded random order ``R<seed>``, or a custom
        comma list like ``T2,T1``."""
        keys = self.family_keys
        random_match = RANDOM_ORDER.fullmatch(name)
        if name == "O1" and len(keys) != len(ORDERS["O1"]):
            positions = tuple(range(1, len(keys) + 1))
        elif name == "O2" and len(keys) != len(ORDERS["O2"]):
            raise StreamError(f"order O2 is the paper's order of five families and this stream has {len(keys)}: "
                              f"use O1 (T1..T{len(keys)}), a random order R<seed> (e.g. R0) or a list like T3,T1,T2")
        elif name in ORDERS:
            positions = ORDERS[name]
        elif random_match:
            positions = random_order(len(keys), int(random_match.group(1)))
        else:
            try:
                positions = tuple(int(p.strip().lstrip("Tt")) for p in name.split(","))
            except ValueError:
                raise StreamError(f"unknown order {name!r}: use O1, O2, a random order R<seed> (e.g. R7) "
                                  f"or a list like T3,T1,T2") from None
        if len(set(positions)) != len(positions):
            raise StreamError(f"order {name!r} repeats a task")
        bad = [p for p in positions if not 1 <= p <= len(keys)]
        if bad:
            raise StreamError(f"order {name!r} names T{bad[0]}, the stream has T1..T{len(keys)}")
        return [keys[p - 1] for p in positions]

    def summary(self) -> dict:
        out = {
            key: {"task": self.task_label(key), "title": self.catalog.family(key).title,
                  "skills": len(self.catalog.family(key).skills),
                  "train": len(self.train.get(key, [])), "test": len(self.test.get(key, []))}
            for key in self.family_keys
        }
        if self.validation:  # only streams with a split say so: existing summaries stay as they were
            for key in self.family_keys:
                out[key]["validation"] = len(self.validation.get(key, []))
        return out

    def split(self, name: str) -> dict[str, list[Record]]:
        """The evaluation records of a split: ``test`` (held-out) or ``validation`` (carved from training)."""
        if name == "test":
            return self.test
        if name == "validation":
            if not self.validation:
                raise StreamError("this stream has no validation split: set [stream] validation_per_family "
                                  "(or validation_fraction) to carve one out of the training requests")
            return self.validation
        raise StreamError(f"unknown split {name!r}: use 'test' or 'validation'")

    # -- the validation split ---------------------------------------------------------------
    def split_validation(self, per_family: int | None = None, fraction: float | None = None,
                         seed: int = 0) -> "Stream":
        """Move a seeded sample of each family's training requests into ``self.validation`` (in place;
        returns self). ``per_family`` requests, or ``fraction`` of them (rounded, at least 1); at least one
        training request always stays. Candidates are training requests whose text is not a held-out
        request's (so validation never overlaps the test set even on a source that repeats a text across
        splits); the rest keep their order. The same stream, sizes and seed always give the same split."""
        if (per_family is None) == (fraction is None):
            raise StreamError("give the validation split as per_family or fraction (exactly one)")
        test_texts = {r.request for recs in self.test.values() for r in recs}
        for key in self.family_keys:
            records = list(self.train.get(key, []))
            n = per_family if per_family is not None else max(1, round(fraction * len(records)))
            candidates = [i for i, r in enumerate(records) if r.request not in test_texts]
            if n >= len(records) or n > len(candidates):
                raise StreamError(f"family {key}: cannot hold out {n} of its {len(records)} training requests for "
                                  f"validation ({len(candidates)} eligible, at least one must stay for training)")
            rng = random.Random(f"skillbank-validation:{seed}:{key}")
            chosen = set(rng.sample(candidates, n))
            self.validation[key] = [r for i, r in enumerate(records) if i in chosen]
            self.train[key] = [r for i, r in enumerate(records) if i not in chosen]
        return self

    # -- persistence ------------------------------------------------------------------------
    def save(self, root: str | Path) -> Path:
        root = Path(root)
        (root / "train").mkdir(parents=True, exist_ok=True)
        (root / "test").mkdir(parents=True, exist_ok=True)
        self.catalog.save(root / "catalog.json")
        for key in self.family_keys:
            write_records(root / "train" / f"{key}.jsonl", self.train.get(key, []))
            write_records(root / "test" / f"{key}.jsonl", self.test.get(key, []))
        meta = {"format": FORMAT_VERSION, "name": self.name, "source": self.source, "seed": self.seed,
                "families": self.family_keys, "orders": {k: self.order(k) for k in self.named_orders},
                "summary": self.summary(), "report": self.report}
        (root / "stream.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
        return root

    @classmethod
    def load(cls, root: str | Path) -> "Stream":
        root = Path(root)
        meta_path = root / "stream.json"
        meta = read_json(meta_path, StreamError, expect_format=FORMAT_VERSION, what="stream",
                         missing=f"{root} is not a stream directory (no stream.json); build one with `skillbank exp stream build`")
        catalog = Catalog.load(root / "catalog.json")
        if meta.get("families") != catalog.family_keys:
            raise StreamError(f"{meta_path}: families {meta.get('families')} differ from the catalog's {catalog.family_keys}")
        train, test = {}, {}
        for key in catalog.family_keys:
            train[key] = read_records(root / "train" / f"{key}.jsonl", catalog, family=key).records
            test[key] = read_records(root / "test" / f"{key}.jsonl", catalog, family=key).records
        return cls(meta.get("name", root.name), catalog, train, test, meta.get("source", ""),
                   meta.get("seed", 0), meta.get("report", {}))
