"""What produced a result: the command line and the git commit, written beside the result as provenance.json.

Every study of :mod:`skillbank.experiments` that writes a results directory calls :func:`write_provenance`,
so a number in a results/ page can be traced to the command that made it and the code it ran on.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

PROVENANCE = "provenance.json"


def git_commit(where: Path | None = None) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it) of the checkout holding ``where`` (default: this
    package); (None, None) outside a git checkout or without git."""
    cwd = where or Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None, None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=30)
        return head.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def provenance(argv: list[str] | None = None) -> dict:
    """The command (``skillbank ...`` when run through the console script) and the commit that run it."""
    argv = list(sys.argv if argv is None else argv)
    if argv and Path(argv[0]).name in ("skillbank", "__main__.py"):
        argv[0] = "skillbank"
    commit, dirty = git_commit()
    return {"command": shlex.join(argv), "commit": commit, "uncommitted_changes": dirty,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_provenance(out_dir: str | Path, argv: list[str] | None = None) -> Path:
    """Write ``out_dir/provenance.json`` (see :func:`provenance`); returns its path."""
    path = Path(out_dir) / PROVENANCE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(provenance(argv), indent=1) + "\n")
    return path
