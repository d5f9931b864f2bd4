"""The registry of continual methods: a method's name in a config -> the class that implements it (the table
sits below both the config and :mod:`skillbank.continual`, which it names by module path and never imports).

Each class is named by module path and imported on first use (as :mod:`skillbank.memory.selector` does for
selector kinds), so this module imports no method, and :mod:`skillbank.config` can check a configuration's
method names and hyperparameters through :func:`method_class` without importing the methods at module
level. Nothing here imports the config or the runner: the error it raises is its own, and the config
turns it into a ``ConfigError``.

Deprecated names stay resolvable so that saved runs keep loading, resuming and reporting under the name
they were run with (their method directory, variant names and cached outputs carry it).
"""
from __future__ import annotations

import importlib

from skillbank.errors import SkillbankError

#: name -> "module:Class", in the report's display order. One table: a new method is added here.
METHOD_PATHS = {
    "sft": "skillbank.continual.methods.sequential:SequentialSFT",
    "replay": "skillbank.continual.methods.sequential:Replay",
    "lwf": "skillbank.continual.methods.sequential:LwF",
    "ewc": "skillbank.continual.methods.sequential:EWC",
    "olora": "skillbank.continual.methods.stacked:OLoRA",
    "stacked": "skillbank.continual.methods.stacked:StackedLoRA",
    "progressive-routed": "skillbank.continual.methods.stacked:ProgressiveRoutedLoRA",
    "fsm": "skillbank.continual.methods.fsm:FSM",
    "base-skill": "skillbank.continual.methods.references:BaseSkill",
    "base-oracle-fields": "skillbank.continual.methods.references:BaseOracleFields",
}

#: deprecated name -> ("module:Class", what to use instead). Accepted in configs (a saved run's config.json
#: must keep loading); the class runs exactly what the name ran before, under that name.
DEPRECATED_PATHS = {
    "progressive": ("skillbank.continual.methods.stacked:LegacyProgressive",
                    "'progressive' is the old name of 'stacked' (every stage's adapter summed for every request, "
                    "no routing); the routed reading of Progressive-LoRA is 'progressive-routed'"),
}


class UnknownMethodError(SkillbankError, ValueError):
    """A method name that the registry does not know."""


def method_names(deprecated: bool = False) -> list[str]:
    """The registered method names (with ``deprecated``: the deprecated aliases too)."""
    return list(METHOD_PATHS) + (list(DEPRECATED_PATHS) if deprecated else [])


def deprecation(name: str) -> str | None:
    """Why ``name`` is deprecated and what replaces it; None for a current name."""
    entry = DEPRECATED_PATHS.get(name)
    return entry[1] if entry else None


def method_class(name: str):
    """The :class:`~skillbank.continual.methods.base.Method` subclass registered as ``name``."""
    if name in METHOD_PATHS:
        path = METHOD_PATHS[name]
    elif name in DEPRECATED_PATHS:
        path = DEPRECATED_PATHS[name][0]
    else:
        raise UnknownMethodError(f"unknown method {name!r}; known: {', '.join(METHOD_PATHS)}")
    module, attr = path.split(":")
    cls = getattr(importlib.import_module(module), attr)
    if getattr(cls, "name", None) != name:
        raise UnknownMethodError(f"method registry: {path} declares name {cls.name!r}, not {name!r}")
    return cls
