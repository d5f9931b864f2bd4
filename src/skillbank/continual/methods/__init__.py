"""Continual-learning methods: FSM, the baselines and the frozen-base references (see ``base.Method``).

Names resolve through :mod:`skillbank.method_registry` (one table of name -> module path), and
this package imports its modules on first use: importing the registry (as the config does) loads no
method. ``METHODS`` holds the current names' classes in display order (deprecated aliases resolve through
:func:`method_class` but are not listed)."""
from __future__ import annotations

from skillbank.method_registry import UnknownMethodError, method_class, method_names

__all__ = ["METHODS", "Method", "MethodContext", "MethodParams", "Query", "UnknownMethodError", "method_class"]

_BASE_NAMES = ("Method", "MethodContext", "MethodParams", "Query")


def __getattr__(name: str):
    if name == "METHODS":
        methods = {n: method_class(n) for n in method_names()}
        globals()["METHODS"] = methods  # resolved once
        return methods
    if name in _BASE_NAMES:
        from skillbank.continual.methods import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
