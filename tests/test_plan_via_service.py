"""`skillbank plan` asks a running `skillbank serve` of the same bank (skillbank.serve.registry): the same
plans as in-process, said on stderr; a stale record, a service that is gone or serves another bank is never
used quietly."""
import json
import os

import pytest
from typer.testing import CliRunner

from serve_helpers import build_bank, free_port, serve_process
from skillbank.cli import app
from skillbank.serve import registry

runner = CliRunner()
REQUESTS = ["book a table for two at an Italian place tonight", "write a haiku about autumn leaves"]


@pytest.fixture()
def bank(tmp_path, tiny_model_dir, small_stream, monkeypatch):
    monkeypatch.setenv("SKILLBANK_CACHE", str(tmp_path / "cache"))  # inherited by the service process
    return build_bank(tmp_path / "bank", tiny_model_dir, small_stream, small_stream.family_keys[:2])


def flat(text: str) -> str:
    """A CLI message without rich's box and line wrapping."""
    return " ".join(text.replace("│", " ").split())


def plan(*args):
    r = runner.invoke(app, ["plan", *map(str, args), "--max-new-tokens", "8"], catch_exceptions=False)
    return r, [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def test_plan_goes_through_the_running_service_and_answers_as_in_process(bank, tmp_path):
    requests = tmp_path / "requests.txt"
    requests.write_text("\n".join(REQUESTS) + "\n")
    with serve_process(bank) as url:
        assert registry.lookup(bank)["url"] == url
        remote_run, remote = plan(bank, "--file", requests)
        assert remote_run.exit_code == 0 and f"planned by the service at {url}" in remote_run.stderr
        local_run, local = plan(bank, "--file", requests, "--local")
        assert "planned by the service" not in local_run.stderr
        keys = ("id", "request", "shard", "out_of_scope", "reason", "valid", "graph", "raw", "tokens")
        assert [{k: p[k] for k in keys} for p in remote] == [{k: p[k] for k in keys} for p in local]
        assert set(remote[0]) == set(local[0])  # one result type, serialised the same way
        # settings the service cannot honour are planned here
        r, _ = plan(bank, REQUESTS[0], "--no-constrain")
        assert r.exit_code == 0 and "planned by the service" not in r.stderr
        r, _ = plan(bank, REQUESTS[0], "--no-constrain", "--server", url)
        assert r.exit_code != 0 and "apply in this process only" in flat(r.output)
    assert registry.lookup(bank) is None and not registry.record_path(bank).exists()  # removed when it stopped


def test_stale_or_foreign_services_are_not_used(bank, tmp_path, tiny_model_dir, small_stream):
    path = registry.record_path(bank)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": 2 ** 22 + 7, "bank": str(bank.resolve())}))
    assert registry.lookup(bank) is None and not path.exists()  # its process is gone: the record is dropped
    # a live record whose service does not answer: said on stderr, planned here
    registry.register(bank, f"http://127.0.0.1:{free_port()}")
    r, plans = plan(bank, REQUESTS[0])
    assert r.exit_code == 0 and "did not answer" in r.stderr and "planning in this process" in flat(r.stderr)
    assert len(plans) == 1
    registry.unregister(bank)
    # an explicit --server that serves another bank is an error, not another bank's plans
    other = build_bank(tmp_path / "other", tiny_model_dir, small_stream, small_stream.family_keys[2:3])
    with serve_process(other) as url:
        r, _ = plan(bank, REQUESTS[0], "--server", url)
        assert r.exit_code != 0 and "not this bank's" in flat(r.output)
    assert os.environ["SKILLBANK_CACHE"].startswith(str(tmp_path))
