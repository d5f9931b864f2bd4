"""Typed errors raised by the library. The CLI and HTTP layers turn them into one-line messages."""
from __future__ import annotations

from pathlib import Path


class SkillbankError(Exception):
    """Base class for every error skillbank raises on purpose (bad input, bad state)."""


class GraphError(SkillbankError, ValueError):
    """A task graph is off-contract (see `skillbank.graph`)."""


class RecordError(SkillbankError, ValueError):
    """A record file has a bad line. Carries the file and 1-based line number."""

    def __init__(self, reason: str, path: str | Path | None = None, line: int | None = None):
        self.reason = reason
        self.path = str(path) if path is not None else None
        self.line = line
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(f"{where}{reason}")


class UnknownSkillError(RecordError):
    """A record names a skill id that is not in the catalog it is checked against."""


class CatalogError(SkillbankError, ValueError):
    """A skill catalog or family partition is inconsistent."""


class StreamError(SkillbankError, ValueError):
    """A benchmark stream directory is missing, incomplete or inconsistent."""


class SelectorError(SkillbankError, ValueError):
    """A selector (Address Memory or another router) was used or loaded incorrectly."""


class ScopeError(SelectorError):
    """The scope (out-of-scope) detector was used or loaded incorrectly. A subclass of SelectorError for one
    release, so that code catching SelectorError for it keeps working; catch ScopeError."""


class BankError(SkillbankError):
    """A skill bank on disk is missing, incomplete, corrupted or incompatible."""


class ModelError(SkillbankError, ValueError):
    """A base model, tokenizer, adapter or training/generation setting is missing, invalid or incompatible."""
