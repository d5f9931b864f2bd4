"""Write-once shard files: the digests a bank's manifest records for each shard, and the check that a shard's
files are still the ones it recorded. Both the bank (opening, verifying) and the Execution Memory (loading a
shard on demand) check them, so this sits below both."""
from __future__ import annotations

import hashlib
from pathlib import Path


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def dir_digests(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` by its relative path ("adapter_model.safetensors",
    "skill_address/selector.json")."""
    return {p.relative_to(directory).as_posix(): file_digest(p) for p in sorted(directory.rglob("*")) if p.is_file()}


def shard_file_problems(name: str, directory: Path, digests: dict[str, str]) -> list[str]:
    """Every missing or modified file of one shard (reads and hashes its files)."""
    if not directory.is_dir():
        return [f"shard {name!r} is missing its directory {directory}"]
    problems = []
    for fname, digest in digests.items():
        path = directory / fname
        if not path.is_file():
            problems.append(f"shard {name!r} is missing {path}")
        elif file_digest(path) != digest:
            problems.append(f"shard {name!r}: {path} does not match its digest (modified or corrupted); "
                            "shards are write-once")
    return problems
