"""The OpenAPI schema fuzzed with schemathesis against a real ``skillbank serve`` on loopback (tiny model): no
request the schema allows - or breaks - gets a 500. Bounded: a fixed seed, a few examples per operation and a
time budget, so the run stays well under a minute. Runs in ``make test`` (schemathesis is in the dev extra)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
import schemathesis  # noqa: E402,F401 - a dev dependency: missing, this test must fail, not skip

from serve_helpers import MAX_NEW, TOKEN, build_bank, free_port, wait_healthy  # noqa: E402

MAX_EXAMPLES = 10  # per operation and phase
MAX_TIME_S = 25  # the fuzzing phase repeats until this budget is spent
SEED = 0
SCHEMATHESIS_CLI = "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())"


@pytest.fixture(scope="module")
def fuzz_bank(tmp_path_factory, tiny_model_dir, small_stream):
    return build_bank(tmp_path_factory.mktemp("fuzz") / "bank", tiny_model_dir, small_stream,
                      small_stream.family_keys[:2])


def test_openapi_fuzz_finds_no_server_error(tmp_path, fuzz_bank):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    # The admin token is set and given to the fuzzer, so the admin routes are fuzzed past their 401. A learn
    # job the fuzzer might start trains a family into this throw-away bank with one thread.
    env = {**os.environ, "SKILLBANK_ADMIN_TOKEN": TOKEN, "TMPDIR": str(tmp_path)}
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "skillbank", "serve", str(fuzz_bank), "--port", str(port),
                                   "--max-new-tokens", str(MAX_NEW), "--threads", "1", "--learn-threads", "1",
                                   "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=log, env=env)
        try:
            wait_healthy(url, 180, server)
            report = tmp_path / "report.json"
            run = subprocess.run(
                [sys.executable, "-c", SCHEMATHESIS_CLI, "run", f"{url}/openapi.json",
                 "--checks", "not_a_server_error", "--max-examples", str(MAX_EXAMPLES), "--max-time", str(MAX_TIME_S),
                 "--seed", str(SEED), "--workers", "1", "--no-color",
                 "--generation-allow-x00", "true", "-H", f"Authorization: Bearer {TOKEN}",
                 "--report", "json", "--report-json-path", str(report)],
                capture_output=True, text=True, timeout=MAX_TIME_S + 120, cwd=tmp_path)
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
