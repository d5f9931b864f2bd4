"""Shared pieces of the service tests: a tiny two-family bank, an app client, a live uvicorn server, a gate
that holds the engine mid-batch (to observe queueing, back-pressure, timeouts and disconnects)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from skillbank.memory.bank import SkillBank
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.train.executor import TrainConfig

CFG = TrainConfig(epochs=1, batch_size=3, target_format="compact", seed=0)
MAX_NEW = 8
TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def jsonl(records) -> str:
    """Records as the JSON Lines body of a learn call."""
    return "".join(json.dumps(r.to_dict()) + "\n" for r in records)


def build_bank(root: Path, model_dir: Path, stream, keys) -> Path:
    base = load_base(BaseModelConfig(name=str(model_dir)), progress=False)
    bank = SkillBank.create(root, base=base)
    for k in keys:
        bank.learn(k, stream.train[k], CFG, catalog=stream.catalog, progress=False)
    return root


def copy_bank(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def fresh_base(model_dir: Path):
    """Each app gets its own base: opening a bank attaches its shards to the base it is given."""
    return load_base(BaseModelConfig(name=str(model_dir)), progress=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not become healthy in {timeout} s")


@contextlib.contextmanager
def live_server(app, **options):
    """Run an app under a real uvicorn server on a free loopback port, in a thread. ``options``: more
    ``uvicorn.Config`` keywords (``ServeConfig.uvicorn_options()``: the connection deadlines ``skillbank serve``
    runs with)."""
    import uvicorn
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 60)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def serve_process(bank: Path, *args: str, token: str | None = None):
    """``skillbank serve BANK`` as a separate process on a free loopback port (``token``: its admin token)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "SKILLBANK_ADMIN_TOKEN"}
    if token:
        env["SKILLBANK_ADMIN_TOKEN"] = token
    proc = subprocess.Popen([sys.executable, "-m", "skillbank", "serve", str(bank), "--port", str(port),
                             "--log-level", "warning", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 180, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


class Gate:
    """Hold the engine thread as it takes jobs into its batch, until released: ``entered`` counts the times."""

    def __init__(self, engine):
        self.engine = engine
        self.open = threading.Event()
        self.entered = threading.Semaphore(0)
        self._orig = engine.join_rows

        def held(batch, jobs):
            self.entered.release()
            self.open.wait(60)
            return self._orig(batch, jobs)

        engine.join_rows = held

    def wait_entered(self, timeout: float = 30) -> None:
        assert self.entered.acquire(timeout=timeout), "no job reached the engine"

    def release(self) -> None:
        self.open.set()


def wait_for(predicate, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
