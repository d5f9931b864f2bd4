"""Reading the JSON state files skillbank writes (manifests, stream and selector metadata, catalogs).

One place for the three ways such a file can be wrong - missing, not JSON, another format version - so
every caller reports them the same way, naming the file, in its own error type.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from skillbank.errors import SkillbankError


def read_json(path: str | Path, error: type[SkillbankError], *, missing: str | None = None,
              expect_format: int | None = None, what: str = "file") -> Any:
    """Decode ``path``; raise ``error`` naming the file when it is missing, malformed or of another format.

    missing: the message when the file does not exist (default: "<path>: no such file").
    expect_format: when given, the object's ``format`` field must equal it.
    """
    path = Path(path)
    if not path.is_file():
        raise error(missing or f"{path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # JSON is UTF-8; -sig accepts a byte-order mark
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}; JSON is "
                    "UTF-8)") from None
    if expect_format is not None:
        found = data.get("format") if isinstance(data, dict) else None
        if found != expect_format:
            raise error(f"{path}: {what} format {found!r}, this skillbank reads format {expect_format}")
    return data
