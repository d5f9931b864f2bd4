"""What every command module of the CLI shares: the two consoles, library errors as one-line messages, percent
cells, and the hidden aliases that keep the old command names working for one release."""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable

import typer
from rich.console import Console
from rich.markup import escape

from skillbank.errors import SkillbankError

out = Console()
err = Console(stderr=True)


def friendly_errors(fn: Callable) -> Callable:
    """Turn library errors into a one-line message on stderr and exit code 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SkillbankError as exc:
            # escaped: messages name config sections such as [method_train], which rich would take for markup
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
    return wrapper


def deprecated(fn: Callable, old: str, new: str) -> Callable:
    """``fn`` under its old name: one line on stderr naming the new spelling, then the command as before."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        print(f"warning: `skillbank {old}` is deprecated and will be removed in the next release; "
              f"use `skillbank {new}`", file=sys.stderr)
        return fn(*args, **kwargs)
    return wrapper


def threads_option(help_: str = "Threads to compute with (default: $SKILLBANK_THREADS, else the physical "
                   "cores, at most 8; `skillbank doctor` shows which).") -> typer.models.OptionInfo:
    return typer.Option(None, "--threads", min=1, help=help_)


def use_threads(threads: int | None) -> None:
    """Make ``--threads`` what every part of this command computes with: torch, llama.cpp, the encoder and any
    process it starts all read ``$SKILLBANK_THREADS`` (:func:`skillbank.model.threads.default_threads`)."""
    if threads is not None:
        os.environ["SKILLBANK_THREADS"] = str(threads)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def scope_encoder_name(value: str) -> str | None:
    """A ``--scope-encoder`` value: 'none' is the word statistics alone."""
    return None if value.strip().lower() == "none" else value
