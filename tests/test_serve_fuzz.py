"""The OpenAPI schema fuzzed with schemathesis against a real ``skillbank serve`` on loopback (tiny model), with
every check (``--checks all``) on schema-valid and schema-breaking data: no 500, every request the schema
allows is accepted, every request it forbids is refused, answers match their documented schemas, statuses and
content types, auth is enforced, ``Allow`` lists the methods, a deleted job is gone. Bounded: a fixed seed, a
few examples per operation and a time budget, so the run stays around a minute. Runs in ``make test``
(schemathesis is in the dev extra).

Two pieces of configuration, both statements about this API rather than exemptions: 413 counts as a refusal
(how the service refuses a request text or list over its limits; schemathesis' default list lacks it), and
tests/fuzz_hooks.py supplies the learn call's rules between fields that JSON Schema cannot state."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
import schemathesis  # noqa: E402,F401 - a dev dependency: missing, this test must fail, not skip

from serve_helpers import MAX_NEW, TOKEN, build_bank, free_port, wait_healthy  # noqa: E402

MAX_EXAMPLES = 10  # per operation and phase
MAX_TIME_S = 30  # the phases repeat until this budget is spent
SEED = 0
SCHEMATHESIS_CLI = "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())"
REFUSALS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]


@pytest.fixture(scope="module")
def fuzz_bank(tmp_path_factory, tiny_model_dir, small_stream):
    return build_bank(tmp_path_factory.mktemp("fuzz") / "bank", tiny_model_dir, small_stream,
                      small_stream.family_keys[:2])


@pytest.mark.attack
def test_openapi_fuzz_with_every_check_finds_nothing(tmp_path, fuzz_bank):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    # The admin token is set and given to the fuzzer, so the admin routes are fuzzed past their 401. The learn
    # job the fuzzer starts (the first valid upload; later ones are 409 while it runs) trains a family into this
    # throw-away bank with one thread.
    env = {**os.environ, "SKILLBANK_ADMIN_TOKEN": TOKEN, "TMPDIR": str(tmp_path)}
    config = tmp_path / "schemathesis.toml"
    config.write_text("[checks.negative_data_rejection]\nexpected-statuses = " + json.dumps(REFUSALS) + "\n")
    tests_dir = str(Path(__file__).parent)
    fuzz_env = {**os.environ, "SCHEMATHESIS_HOOKS": "fuzz_hooks",
                "PYTHONPATH": os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")]))}
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "skillbank", "serve", str(fuzz_bank), "--port", str(port),
                                   "--max-new-tokens", str(MAX_NEW), "--threads", "1", "--learn-threads", "1",
                                   "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=log, env=env)
        try:
            wait_healthy(url, 180, server)
            report = tmp_path / "report.json"
            run = subprocess.run(
                [sys.executable, "-c", SCHEMATHESIS_CLI, "--config-file", str(config), "run", f"{url}/openapi.json",
                 "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--max-time", str(MAX_TIME_S),
                 "--seed", str(SEED), "--workers", "1", "--no-color",
                 "--generation-allow-x00", "true", "-H", f"Authorization: Bearer {TOKEN}",
                 "--report", "json", "--report-json-path", str(report)],
                capture_output=True, text=True, timeout=MAX_TIME_S + 120, cwd=tmp_path, env=fuzz_env)
        finally:
            server.terminate()
            server.wait(60)
    assert report.exists(), f"schemathesis wrote no report:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    result = json.loads(report.read_text())
    cases = result["test_cases"]
    print(f"schemathesis {result['schemathesis_version']}: {cases['generated']} examples over "
          f"{len(result['valid_rates'])} operations in {result['running_time']:.1f} s, "
          f"{cases['with_failures']} with failures, {cases['errored']} errored (seed {SEED})")
    assert run.returncode == 0 and not result["failures"] and not result["errors"], run.stdout[-6000:]
    assert cases["with_failures"] == 0 and cases["errored"] == 0
    assert len(result["valid_rates"]) >= 10 and cases["generated"] >= 100  # the whole API was exercised
    assert "unhandled error" not in log_path.read_text()  # no 500 the fuzzer's check could have missed
