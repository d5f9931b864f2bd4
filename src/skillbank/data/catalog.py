"""Skill catalogs and family partitions.

A *skill* is one canonical tool id (``<Source>::<family>::<snake_name>``) with typed arguments.
A *family* is a set of skills learned together in one continual stage (one executor shard).
A catalog is valid only when its families partition its skills: every skill in exactly one family.

On disk a catalog is this project's ``catalog.json`` (:meth:`Catalog.to_dict`, :meth:`Catalog.load`);
:func:`skillbank.data.tool_formats.load_catalog` also reads an OpenAI function-calling tools list or an MCP
tools/list result as one family (that module builds on this one, never the reverse).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Mapping

from skillbank.errors import CatalogError, RecordError
from skillbank.jsonfile import read_json
from skillbank.graph import TaskGraph


def check_disjoint(declared: Iterable[str], owned: Mapping[str, str]) -> None:
    """Families are disjoint: none of a new family's ``declared`` skills may be one that another family already
    owns (``owned``: skill id -> family). The one check of ``skillbank learn``, ``SkillBank.learn`` and
    ``POST /v1/families``; raises RecordError naming the first few clashes and their owners."""
    clash = sorted(s for s in set(declared) if s in owned)
    if clash:
        raise RecordError("skill(s) already learned by another shard (families must be disjoint): "
                          + ", ".join(f"{s} (in {owned[s]})" for s in clash[:5]))


def snake_name(name: str) -> str:
    """``"Image Search (by Image)"`` -> ``"image_search_by_image"``; ``"Text-to-Speech"`` -> ``"text_to_speech"``."""
    s = re.sub(r"[^0-9a-zA-Z]+", "_", name.strip()).strip("_").lower()
    return re.sub(r"_+", "_", s)


def skill_id(source: str, family_key: str, name: str) -> str:
    return f"{source}::{family_key}::{snake_name(name)}"


@dataclass(frozen=True)
class ArgSpec:
    name: str
    type: str = "string"
    description: str = ""
    required: bool = False  # from a JSON Schema's "required"; validation checks that gold graphs give it

    def to_dict(self) -> dict:
        d = asdict(self)
        if not self.required:
            del d["required"]  # catalogs saved before the field existed stay byte-identical
        return d

    @classmethod
    def from_dict(cls, d: object, where: str = "argument") -> "ArgSpec":
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not d["name"].strip():
            raise CatalogError(f"{where}: an argument spec needs a non-empty string 'name', got {d!r}")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise CatalogError(f"{where}: argument {d['name']!r} has unknown field(s) {unknown}")
        if not isinstance(d.get("required", False), bool):
            raise CatalogError(f"{where}: argument {d['name']!r}: 'required' must be true or false")
        return cls(**d)


@dataclass(frozen=True)
class Skill:
    id: str
    family: str
    name: str
    description: str = ""
    arguments: tuple[ArgSpec, ...] = ()

    @property
    def argument_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arguments)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["arguments"] = [a.to_dict() for a in self.arguments]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Skill":
        if not isinstance(d.get("arguments", []), list):
            raise CatalogError(f"skill {d.get('id')!r}: 'arguments' must be a list")
        args = tuple(ArgSpec.from_dict(a, f"skill {d.get('id')!r}") for a in d.get("arguments", ()))
        return cls(id=d["id"], family=d["family"], name=d.get("name", d["id"]),
                   description=d.get("description", ""), arguments=args)


@dataclass(frozen=True)
class Family:
    key: str  # e.g. "t1_daily_life"; also the route label and the shard name
    title: str  # e.g. "Daily Life"
    skills: tuple[str, ...] = field(default_factory=tuple)


class Catalog:
    """Skills keyed by id plus the family partition over them."""

    def __init__(self, skills: Iterable[Skill], families: Iterable[Family]):
        self.skills: dict[str, Skill] = {}
        for s in skills:
            if s.id in self.skills:
                raise CatalogError(f"skill id {s.id!r} appears twice in the catalog")
            self.skills[s.id] = s
        self.families: tuple[Family, ...] = tuple(families)  # fixed: the lookups below index it once
        self._by_key = {f.key: f for f in self.families}
        self._family_of: dict[str, str] = {}
        self._check_partition()

    def _check_partition(self) -> None:
        keys = [f.key for f in self.families]
        if len(set(keys)) != len(keys):
            raise CatalogError(f"family keys repeat: {keys}")
        for fam in self.families:
            for sid in fam.skills:
                if sid not in self.skills:
                    raise CatalogError(f"family {fam.key!r} lists unknown skill {sid!r}")
                if sid in self._family_of:
                    raise CatalogError(f"skill {sid!r} is in two families: {self._family_of[sid]!r} and {fam.key!r}")
                self._family_of[sid] = fam.key
        missing = sorted(set(self.skills) - set(self._family_of))
        if missing:
            raise CatalogError(f"{len(missing)} skill(s) belong to no family, e.g. {missing[:3]}")
        for sid, skill in self.skills.items():
            if skill.family != self._family_of[sid]:
                raise CatalogError(f"skill {sid!r} says family {skill.family!r} but is listed under {self._family_of[sid]!r}")

    # -- lookups ----------------------------------------------------------------------------
    def family_of(self, skill: str) -> str:
        try:
            return self._family_of[skill]
        except KeyError:
            raise CatalogError(f"unknown skill {skill!r}") from None

    @property
    def family_map(self) -> Mapping[str, str]:
        """Skill id -> family key for every skill, read-only (callers that classify many ids at once)."""
        return MappingProxyType(self._family_of)

    def family(self, key: str) -> Family:
        try:
            return self._by_key[key]
        except KeyError:
            raise CatalogError(f"unknown family {key!r}; known: {list(self._by_key)}") from None

    @property
    def family_keys(self) -> list[str]:
        return list(self._by_key)

    def has_family(self, key: str) -> bool:
        """Asked once per record when a stream loads: a dict lookup, or loading grows with K^2."""
        return key in self._by_key

    def unknown_skills(self, graph: TaskGraph) -> list[str]:
        return sorted({t for t in graph.tasks if t not in self.skills})

    def families_of_graph(self, graph: TaskGraph) -> set[str]:
        return {self._family_of[t] for t in graph.tasks if t in self._family_of}

    def subset(self, family_key: str) -> list[Skill]:
        return [self.skills[s] for s in self.family(family_key).skills]

    def __len__(self) -> int:
        return len(self.skills)

    # -- persistence ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "families": [{"key": f.key, "title": f.title, "skills": list(f.skills)} for f in self.families],
            "skills": [s.to_dict() for s in self.skills.values()],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Catalog":
        if not isinstance(d, dict):
            raise CatalogError(f"expected an object with 'families' and 'skills', got {type(d).__name__}")
        try:
            skills = [Skill.from_dict(s) for s in d["skills"]]
            families = [Family(f["key"], f.get("title", f["key"]), tuple(f["skills"])) for f in d["families"]]
        except (KeyError, TypeError, AttributeError) as exc:
            raise CatalogError(f"catalog is missing a field or has one of the wrong type: {exc}") from None
        return cls(skills, families)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Catalog":
        """Read this project's catalog.json at ``path`` (errors name the file). Tools lists: see
        :func:`skillbank.data.tool_formats.load_catalog`."""
        path = Path(path)
        data = read_json(path, CatalogError, what="catalog")
        try:
            return cls.from_dict(data)
        except CatalogError as exc:
            raise CatalogError(f"{path}: {exc} (an OpenAI tools list or MCP tools/list result is read by "
                               "skillbank.data.tool_formats.load_catalog)") from None
