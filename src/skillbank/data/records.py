"""Records (request -> gold task graph) and their JSON Lines files.

One line per record::

    {"id": "...", "family": "t1_daily_life", "request": "...", "structure": "chain",
     "graph": {"task_nodes": [...], "task_links": [...]}}

``structure`` is ``single`` (one node), ``chain`` (every node consumes at most the one before it and the
links form a path) or ``dag`` (anything else), as TaskBench's ``type`` field.

Reading validates every line and raises :class:`RecordError` naming the file, the 1-based line and
the reason; with ``skip_invalid=True`` bad lines are collected (never silently dropped) and returned.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from skillbank.data.catalog import Catalog
from skillbank.errors import GraphError, RecordError, UnknownSkillError
from skillbank.graph import TaskGraph

STRUCTURES = ("single", "chain", "dag")


@dataclass(frozen=True)
class Record:
    id: str
    family: str
    request: str
    graph: TaskGraph
    structure: str = ""

    def __post_init__(self):
        if not self.structure:
            object.__setattr__(self, "structure", structure_of(self.graph))

    def to_dict(self) -> dict:
        return {"id": self.id, "family": self.family, "request": self.request,
                "structure": self.structure, "graph": self.graph.to_dict()}

    @classmethod
    def from_dict(cls, obj: Any) -> "Record":
        """Validate and build; raises :class:`RecordError` (without location) on bad input."""
        if not isinstance(obj, dict):
            raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
        for key in ("id", "family", "request", "graph"):
            if key not in obj:
                raise RecordError(f"missing field {key!r}")
        rid, family, request = obj["id"], obj["family"], obj["request"]
        if not isinstance(rid, (str, int)) or str(rid).strip() == "":
            raise RecordError(f"'id' must be a non-empty string, got {rid!r}")
        if not isinstance(family, str) or not family.strip():
            raise RecordError(f"record {rid}: 'family' must be a non-empty string, got {family!r}")
        if not isinstance(request, str) or not request.strip():
            raise RecordError(f"record {rid}: empty request")
        try:
            graph = TaskGraph.from_dict(obj["graph"])
        except GraphError as exc:
            raise RecordError(f"record {rid}: invalid graph: {exc}") from None
        structure = obj.get("structure") or ""
        if structure and structure not in STRUCTURES:
            raise RecordError(f"record {rid}: structure must be one of {STRUCTURES}, got {structure!r}")
        return cls(str(rid), family.strip(), request.strip(), graph, structure)


def structure_of(graph: TaskGraph) -> str:
    n = len(graph.nodes)
    if n == 1:
        return "single"
    links = graph.canonical_links()
    chain_links = {(graph.nodes[i].task, graph.nodes[i + 1].task) for i in range(n - 1)}
    if len(links) == n - 1 and {(l.source, l.target) for l in links} == chain_links:
        return "chain"
    return "dag"


@dataclass
class RecordSet:
    """Records read from one file, plus the lines that were skipped (with their errors)."""

    records: list[Record]
    skipped: list[RecordError] = field(default_factory=list)
    path: str | None = None


def iter_jsonl(path: str | Path, *, errors: str = "raise") -> Iterator[tuple[int, Any]]:
    """Yield (line number, decoded object) for each non-blank line.

    errors="raise": a malformed line raises RecordError naming file and line.
    errors="yield": the RecordError is yielded in place of the object and reading goes on.
    """
    path = Path(path)
    if not path.is_file():
        raise RecordError("no such file", path)
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                err = RecordError(f"malformed JSON ({exc.msg} at column {exc.colno})", path, lineno)
                if errors == "raise":
                    raise err from None
                yield lineno, err


def read_records(path: str | Path, catalog: Catalog | None = None, *, skip_invalid: bool = False,
                 family: str | None = None) -> RecordSet:
    """Read and validate a records file.

    catalog: when given, every node's skill id must be in it (else :class:`UnknownSkillError`).
    family: when given, every record must belong to this family.
    skip_invalid: collect bad lines in ``RecordSet.skipped`` instead of raising on the first.
    """
    path = Path(path)
    out = RecordSet([], [], str(path))
    seen: dict[str, int] = {}

    def fail(err: RecordError):
        if not skip_invalid:
            raise err
        out.skipped.append(err)

    for lineno, obj in iter_jsonl(path, errors="yield"):
        if isinstance(obj, RecordError):
            fail(obj)
            continue
        try:
            rec = Record.from_dict(obj)
        except RecordError as exc:
            fail(RecordError(exc.reason, path, lineno))
            continue
        if catalog is not None:
            unknown = catalog.unknown_skills(rec.graph)
            if unknown:
                fail(UnknownSkillError(f"record {rec.id}: unknown skill(s) {unknown}", path, lineno))
                continue
        if family is not None and rec.family != family:
            fail(RecordError(f"record {rec.id}: family {rec.family!r}, expected {family!r}", path, lineno))
            continue
        if rec.id in seen:
            fail(RecordError(f"duplicate record id {rec.id!r} (first on line {seen[rec.id]})", path, lineno))
            continue
        seen[rec.id] = lineno
        out.records.append(rec)
    return out


def write_records(path: str | Path, records: Iterable[Record]) -> int:
    """Write records as JSON Lines (atomically: a temp file renamed into place). Returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(path)
    return n
