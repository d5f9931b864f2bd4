"""Service hardening (issue 15): a learn job dies with its server and never publishes after it; the uploaded
records are removed on every exit path; a connection that stalls in its request head is closed."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

import httpx  # noqa: E402
from serve_helpers import (AUTH, MAX_NEW, TOKEN, build_bank, copy_bank, free_port, jsonl, wait_for,  # noqa: E402
                           wait_healthy)

# Long enough that the job is still training when the test stops its server (the test never waits for it).
LONG_TRAIN = {"epochs": 500}


@pytest.fixture(scope="module")
def two_family_bank(tmp_path_factory, tiny_model_dir, small_stream):
    return build_bank(tmp_path_factory.mktemp("hardening") / "bank", tiny_model_dir, small_stream,
                      small_stream.family_keys[:2])


def bank_state(bank: Path) -> tuple[bytes, list[str]]:
    """What a publish changes: the manifest and the shard directories."""
    return (bank / "bank.json").read_bytes(), sorted(p.name for p in (bank / "shards").iterdir())


@contextlib.contextmanager
def server(bank: Path, tmp: Path, *args: str):
    """``skillbank serve`` in its own process, with its own TMPDIR (so the test sees exactly the learn jobs' work
    directories) and an admin token. Yields (process, url)."""
    tmp.mkdir(exist_ok=True)
    port = free_port()
    env = {**os.environ, "SKILLBANK_ADMIN_TOKEN": TOKEN, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "skillbank", "serve", str(bank), "--port", str(port),
                             "--max-new-tokens", str(MAX_NEW), "--learn-threads", "1", "--threads", "1",
                             "--log-level", "warning", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 180, proc)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (Linux /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def start_learning(url: str, family: str, records: str) -> dict:
    r = httpx.post(url + "/v1/families", json={"family": family, "records": records, "train": LONG_TRAIN},
                   headers=AUTH, timeout=30)
    assert r.status_code == 202, r.text
    job = r.json()
    wait_for(lambda: httpx.get(f"{url}/v1/families/{job['job']}", headers=AUTH, timeout=10).json()["state"]
             == "training", 300, "the learn job to train")
    return job


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the learn process in /proc")


@needs_proc
def test_learner_dies_with_a_killed_server_and_publishes_nothing(tmp_path, two_family_bank, small_stream):
    k3 = small_stream.family_keys[2]
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    before = bank_state(bank)
    learner = None
    try:
        with server(bank, tmp_path / "tmp") as (proc, url):
            start_learning(url, k3, jsonl(small_stream.train[k3]))
            [learner] = children(proc.pid)
            assert list((tmp_path / "tmp").glob("skillbank-learn-*/records.jsonl"))
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            wait_for(lambda: not alive(learner), 30, "the learn process to die with its server")
        assert bank_state(bank) == before
        # The orphaned learner removed the uploaded records itself (nobody else is left to).
        assert not list((tmp_path / "tmp").glob("skillbank-learn-*"))
    finally:
        if learner is not None and alive(learner):
            os.kill(learner, signal.SIGKILL)


@needs_proc
def test_server_sigterm_stops_the_learner_and_removes_the_records(tmp_path, two_family_bank, small_stream):
    k3 = small_stream.family_keys[2]
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    before = bank_state(bank)
    learner = None
    try:
        with server(bank, tmp_path / "tmp") as (proc, url):
            start_learning(url, k3, jsonl(small_stream.train[k3]))
            [learner] = children(proc.pid)
            proc.send_signal(signal.SIGTERM)
            # uvicorn shuts down gracefully (the lifespan's clean-up runs), then re-raises the signal it caught
            assert proc.wait(60) in (0, -signal.SIGTERM), proc.stderr.read()
            wait_for(lambda: not alive(learner), 30, "the learn process to stop")
        assert bank_state(bank) == before
        assert not list((tmp_path / "tmp").glob("skillbank-learn-*")), "uploaded records left after SIGTERM"
    finally:
        if learner is not None and alive(learner):
            os.kill(learner, signal.SIGKILL)


@needs_proc
def test_a_killed_learner_leaves_no_records(tmp_path, two_family_bank, small_stream):
    k3 = small_stream.family_keys[2]
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    before = bank_state(bank)
    with server(bank, tmp_path / "tmp") as (proc, url):
        job = start_learning(url, k3, jsonl(small_stream.train[k3]))
        [learner] = children(proc.pid)
        os.kill(learner, signal.SIGKILL)  # an out-of-memory kill, say
        wait_for(lambda: httpx.get(f"{url}/v1/families/{job['job']}", headers=AUTH, timeout=10).json()["state"]
                 == "failed", 60, "the job to fail")
        status = httpx.get(f"{url}/v1/families/{job['job']}", headers=AUTH, timeout=10).json()
        assert "killed by signal 9" in status["error"]
        assert not list((tmp_path / "tmp").glob("skillbank-learn-*"))
        assert bank_state(bank) == before


def learner_args(workdir: Path, parent: int, bank: Path) -> list[str]:
    return ["--bank", str(bank), "--family", "fam", "--data", str(workdir / "records.jsonl"),
            "--status", str(workdir / "status.json"), "--parent-pid", str(parent), "--workdir", str(workdir)]


def test_a_learner_whose_parent_is_already_gone_exits_at_once(tmp_path):
    # The race check after arming the death signal: the parent may die between the fork and the prctl.
    workdir = tmp_path / "job"
    workdir.mkdir()
    (workdir / "records.jsonl").write_text("{}\n")
    not_my_parent = 1
    proc = subprocess.run([sys.executable, "-m", "skillbank.serve.learn_process",
                           *learner_args(workdir, not_my_parent, tmp_path / "bank")], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert not workdir.exists()


@needs_proc
def test_the_watcher_thread_alone_ends_an_orphaned_learner(tmp_path):
    """Without the parent-death signal (as off Linux), the watcher thread ends the learner even while its main
    thread is busy in one long call (here: reading the records takes ten minutes)."""
    workdir = tmp_path / "job"
    workdir.mkdir()
    (workdir / "records.jsonl").write_text("{}\n")
    learner_code = ("import sys, time, skillbank.serve.learn_process as m, skillbank.data.records as r; "
                    "m.ParentWatch._death_signal = staticmethod(lambda: 'disabled by the test'); "
                    "r.read_records = lambda *a, **k: time.sleep(600); "
                    "sys.exit(m.main(sys.argv[1:]))")
    parent_code = ("import os, subprocess, sys, time; "
                   f"p = subprocess.Popen([sys.executable, '-c', {learner_code!r}, "
                   f"*{learner_args(workdir, 0, tmp_path / 'bank')!r}[:-4], '--parent-pid', str(os.getpid()), "
                   f"'--workdir', {str(workdir)!r}], stderr=open({str(tmp_path / 'learner.log')!r}, 'w')); "
                   "print(p.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    learner = int(parent.stdout.readline())
    try:
        wait_for(lambda: (workdir / "status.json").exists(), 120, "the learner to start")
        assert "watched every" in (tmp_path / "learner.log").read_text()  # says it runs on the fallback
        parent.kill()
        parent.wait(30)
        wait_for(lambda: not alive(learner), 30, "the watcher to end the learner")
        assert not workdir.exists()
    finally:
        if alive(learner):
            os.kill(learner, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def test_records_removed_when_the_learn_process_fails(tmp_path, small_stream):
    import asyncio

    from skillbank.serve.learn_jobs import LearnManager

    k3 = small_stream.family_keys[2]

    async def run():
        finished = asyncio.Event()

        async def on_finished():
            finished.set()
            return []
        # A bank directory that is gone by the time the learner opens it: the learn process itself fails.
        manager = LearnManager(tmp_path / "no-bank", threads=1, on_finished=on_finished)
        job = manager.start(k3, jsonl(small_stream.train[k3]), served={})
        assert (job.workdir / "records.jsonl").exists()
        await asyncio.wait_for(finished.wait(), 120)
        return job

    job = asyncio.run(run())
    assert job.state == "failed" and "does not exist" in job.error
    assert not job.workdir.exists()


def closed_within(sock: socket.socket, seconds: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still open after ``seconds``."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except socket.timeout:
        raise AssertionError(f"the connection is still open after {seconds} s; received {got!r}") from None
    except ConnectionResetError:
        pass
    return got


def read_response(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) from a kept-alive connection."""
    sock.settimeout(30)
    got = b""
    while b"\r\n\r\n" not in got:
        got += sock.recv(4096)
    head, _, body = got.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


