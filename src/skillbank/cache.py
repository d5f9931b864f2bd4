"""Where skillbank keeps what it converts once and reuses: base models converted to safetensors (models/),
sentence encoders in ONNX form (encoders/), llama.cpp's forms of the base and shards (llamacpp/), embeddings of
fixed texts (outliers/), what a loaded scope gate derives (scope/); how such a file is written, and how a folder
of many small entries is kept bounded. Kept free of heavy imports: a cold ``skillbank plan`` reads it."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The skillbank cache root: ``cache_dir``, else ``$SKILLBANK_CACHE``, else ``~/.cache/skillbank``."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SKILLBANK_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "skillbank"


@contextmanager
def written_aside(out: Path) -> Iterator[str]:
    """A temporary path beside ``out``, renamed to ``out`` when the block ends and removed if it fails: a crash
    leaves no partial file under that name."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", dir=out.parent)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def used(path: Path) -> None:
    """Mark a cache entry as just used (its modification time), so that :func:`keep_newest` trims it last."""
    try:
        os.utime(path)
    except OSError:
        pass  # gone meanwhile, or a read-only cache: only the order of trimming is affected


def keep_newest(directory: Path, pattern: str, count: int) -> None:
    """Delete all but the ``count`` most recently used files of ``directory`` matching ``pattern``."""
    entries = []
    for path in directory.glob(pattern):
        try:
            entries.append((path.stat().st_mtime_ns, path))
        except FileNotFoundError:  # another process trimmed it
            continue
    for _, path in sorted(entries)[:max(0, len(entries) - count)]:
        path.unlink(missing_ok=True)
