"""Records (request -> gold task graph) and their JSON Lines files.

One line per record::

    {"id": "...", "family": "t1_daily_life", "request": "...", "structure": "chain",
     "graph": {"task_nodes": [...], "task_links": [...]}}

``structure`` is ``single`` (one node), ``chain`` (every node consumes at most the one before it and the
links form a path) or ``dag`` (anything else), as TaskBench's ``type`` field.

Reading validates every line and raises :class:`RecordError` naming the file, the 1-based line and
the reason; with ``skip_invalid=True`` bad lines are collected (never silently dropped) and returned.
:func:`validate_records` checks a whole file (or in-memory records) at once and reports every bad line
with all its reasons - argument names against the catalog included - for ``skillbank validate`` and
``learn``.

A line with ``"graph": null`` is a negative: a request the family must refuse
(:mod:`skillbank.data.negatives`). Reading and validating keep negatives apart from the records.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence, Union

from skillbank.data.catalog import Catalog
from skillbank.data.negatives import Negative, is_negative, normalized, request_fields
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
        rid, family, request = request_fields(obj, "record", ("graph",))
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
    negatives: list[Negative] = field(default_factory=list)  # lines with "graph": null


def iter_jsonl(path: str | Path, *, errors: str = "raise") -> Iterator[tuple[int, Any]]:
    """Yield (line number, decoded object) for each non-blank line.

    errors="raise": a malformed line raises RecordError naming file and line.
    errors="yield": the RecordError is yielded in place of the object and reading goes on.
    """
    path = Path(path)
    if not path.is_file():
        raise RecordError("no such file", path)
    with path.open("rb") as fh:  # bytes, so that a line that is not UTF-8 is named like a malformed one
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark (Windows editors) is not JSON
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                err = RecordError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}; "
                                  "JSONL is UTF-8)", path, lineno)
            else:
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as exc:
                    err = RecordError(f"malformed JSON ({exc.msg} at column {exc.colno})", path, lineno)
                else:
                    yield lineno, obj
                    continue
            if errors == "raise":
                raise err from None
            yield lineno, err


Source = Union[str, Path, Iterable[Union[Record, Mapping[str, Any]]]]


@dataclass
class Validation:
    """Every problem of a records source at once: what ``skillbank validate`` prints and ``learn`` checks.

    records: the items that passed every check, in order. errors: one :class:`RecordError` per bad item
    (file and 1-based line, or "item N" for the N-th in-memory record; all of its reasons).
    """

    records: list[Record]
    errors: list[RecordError]
    path: str | None = None
    lines: int = 0  # non-blank lines (items) read
    negatives: list[Negative] = field(default_factory=list)  # valid lines with "graph": null

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        where = self.path or "records"
        if self.ok:
            if self.negatives:
                return (f"{where}: {len(self.records)} record(s) and {len(self.negatives)} negative(s) "
                        "(\"graph\": null), all valid")
            return f"{where}: {self.lines} record(s), all valid"
        return (f"{where}: {len(self.errors)} bad line(s) of {self.lines}, {len(self.records)} valid"
                if self.path else f"{where}: {len(self.errors)} bad record(s) of {self.lines}, {len(self.records)} valid")

    def add_negatives(self, negatives: Sequence[Negative], path: str | Path) -> "Validation":
        """Add a ``--negatives`` file's negatives (read from ``path``): one that repeats a record's request is an
        error naming both files, as one in the records file itself names both lines."""
        clashes = dict(served_and_refused(self.records, negatives))
        for n in negatives:
            if n.id in clashes:
                self.errors.append(RecordError(f"negative {n.id} is the request of record {clashes[n.id]} "
                                               f"of {self.path} (one request cannot be both served and refused)", path))
            else:
                self.negatives.append(n)
        return self

    def raise_if_bad(self, limit: int = 20) -> "Validation":
        """Raise one :class:`RecordError` listing the bad items (the first ``limit``), or return self."""
        if self.errors:
            shown = "\n  ".join(str(e) for e in self.errors[:limit])
            more = f"\n  ... and {len(self.errors) - limit} more" if len(self.errors) > limit else ""
            raise RecordError(f"{self.summary()}:\n  {shown}{more}")
        return self


def served_and_refused(records: Sequence[Record], negatives: Sequence[Negative]) -> list[tuple[str, str]]:
    """(negative id, record id) for each negative whose request is a record's (compared as :func:`normalized`)."""
    served = {normalized(r.request): r.id for r in records}
    return [(n.id, served[normalized(n.request)]) for n in negatives if normalized(n.request) in served]


