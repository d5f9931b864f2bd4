"""Where skillbank keeps what it converts once and reuses: base models converted to safetensors (models/) and
sentence encoders in ONNX form (encoders/). Kept free of heavy imports: a cold ``skillbank plan`` reads it."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The skillbank cache root: ``cache_dir``, else ``$SKILLBANK_CACHE``, else ``~/.cache/skillbank``."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SKILLBANK_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "skillbank"
