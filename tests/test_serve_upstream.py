"""--upstream mode over real HTTP on loopback: routing stays in the front service, generation is done by a
second `skillbank serve` process (standing in for vLLM), which gets the routed shard as the model name."""
import json

import pytest

pytest.importorskip("fastapi")

import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import MAX_NEW, TOKEN, build_bank, copy_bank, free_port, serve_process, wait_for  # noqa: E402

from skillbank.serve.app import create_app, service_of  # noqa: E402
from skillbank.serve.config import ServeConfig  # noqa: E402


@pytest.fixture(scope="module")
def bank_dir(tmp_path_factory, tiny_model_dir, small_stream):
    return build_bank(tmp_path_factory.mktemp("upstream") / "bank", tiny_model_dir, small_stream,
                      small_stream.family_keys[:2])


def test_upstream_mode_routes_here_and_generates_there(bank_dir, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    reqs = [r.request for k in (k1, k2) for r in small_stream.test[k]]
    with serve_process(bank_dir, "--max-new-tokens", str(MAX_NEW)) as upstream:
        # every request routed and generated: six training requests a family are too few for the scope check
        front = create_app(bank_dir, ServeConfig(upstream=upstream, max_new_tokens=MAX_NEW, scope=False))
        svc = service_of(front)
        assert svc.snapshot.bank.execution is None  # the front loads no model
        with TestClient(front) as c:
            assert c.get("/healthz").json()["mode"] == "upstream"
            plans = c.post("/v1/plan", json={"request": reqs}).json()["plans"]
            shards, _ = svc.snapshot.route(reqs)
            assert [p["shard"] for p in plans] == shards
            # the upstream does not report log-probabilities; routing is known here (the scope check is off)
            assert all(p["confidence"]["executor_logprob"] is None and p["confidence"]["scope_margin"] is None
                       and not p["out_of_scope"] and not p["failed"] for p in plans)
            for req, p in zip(reqs, plans):
                # what the upstream generates for that request when the routed shard is forced
                direct = httpx.post(upstream + "/v1/plan", json={"request": req, "shard": p["shard"]},
                                    timeout=60).json()["plans"][0]
                assert p["valid"] == direct["valid"] and p["graph"] == direct["graph"]
                assert p["routed"] and set(p["probabilities"]) == {k1, k2}
                if not direct["valid"]:
                    assert p["raw"] == direct["raw"]
            chat = c.post("/v1/chat/completions", json={"model": k2, "messages": [{"role": "user", "content": reqs[0]}]})
            assert chat.status_code == 200 and chat.json()["model"] == k2
            direct = httpx.post(upstream + "/v1/chat/completions",
                                json={"model": k2, "messages": [{"role": "user", "content": reqs[0]}]}, timeout=60).json()
            assert chat.json()["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
            # the upstream counted what it generated, by shard
            text = httpx.get(upstream + "/metrics").text
            assert 'skillbank_plans_total{shard="' in text


def test_upstream_down_is_a_502(bank_dir, small_stream):
    front = create_app(bank_dir, ServeConfig(upstream=f"http://127.0.0.1:{free_port()}", max_new_tokens=MAX_NEW,
                                             scope=False))
    with TestClient(front) as c:
        # an in-scope request: an out-of-scope one is answered here, without the upstream
        r = c.post("/v1/plan", json={"request": small_stream.test[small_stream.family_keys[0]][0].request})
        assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
        assert json.loads(r.text)["error"]["type"] == "upstream_error"
        assert c.get("/healthz").json()["status"] == "ok"


def test_upstream_front_checks_a_shard_on_its_first_request(tmp_path, bank_dir, small_stream):
    """The front hashes no shard at startup (opening must not grow with the number of shards); a shard deleted or
    corrupted on disk is found on its first routed request, which is answered as failed, naming it (no server
    path), while the other shard keeps being served (here: reaches the upstream, which is down, so a 502)."""
    from skillbank.memory.bank import read_manifest
    k1, k2 = small_stream.family_keys[:2]
    bank = copy_bank(bank_dir, tmp_path / "bank")
    entry = {s.name: s for s in read_manifest(bank).shards}[k2]
    weights = bank / entry.dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    front = create_app(bank, ServeConfig(upstream=f"http://127.0.0.1:{free_port()}", max_new_tokens=MAX_NEW))
    svc = service_of(front)
    with TestClient(front) as c:
        assert c.get("/healthz").json()["status"] == "ok" and svc.snapshot.verified == set()
        for _ in range(2):  # a failed check is not remembered as passed
            r = c.post("/v1/plan", json={"request": small_stream.test[k2][0].request, "shard": k2})
            assert r.status_code == 200
            [p] = r.json()["plans"]
            assert p["failed"] and f"shard '{k2}'" in p["error"] and "does not match its digest" in p["error"]
            assert str(bank.resolve()) not in r.text
        r = c.post("/v1/plan", json={"request": small_stream.test[k1][0].request, "shard": k1})
        assert r.status_code == 502 and svc.snapshot.verified == {k1}
        assert 'skillbank_errors_total{kind="shard"} 2.0' in c.get("/metrics").text


def test_out_of_scope_is_answered_before_the_upstream(bank_dir, small_stream):
    """The scope check runs in the front, before the engine: with the upstream down, an out-of-scope request is
    still answered (and counted), an in-scope one is a 502."""
    front = create_app(bank_dir, ServeConfig(upstream=f"http://127.0.0.1:{free_port()}", max_new_tokens=MAX_NEW))
    off = "what is the capital of France?"
    with TestClient(front) as c:
        [p] = c.post("/v1/plan", json={"request": off}).json()["plans"]
        assert (p["out_of_scope"], p["shard"], p["graph"], p["valid"]) == (True, None, None, False)
        assert "no learned skill family covers this request" in p["reason"] and p["confidence"]["scope_margin"] < 0
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": off}]})
        assert chat.status_code == 200 and chat.json()["skillbank"]["out_of_scope"] is True
        assert chat.json()["choices"][0]["message"]["content"].startswith("No skill in this bank covers")
        # a held-out request the front finds in scope (six training requests a family do not cover them all)
        inside = next(r.request for r in small_stream.test[small_stream.family_keys[0]]
                      if service_of(front).snapshot.bank.check_scope([r.request])[0].in_scope)
        assert c.post("/v1/plan", json={"request": [off, inside]}).status_code == 502
        assert 'skillbank_out_of_scope_total{closest="' in c.get("/metrics").text


def test_snapshots_keep_the_scope_statistics(tmp_path, tiny_model_dir, small_stream):
    """A snapshot opened without the model (upstream mode), and one picked up after a learn, can tell out of
    scope: the scope statistics travel with the Address Memory."""
    from serve_helpers import CFG, fresh_base

    from skillbank.memory.bank import SkillBank
    from skillbank.serve.state import newer_snapshot, open_snapshot

    k1, k2 = small_stream.family_keys[:2]
    bank = build_bank(tmp_path / "bank", tiny_model_dir, small_stream, [k1])
    # a request the family was trained on: six training requests a family do not cover every held-out one
    off, inside = "what is the capital of France?", small_stream.train[k1][0].request
    snap = open_snapshot(bank, load_model=False)
    assert [v.in_scope for v in snap.bank.check_scope([off, inside])] == [False, True]
    SkillBank.open(bank, base=fresh_base(tiny_model_dir)).learn(k2, small_stream.train[k2], CFG,
                                                                 catalog=small_stream.catalog, progress=False)
    new = newer_snapshot(snap)
    assert new.shard_names == [k1, k2] and sorted(new.bank.scope.classes_) == [k1, k2]
    assert [v.in_scope for v in new.bank.check_scope([off, small_stream.train[k2][0].request])] == [False, True]


def test_learning_in_upstream_mode_loads_the_new_shard_upstream(tmp_path, bank_dir, small_stream):
    """After a learn, the front asks the upstream to load the new LoRA module (vLLM's /v1/load_lora_adapter,
    which `skillbank serve` answers too) before it routes anything to it."""
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = copy_bank(bank_dir, tmp_path / "bank")
    records = "".join(json.dumps(r.to_dict()) + "\n" for r in small_stream.train[k3])
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with serve_process(bank, "--max-new-tokens", str(MAX_NEW), token=TOKEN) as upstream:
        front = create_app(bank, ServeConfig(upstream=upstream, max_new_tokens=MAX_NEW, admin_token=TOKEN))
        with TestClient(front) as c:
            job = c.post("/v1/families", json={"family": k3, "records": records}, headers=auth).json()
            wait_for(lambda: c.get(f"/v1/families/{job['job']}", headers=auth).json()["state"] in ("done", "failed"),
                     600, "the learn job")
            assert c.get(f"/v1/families/{job['job']}", headers=auth).json()["state"] == "done"
            assert [m["id"] for m in httpx.get(upstream + "/v1/models").json()["data"]] == ["skillbank", k1, k2, k3]
            r = c.post("/v1/plan", json={"request": small_stream.test[k3][0].request, "shard": k3})
            assert r.status_code == 200 and r.json()["plans"][0]["shard"] == k3
        # the upstream refuses to load anything but a shard its bank published
        bad = httpx.post(upstream + "/v1/load_lora_adapter", headers=auth,
                         json={"lora_name": k3, "lora_path": "/etc"})
        assert bad.status_code == 409 and "is at" in bad.json()["error"]["message"]
        assert httpx.post(upstream + "/v1/load_lora_adapter", json={"lora_name": k3, "lora_path": "/etc"}).status_code == 401


def test_upstream_mode_sends_the_shard_grammar_and_the_upstream_follows_it(bank_dir, small_stream):
    """The front sends each job's shard grammar as vLLM's ``structured_outputs``; the stand-in upstream
    decodes under the grammar it is sent (a narrower one than its own shard's is obeyed too); a grammar
    that does not compile is a 400."""
    from skillbank.memory.execution import read_skills_json, shard_grammar
    from skillbank.memory.bank import read_manifest

    k1 = small_stream.family_keys[0]
    req = small_stream.test[k1][0].request
    entry = read_manifest(bank_dir).shards[0]
    grammar = shard_grammar(entry, read_skills_json(bank_dir / entry.dir / "skills.json"), "skills.json")
    with serve_process(bank_dir, "--max-new-tokens", str(MAX_NEW)) as upstream:
        front = create_app(bank_dir, ServeConfig(upstream=upstream, max_new_tokens=MAX_NEW))
        with TestClient(front) as c:
            plan = c.post("/v1/plan", json={"request": req, "shard": k1}).json()["plans"][0]
            assert plan["constrained"]
        metrics = httpx.get(upstream + "/metrics").text
        assert "skillbank_structured_output_requests_total 1.0" in metrics
        # The same grammar sent by hand gives the same output as the front's job.
        chat = {"model": k1, "messages": [{"role": "user", "content": req}], "max_tokens": MAX_NEW}
        sent = httpx.post(upstream + "/v1/chat/completions", timeout=60,
                          json={**chat, "structured_outputs": {"grammar": grammar.lark()}}).json()
        assert sent["skillbank"]["valid"] == plan["valid"]
        # A narrower grammar: one fixed node. The upstream writes exactly it.
        skill = entry.skills[0].removeprefix(entry.family_prefix)
        only = 'start: "' + skill + '{}"\n' if entry.target_format == "compact" else None
        if only:
            fixed = httpx.post(upstream + "/v1/chat/completions", timeout=60,
                               json={**chat, "structured_outputs": {"grammar": only}}).json()
            assert fixed["skillbank"]["valid"]
            assert json.loads(fixed["choices"][0]["message"]["content"])["task_nodes"] == [
                {"task": entry.skills[0], "arguments": []}]
        bad = httpx.post(upstream + "/v1/chat/completions", timeout=60,
                         json={**chat, "structured_outputs": {"grammar": "start: ("}})
        assert bad.status_code == 400 and "does not compile" in bad.json()["error"]["message"]