def validate_records(source: Source, catalog: Catalog | None = None, *, family: str | None = None,
                     check_arguments: bool = True) -> Validation:
    """Check every record of ``source`` (a JSONL path, or Record objects / dicts) and report all problems.

    Per line: malformed JSON, missing fields, empty request, invalid graph or structure; with ``catalog``:
    unknown skills, skills of another of its families than ``family`` and, when ``check_arguments``,
    argument names the catalog does not declare for the skill (a shard decodes under its catalog's
    argument names, so such a target could never be written) and required arguments left out; with
    ``family``: a record of another family; and duplicate ids.
    Nothing is raised for a bad line; a missing file raises :class:`RecordError`.
    """
    if isinstance(source, (str, Path)):
        path = Path(source)
        items: Iterable[tuple[int, Any]] = iter_jsonl(path, errors="yield")
        out = Validation([], [], str(path))
    else:
        path = None
        items = ((i, r.to_dict() if isinstance(r, Record) else r) for i, r in enumerate(source, start=1))
        out = Validation([], [])
    negative_lines: list[tuple[int, Negative]] = []
    positive_lines: dict[str, int] = {}
    for lineno, rec, errors in _check(items, path, catalog, family, check_arguments):
        out.lines += 1
        if errors:
            first = errors[0]
            if len(errors) > 1:
                first = type(first)("; ".join(e.reason for e in errors), first.path, first.line)
            out.errors.append(first)
        elif isinstance(rec, Negative):
            negative_lines.append((lineno, rec))
        else:
            out.records.append(rec)
            positive_lines.setdefault(normalized(rec.request), lineno)
    where = (lambda n: f"line {n}") if path is not None else (lambda n: f"item {n}")
    for lineno, neg in negative_lines:
        twin = positive_lines.get(normalized(neg.request))
        if twin is not None:
            reason = (f"negative {neg.id} is the request of the record on {where(twin)} (one request cannot be "
                      "both served and refused)")
            out.errors.append(RecordError(reason, path, lineno) if path is not None
                              else RecordError(f"item {lineno}: {reason}", None, lineno))
        else:
            out.negatives.append(neg)
    if negative_lines and not out.records and not out.errors:
        first = negative_lines[0][0]
        reason = ("only negatives (\"graph\": null): a family is learned from records with graphs; give them "
                  "here or put the negatives in a file of their own (--negatives)")
        out.errors.append(RecordError(reason, path, first) if path is not None
                          else RecordError(f"item {first}: {reason}", None, first))
    return out


def _check(items: Iterable[tuple[int, Any]], path: Path | None, catalog: Catalog | None, family: str | None,
           check_arguments: bool) -> Iterator[tuple[int, Record | None, list[RecordError]]]:
    """(line, record or None, its errors) per item; the checks :func:`validate_records` documents."""
    seen: dict[str, int] = {}
    for lineno, obj in items:
        def err(reason: str, kind: type[RecordError] = RecordError) -> RecordError:
            if path is None:
                return kind(f"item {lineno}: {reason}", None, lineno)
            return kind(reason, path, lineno)
        if isinstance(obj, RecordError):
            yield lineno, None, [obj]
            continue
        if isinstance(obj, dict) and obj.get("kind") is not None and obj.get("graph") is not None:
            yield lineno, None, [err(f"record {obj.get('id')}: has a \"kind\" ({obj['kind']!r}) and a graph: a "
                                     "negative has \"graph\": null")]
            continue
        try:
            # a negative in a records file is the user's: given, whatever its "source" says
            rec = replace(Negative.from_dict(obj), source="given") if is_negative(obj) else Record.from_dict(obj)
        except RecordError as exc:
            yield lineno, None, [err(exc.reason)]
            continue
        errors = []
        if catalog is not None and isinstance(rec, Record):
            unknown = catalog.unknown_skills(rec.graph)
            if unknown:
                errors.append(err(f"record {rec.id}: unknown skill(s) {unknown}", UnknownSkillError))
            elif family is not None and catalog.has_family(family):
                outside = sorted({t for t in rec.graph.tasks if catalog.family_map[t] != family})
                if outside:
                    errors.append(err(f"record {rec.id}: skill(s) of another family than {family!r}: {outside}"))
            if check_arguments:
                errors += [err(f"record {rec.id}: {p}") for p in argument_problems(rec.graph, catalog)]
        if family is not None and rec.family != family:
            what = "negative" if isinstance(rec, Negative) else "record"
            errors.append(err(f"{what} {rec.id}: family {rec.family!r}, expected {family!r}"))
        if rec.id in seen:
            errors.append(err(f"duplicate record id {rec.id!r} (first on line {seen[rec.id]})"))
        else:
            seen[rec.id] = lineno
        yield lineno, rec, errors


def argument_problems(graph: TaskGraph, catalog: Catalog) -> list[str]:
    """Each node's argument names against its skill's declared ones (skills the catalog lacks are skipped)."""
    problems = []
    for i, node in enumerate(graph.nodes):
        skill = catalog.skills.get(node.task)
        if skill is None:
            continue
        declared = skill.argument_names
        given = [a.name for a in node.arguments]
        extra = [n for n in given if n not in declared]
        if extra:
            what = f"declared: {list(declared)}" if declared else "the catalog declares no arguments for it"
            problems.append(f"node {i} ({node.task}) has undeclared argument(s) {extra} ({what})")
        missing = [a.name for a in skill.arguments if a.required and a.name not in given]
        if missing:
            problems.append(f"node {i} ({node.task}) lacks required argument(s) {missing}")
    return problems


def read_records(path: str | Path, catalog: Catalog | None = None, *, skip_invalid: bool = False,
                 family: str | None = None) -> RecordSet:
    """Read and validate a records file.

    catalog: when given, every node's skill id must be in it (else :class:`UnknownSkillError`).
    family: when given, every record must belong to this family.
    skip_invalid: collect bad lines in ``RecordSet.skipped`` instead of raising on the first.
    Argument names are not checked here (scoring reads gold files whose catalogs may be partial); use
    :func:`validate_records` for the full checks.
    """
    path = Path(path)
    out = RecordSet([], [], str(path))
    for _, rec, errors in _check(iter_jsonl(path, errors="yield"), path, catalog, family, False):
        if errors:
            if not skip_invalid:
                raise errors[0]
            out.skipped.append(errors[0])
        elif isinstance(rec, Negative):
            out.negatives.append(rec)
        else:
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