@pytest.mark.attack
def test_half_open_connections_are_closed(tmp_path, two_family_bank):
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    with server(bank, tmp_path / "tmp", "--header-timeout-s", "1", "--keep-alive-s", "2") as (proc, url):
        port = int(url.rsplit(":", 1)[1])

        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=10)

        with connect() as silent:  # opens and sends nothing
            assert closed_within(silent, 30) == b""
        with connect() as partial:  # a request line and one header, then nothing
            partial.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            answer = closed_within(partial, 30)
            assert answer.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 1 s" in answer
        with connect() as slow:  # slowloris: a header byte every 0.1 s does not extend the deadline
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            t0 = time.monotonic()
            with pytest.raises(OSError):
                for _ in range(600):  # a minute of trickling, unless the server cuts it
                    slow.sendall(b"a")
                    time.sleep(0.1)
            assert time.monotonic() - t0 < 30
        with connect() as kept:  # a whole request is answered; a later head gets its own deadline
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_response(kept).startswith(b"HTTP/1.1 200 ")
            time.sleep(0.5)
            kept.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert closed_within(kept, 30).startswith(b"HTTP/1.1 408 ")
        with connect() as idle:  # an idle keep-alive connection is closed after --keep-alive-s
            idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_response(idle).startswith(b"HTTP/1.1 200 ")
            assert closed_within(idle, 30) == b""
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200  # and the server is fine


def test_serve_refuses_a_header_timeout_that_is_not_positive(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "skillbank", "serve", str(tmp_path), "--header-timeout-s", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "header_timeout_s" in proc.stderr and "greater than 0" in proc.stderr, proc.stderr
