"""Which running ``skillbank serve`` serves a bank, so that ``skillbank plan`` in a fresh shell can ask it.

A plan from a fresh process pays for importing torch and transformers and loading the base model (~7 s on a
2-core CPU) before its first token; a running service has paid that already. ``skillbank serve`` records
itself under the skillbank cache root (``serving/<key>.json``: url, pid, bank path; the key hashes the bank's
resolved path) while it listens and removes the record when it stops. ``skillbank plan`` looks the bank up:
when a live service is recorded and serves the same shards, the request goes to its ``/v1/plan`` - the same
planner, the same :class:`~skillbank.planner.Plan` JSON - and the command says so on stderr. A record whose
process is gone is removed; a service that does not answer is reported and the plan is made in-process.

Standard library only: this module is read on the cold path.
"""
from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from skillbank.cache import cache_root
from skillbank.errors import SkillbankError


class RemoteError(SkillbankError):
    """The service answered with an error, or not at all."""


def record_path(bank: str | os.PathLike) -> Path:
    key = hashlib.sha256(str(Path(bank).resolve()).encode()).hexdigest()[:16]
    return cache_root() / "serving" / f"{key}.json"


def register(bank: str | os.PathLike, url: str) -> Path:
    path = record_path(bank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "bank": str(Path(bank).resolve())}) + "\n")
    os.replace(tmp, path)
    return path


def unregister(bank: str | os.PathLike) -> None:
    """Remove the record if it is this process's (another service may have taken the bank over since)."""
    found = _read(record_path(bank))
    if found is not None and found.get("pid") == os.getpid():
        record_path(bank).unlink(missing_ok=True)


def lookup(bank: str | os.PathLike) -> dict | None:
    """The live service recorded for ``bank``: ``{"url", "pid", "bank"}``, or None."""
    path = record_path(bank)
    found = _read(path)
    if found is None:
        return None
    if found.get("bank") != str(Path(bank).resolve()) or not _alive(found.get("pid")):
        path.unlink(missing_ok=True)  # its process is gone
        return None
    return found


def served_shards(url: str, timeout_s: float = 5.0) -> list[str]:
    cards = _call(url.rstrip("/") + "/v1/models", None, timeout_s)
    return sorted(c["id"] for c in cards.get("data", []) if c.get("parent"))


def plan_remote(url: str, requests: list[str], *, shard: str | None, max_new_tokens: int | None, explain: bool,
                timeout_s: float = 600.0) -> list[dict]:
    body = {"request": requests, "shard": shard, "explain": explain}
    if max_new_tokens:
        body["max_new_tokens"] = max_new_tokens
    return _call(url.rstrip("/") + "/v1/plan", body, timeout_s)["plans"]


def _call(url: str, body: dict | None, timeout_s: float) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise RemoteError(f"the service at {url} answered {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RemoteError(f"the service at {url} did not answer: {getattr(exc, 'reason', exc)}") from None


def _read(path: Path) -> dict | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("url"), str) else None


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
