"""The service attacked as a hostile client would (issue 38), on loopback, each case bounded in time: a shard
broken on disk fails only its own requests; an upload is checked whole before 202, whatever its content type;
OpenAI's fields are checked with OpenAI's types; a slow body is dropped; the parser's 400s and the 405s say
what they should; a flooding client cannot starve a polite one. With the earlier hostile cases (marked
``attack`` in test_serve.py and test_serve_hardening.py, and the schema fuzzing in test_serve_fuzz.py) this is
the standing attack suite: ``pytest -m attack``."""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import (AUTH, MAX_NEW, TOKEN, Gate, build_bank, copy_bank, fresh_base,  # noqa: E402
                           live_server, serve_process, wait_for)

from skillbank.memory.bank import read_manifest  # noqa: E402
from skillbank.serve.app import create_app, service_of  # noqa: E402
from skillbank.serve.config import ServeConfig  # noqa: E402

pytestmark = pytest.mark.attack


@pytest.fixture(scope="module")
def bank_dir(tmp_path_factory, tiny_model_dir, small_stream):
    return build_bank(tmp_path_factory.mktemp("attack") / "bank", tiny_model_dir, small_stream,
                      small_stream.family_keys[:2])


def corrupt(bank: Path, shard: str) -> None:
    entry = {s.name: s for s in read_manifest(bank).shards}[shard]
    weights = bank / entry.dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")


def no_server_path(text: str, *paths: Path) -> None:
    for p in paths:
        assert str(p.resolve()) not in text and str(p.absolute()) not in text, text
    assert "/tmp/" not in text, text


def shard_errors(metrics_text: str) -> dict[str, float]:
    out = {}
    for line in metrics_text.splitlines():
        if line.startswith("skillbank_errors_total{"):
            kind = line.split('kind="')[1].split('"')[0]
            out[kind] = float(line.rsplit(" ", 1)[1])
    return out


# -- 1. one bad shard fails only its own requests ---------------------------------------------------------
def test_a_corrupt_shard_fails_only_its_own_requests(tmp_path, bank_dir, tiny_model_dir, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    bank = copy_bank(bank_dir, tmp_path / "bank")
    corrupt(bank, k2)  # before its first use: the lazy load finds the damage
    a, b = [r.request for r in small_stream.test[k1][:2]]
    c = small_stream.test[k2][0].request
    app = create_app(bank, ServeConfig(max_new_tokens=MAX_NEW, scope=False), base=fresh_base(tiny_model_dir))
    with TestClient(app) as client:
        alone = client.post("/v1/plan", json={"request": [a, b]}).json()["plans"]
        resp = client.post("/v1/plan", json={"request": [a, c, b]})
        assert resp.status_code == 200, resp.text
        plans = resp.json()["plans"]
        assert [p["shard"] for p in plans] == [k1, k2, k1]
        healthy = [plans[0], plans[2]]
        assert [(p["failed"], p["raw"], p["tokens"] > 0) for p in healthy] == \
            [(False, q["raw"], True) for q in alone]  # generated exactly as without the broken one
        bad = plans[1]
        assert (bad["failed"], bad["valid"], bad["graph"], bad["raw"], bad["tokens"]) == (True, False, None, "", 0)
        assert f"shard '{k2}'" in bad["error"] and "does not match its digest" in bad["error"]
        no_server_path(resp.text, bank, tiny_model_dir)
        # a second call finds it broken again (a failed load is not remembered as loaded)
        again = client.post("/v1/plan", json={"request": c, "shard": k2}).json()["plans"][0]
        assert again["failed"] and f"shard '{k2}'" in again["error"]
        # chat, in text and in tool_calls form: an assistant message with the reason, no server path
        for extra in ({}, {"tools": [{"type": "function", "function": {"name": "x", "parameters": {}}}]}):
            chat = client.post("/v1/chat/completions", json={"model": k2, **extra,
                                                             "messages": [{"role": "user", "content": c}]})
            assert chat.status_code == 200, chat.text
            body = chat.json()
            message = body["choices"][0]["message"]
            assert message["tool_calls"] is None and message["content"].startswith(f"No plan: shard '{k2}'")
            assert body["skillbank"]["failed"] is True and body["skillbank"]["valid"] is False
            no_server_path(chat.text, bank, tiny_model_dir)
        errors = shard_errors(client.get("/metrics").text)
        assert errors.get("shard") == 4.0 and "generation" not in errors and "internal" not in errors


def test_damaged_skill_statistics_fail_only_their_shards_requests(tmp_path, bank_dir, tiny_model_dir, small_stream):
    """The skill prior's files are part of the shard: damaged, the shard's requests fail by name (no server
    path), the other shards' plan as before."""
    k1, k2 = small_stream.family_keys[:2]
    bank = copy_bank(bank_dir, tmp_path / "bank")
    entry = next(e for e in read_manifest(bank).shards if e.name == k2)
    stats = bank / entry.dir / "skill_address" / "stats.npz"
    stats.write_bytes(stats.read_bytes()[:-4] + b"\0\0\0\0")
    a, c = small_stream.test[k1][0].request, small_stream.test[k2][0].request
    app = create_app(bank, ServeConfig(max_new_tokens=MAX_NEW, scope=False), base=fresh_base(tiny_model_dir))
    with TestClient(app) as client:
        resp = client.post("/v1/plan", json={"request": [a, c]})
        assert resp.status_code == 200, resp.text
        good, bad = resp.json()["plans"]
        assert good["shard"] == k1 and not good["failed"] and good["tokens"] > 0
        assert bad["failed"] and f"shard '{k2}'" in bad["error"] and "skill_address/stats.npz" in bad["error"]
        no_server_path(resp.text, bank, tiny_model_dir)


def test_a_corrupt_shard_in_upstream_mode(tmp_path, bank_dir, small_stream):
    """The front checks a shard's files on its first routed request: the broken one's requests fail alone, the
    others are generated upstream."""
    k1, k2 = small_stream.family_keys[:2]
    front_bank = copy_bank(bank_dir, tmp_path / "front")
    corrupt(front_bank, k2)
    a, c = small_stream.test[k1][0].request, small_stream.test[k2][0].request
    with serve_process(bank_dir, "--max-new-tokens", str(MAX_NEW), "--no-scope") as upstream:
        front = create_app(front_bank, ServeConfig(upstream=upstream, max_new_tokens=MAX_NEW, scope=False))
        with TestClient(front) as client:
            resp = client.post("/v1/plan", json={"request": [a, c], "shard": None})
            assert resp.status_code == 200, resp.text
            ok, bad = resp.json()["plans"]
            assert (ok["shard"], ok["failed"], ok["tokens"] > 0) == (k1, False, True)
            assert (bad["shard"], bad["failed"]) == (k2, True) and f"shard '{k2}'" in bad["error"]
            no_server_path(resp.text, front_bank, bank_dir)
            assert shard_errors(client.get("/metrics").text).get("shard") == 1.0


# -- 2. an upload is checked whole before 202 -------------------------------------------------------------
def test_every_upload_is_checked_before_202(tmp_path, bank_dir, tiny_model_dir, small_stream):
    k3 = small_stream.family_keys[2]
    bank = copy_bank(bank_dir, tmp_path / "bank")
    manifest = (bank / "bank.json").read_bytes()
    good = [r.to_dict() for r in small_stream.train[k3]]
    app = create_app(bank, ServeConfig(max_new_tokens=MAX_NEW, admin_token=TOKEN), base=fresh_base(tiny_model_dir))
    ndjson = {**AUTH, "Content-Type": "application/x-ndjson"}

    def lines(records) -> str:
        return "".join(json.dumps(r) + "\n" for r in records)  # ensure_ascii: "\ud800" travels as an escape

    def with_request(text: str) -> list[dict]:
        return [good[0], {**good[1], "request": text}, *good[2:]]

    with TestClient(app) as c:
        def refused(resp, match):
            assert resp.status_code == 422, resp.text
            assert match in resp.json()["error"]["message"], resp.text

        for bad_text, why in (("book \ud800 a table", "is not valid Unicode text"),
                              ("book\u0000 a table", "holds the control character U+0000"),
                              ("book \u001b[31m a table", "holds the control character U+001B")):
            # the same record in every form the service takes: refused at once, naming the line
            refused(c.post(f"/v1/families?family={k3}", content=lines(with_request(bad_text)), headers=ndjson),
                    f"line 2: request {why}")
            refused(c.post("/v1/families", json={"family": k3, "records": lines(with_request(bad_text))},
                           headers=AUTH), f"line 2: request {why}")
            if "\ud800" not in bad_text:  # a lone surrogate is not even JSON to the JSON form's parser (400)
                refused(c.post("/v1/families", json={"family": k3, "records": with_request(bad_text)},
                               headers=AUTH), f"line 2: request {why}")
        lone = c.post("/v1/families", headers={**AUTH, "Content-Type": "application/json"},
                      content=json.dumps({"family": k3, "records": with_request("a \ud800 b")}))
        assert lone.status_code == 400 and "malformed JSON" in lone.json()["error"]["message"]
        # a control character in a skill id or an argument value too
        graph = json.loads(json.dumps(good[0]["graph"]))
        graph["task_nodes"][0]["task"] += "\u0007"
        refused(c.post("/v1/families", json={"family": k3, "records": [{**good[0], "graph": graph}, *good[1:]]},
                       headers=AUTH), "line 1: graph.task_nodes[0].task holds the control character U+0007")
        # what only the base model can tell, checked before 202 too
        refused(c.post("/v1/families", json={"family": k3, "records": good, "train": {"max_length": 8}},
                       headers=AUTH), "longer than TrainConfig.max_length=8")
        refused(c.post("/v1/families", json={"family": k3, "records": good, "train": {"target_modules": ["nope"]}},
                       headers=AUTH), "TrainConfig.target_modules names ['nope']")
        refused(c.post("/v1/families", json={"family": k3, "records": good, "train": {"layers_to_transform": [99]}},
                       headers=AUTH), "layers_to_transform names layer 99")
        refused(c.post("/v1/families", json={"family": k3, "records": good, "train": {"alpha": True}},
                       headers=AUTH), "TrainConfig.alpha")
        refused(c.post("/v1/families", json={"family": k3, "records": good, "train": {"rank": 1024}},
                       headers=AUTH), "TrainConfig.rank")
        refused(c.post("/v1/families", json={"family": k3, "records": [{**good[0], "id": True}, *good[1:]]},
                       headers=AUTH), "id must be a string or an integer")
        refused(c.post("/v1/families?family=..%2Fx", json={"family": k3, "records": good}, headers=AUTH),
                "invalid family name")  # the query is checked whatever the body
        assert c.get("/v1/families", headers=AUTH).json() == {"jobs": []}  # nothing started
        assert (bank / "bank.json").read_bytes() == manifest
        assert 'skillbank_errors_total{kind="learn_refused"}' in c.get("/metrics").text


def test_a_record_the_tokenizer_cannot_take_is_named(small_stream, tiny_model_dir):
    """The tokenizer's own refusal (a lone surrogate: a TypeError deep in the tokenizer, what used to fail a job
    13 s after its 202) is a 422 naming the record, checked the way training tokenizes."""
    import dataclasses

    from skillbank.model.base import BaseModelConfig, load_base
    from skillbank.serve.learn_jobs import LearnRefused, check_against_base
    from skillbank.train.executor import TrainConfig

    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    records = list(small_stream.train[small_stream.family_keys[2]])
    modules = {"q_proj", "k_proj", "v_proj", "o_proj"}
    check_against_base(records, TrainConfig(), tokenizer=base.tokenizer, num_layers=base.num_layers,
                       module_names=modules)  # it takes them all
    records[1] = dataclasses.replace(records[1], request="book \ud800 a table")
    with pytest.raises(LearnRefused, match=rf"record {records[1].id}: the base model's tokenizer cannot take it"):
        check_against_base(records, TrainConfig(), tokenizer=base.tokenizer, num_layers=base.num_layers,
                           module_names=modules)


# -- 3. OpenAI's fields with OpenAI's types ---------------------------------------------------------------
def test_openai_fields_are_checked_with_openai_types(bank_dir, tiny_model_dir, small_stream):
    k1 = small_stream.family_keys[0]
    req = small_stream.test[k1][0].request
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW), base=fresh_base(tiny_model_dir))
    base = {"model": k1, "messages": [{"role": "user", "content": req}]}
    wrong = [({"temperature": "hot"}, "temperature"), ({"temperature": 2.5}, "temperature"),
             ({"top_p": 1.5}, "top_p"), ({"max_tokens": "5"}, "max_tokens"), ({"max_tokens": 5.5}, "max_tokens"),
             ({"presence_penalty": -3}, "presence_penalty"), ({"frequency_penalty": True}, "frequency_penalty"),
             ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"n": 0}, "n"), ({"seed": "1"}, "seed"),
             ({"logit_bias": {"42": 101}}, "logit_bias.42"), ({"top_logprobs": 21}, "top_logprobs"),
             ({"logprobs": "yes"}, "logprobs"), ({"user": 7}, "user"), ({"response_format": {"type": "xml"}},
                                                                        "response_format.type"),
             ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools.0"),
             ({"tool_choice": "sometimes"}, "tool_choice"), ({"metadata": {"k": 1}}, "metadata.k"),
             ({"messages": [{"role": "", "content": req}]}, "messages.0.role"),
             ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content")]
    with TestClient(app) as c:
        for extra, param in wrong:
            r = c.post("/v1/chat/completions", json={**base, **extra})
            assert r.status_code == 400, (extra, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and err["param"].startswith(param), (extra, err)
        # right types pass, and fields this service does not know are accepted (and ignored)
        ok = c.post("/v1/chat/completions", json={
            **base, "temperature": 0, "top_p": 1, "max_tokens": 4, "stop": ["\n"], "seed": 3, "n": 1, "stream": False,
            "logit_bias": {"42": -100}, "user": "u1", "response_format": {"type": "text"}, "parallel_tool_calls": True,
            "x_unknown_field": {"anything": [1, 2]}, "messages": [{"role": "developer", "content": "be brief"},
                                                                   {"role": "user", "content": req, "name": "ana"}]})
        assert ok.status_code == 200, ok.text


def test_the_official_openai_client(bank_dir, tiny_model_dir, small_stream):
    """The openai package (a dev dependency: it must be installed, not skipped) against a live server."""
    import openai

    k1 = small_stream.family_keys[0]
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW), base=fresh_base(tiny_model_dir))
    with live_server(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        models = [m.id for m in client.models.list()]
        assert models[0] == "skillbank" and k1 in models
        done = client.chat.completions.create(model=k1, temperature=0, messages=[
            {"role": "user", "content": small_stream.test[k1][0].request}])
        assert done.object == "chat.completion" and done.model == k1 and done.choices[0].message.role == "assistant"
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=k1, temperature=5, messages=[{"role": "user", "content": "hi"}])
        assert info.value.param == "temperature" and info.value.status_code == 400
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])


# -- 4. slow bodies, parser errors, methods ---------------------------------------------------------------
def read_until_closed(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except socket.timeout:
        raise AssertionError(f"still open after {seconds} s; received {got!r}") from None
    except ConnectionResetError:
        pass
    return got


def test_slow_bodies_are_dropped_and_parser_errors_are_json(bank_dir, tiny_model_dir, small_stream):
    k1 = small_stream.family_keys[0]
    cfg = ServeConfig(max_new_tokens=MAX_NEW, body_timeout_s=1.0, body_min_rate=1000, header_timeout_s=5)
    app = create_app(bank_dir, cfg, base=fresh_base(tiny_model_dir))
    with live_server(app, **cfg.uvicorn_options()) as url:
        port = int(url.rsplit(":", 1)[1])

        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=10)

        head = (b"POST /v1/plan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n")
        with connect() as slow:  # the slow-body client: a whole head, then a byte now and then
            slow.sendall(head + b'{"request": "')
            t0 = time.monotonic()
            with pytest.raises(OSError):
                for _ in range(100):  # 30 s of trickling, unless the server cuts it
                    slow.sendall(b"a")
                    time.sleep(0.3)
            answer = read_until_closed(slow, 10)
            # 1 s plus 1 s per 1000 bytes: the ~30 bytes sent buy nothing like the 30 s a 3-s trickle would take
            assert time.monotonic() - t0 < 5
        assert answer.startswith(b"HTTP/1.1 408 ") and b"application/json" in answer, answer
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["type"] == "timeout" and "did not arrive within 1 s" in body["error"]["message"]

        with connect() as trickle:  # answered early (the route reads no body), then still trickling: cut too
            trickle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n")
            t0 = time.monotonic()
            with pytest.raises(OSError):
                for _ in range(100):
                    trickle.sendall(b"a")
                    time.sleep(0.3)
            assert time.monotonic() - t0 < 5

        # a steady body slower than the 1 s base but faster than the minimum rate is read whole
        payload = json.dumps({"request": "book a table " * 180, "shard": k1}).encode()  # ~2.3 kB over ~1.2 s
        with connect() as steady:
            steady.sendall(head.replace(b"1000", str(len(payload)).encode()))
            for i in range(0, len(payload), 100):
                steady.sendall(payload[i:i + 100])
                time.sleep(0.05)
            steady.settimeout(60)
            got = b""
            while b"\r\n\r\n" not in got:
                got += steady.recv(65536)
            assert got.startswith(b"HTTP/1.1 200 "), got[:300]

        for raw, why in ((b"GET /healthz HTTP/1.1\r\n\r\n", b"Host"),
                         (b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b"Host"),
                         (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n", b"")):
            with connect() as sock:
                sock.sendall(raw)
                answer = read_until_closed(sock, 10)
            status, _, rest = answer.partition(b"\r\n")
            assert status.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in rest.lower()
            error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
            assert error["type"] == "invalid_request_error" and error["message"].startswith("invalid HTTP request")
            assert why.decode() in error["message"]
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200  # and the server is fine


def test_405_lists_every_method(bank_dir, tiny_model_dir):
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, admin_token=TOKEN),
                     base=fresh_base(tiny_model_dir))
    with TestClient(app) as c:
        for method, path, allowed in (("OPTIONS", "/v1/families/0123456789ab", "DELETE, GET, HEAD"),
                                      ("PUT", "/v1/families/0123456789ab", "DELETE, GET, HEAD"),
                                      ("GET", "/v1/plan", "POST"), ("DELETE", "/v1/families", "GET, HEAD, POST")):
            r = c.request(method, path, headers=AUTH)
            assert r.status_code == 405 and r.headers["allow"] == allowed, (method, path, r.headers)
            assert r.json()["error"]["message"].startswith("Method Not Allowed")


# -- 5. fair admission ------------------------------------------------------------------------------------
def client_at(url: str, address: str) -> httpx.Client:
    """An HTTP client whose connections come from ``address`` (127.0.0.0/8 is all loopback on Linux)."""
    return httpx.Client(base_url=url, timeout=60, transport=httpx.HTTPTransport(local_address=address))


def test_a_flooding_client_cannot_starve_a_polite_one(bank_dir, tiny_model_dir, small_stream):
    """The flooder fills its own share of the queue and gets 429 past it; the polite client is admitted and
    its request is the next one to reach the engine, ahead of the flooder's backlog."""
    k1 = small_stream.family_keys[0]
    cfg = ServeConfig(max_new_tokens=MAX_NEW, max_batch=1, batch_window_ms=0, queue_size=16, client_queue=3,
                      scope=False)
    app = create_app(bank_dir, cfg, base=fresh_base(tiny_model_dir))
    svc = service_of(app)
    order = []
    real_join = svc.engine.join_rows
    svc.engine.join_rows = lambda batch, jobs: (order.extend(j.client for j in jobs), real_join(batch, jobs))[1]
    body = {"request": "book a table for two", "shard": k1}
    try:
        with live_server(app) as url, client_at(url, "127.0.0.2") as flood, client_at(url, "127.0.0.3") as polite:
            gate = Gate(svc.engine)
            answers = []
            threads = [threading.Thread(target=lambda: answers.append(flood.post("/v1/plan", json=body)))
                       for _ in range(3)]
            threads[0].start()
            gate.wait_entered()  # the flooder's first request holds the engine; two more wait in the queue
            for t in threads[1:]:
                t.start()
            wait_for(lambda: svc.batcher.depth == 3, what="the flooder's backlog")
            over = flood.post("/v1/plan", json=body)
            assert over.status_code == 429 and "too many requests from this client (127.0.0.2)" in over.text
            assert int(over.headers["retry-after"]) >= 1
            polite_answer = {}
            t = threading.Thread(target=lambda: polite_answer.update(r=polite.post("/v1/plan", json=body)))
            t.start()
            wait_for(lambda: svc.batcher.depth == 4, what="the polite request queued")
            gate.release()
            for th in (*threads, t):
                th.join(60)
            assert polite_answer["r"].status_code == 200 and [a.status_code for a in answers] == [200] * 3
            # after the flooder's running request, the polite one goes first, then the flooder's backlog
            assert order[:3] == ["127.0.0.2", "127.0.0.3", "127.0.0.2"], order
            assert 'kind="client_queue_full"' in svc.metrics.render().decode()
    finally:
        svc.engine.join_rows = real_join


def test_without_fair_admission_the_queue_is_first_come_first_served(bank_dir, tiny_model_dir, small_stream):
    """The baseline the fairness is measured against (bench/serve.py --flood): one queue, arrival order."""
    k1 = small_stream.family_keys[0]
    cfg = ServeConfig(max_new_tokens=MAX_NEW, max_batch=1, batch_window_ms=0, queue_size=16, fair_admission=False,
                      scope=False)
    app = create_app(bank_dir, cfg, base=fresh_base(tiny_model_dir))
    svc = service_of(app)
    order = []
    real_join = svc.engine.join_rows
    svc.engine.join_rows = lambda batch, jobs: (order.extend(j.client for j in jobs), real_join(batch, jobs))[1]
    body = {"request": "book a table for two", "shard": k1}
    with live_server(app) as url, client_at(url, "127.0.0.2") as flood, client_at(url, "127.0.0.3") as polite:
        gate = Gate(svc.engine)
        threads = [threading.Thread(target=lambda: flood.post("/v1/plan", json=body)) for _ in range(3)]
        threads[0].start()
        gate.wait_entered()
        for t in threads[1:]:
            t.start()
        wait_for(lambda: svc.batcher.depth == 3, what="the flooder's backlog")
        t = threading.Thread(target=lambda: polite.post("/v1/plan", json=body))
        t.start()
        wait_for(lambda: svc.batcher.depth == 4, what="the polite request queued")
        gate.release()
        for th in (*threads, t):
            th.join(60)
        assert order.index("127.0.0.3") > 2, order  # behind the flooder's backlog


def test_the_step_cost_model():
    """What a row costs the others, from measured steps: a CPU's grows with the rows, a GPU's hardly does."""
    from skillbank.serve.fairness import StepCost

    cost = StepCost()
    assert cost.rows_within(2.0, 16) == 16  # nothing measured yet: no cap
    for _ in range(5):
        cost.observe(1, 0.010)  # a lone row: 10 ms per token (measured while the service was quiet)
    for _ in range(200):
        cost.observe(8, 0.045)  # eight rows: 45 ms - a long flood does not outweigh the quiet measurement
    assert cost.line() == pytest.approx((0.005, 0.005))
    assert cost.rows_within(2.0, 16) == 3 and cost.rows_within(5.0, 16) == 9 and cost.rows_within(1.0, 16) == 1
    flat = StepCost()
    for rows in (1, 8, 16):
        for _ in range(5):
            flat.observe(rows, 0.010)
    assert flat.rows_within(2.0, 16) == 16


def test_fair_admission_caps_the_batch_only_while_clients_share_it():
    """A flood alone gets the whole batch; beside another active client it keeps a row free for it and grows
    only as far as the step cost allows; once the other client is gone, the flood has the batch again."""
    import asyncio

    from skillbank.serve import batcher as batcher_mod
    from skillbank.serve.batcher import Batcher
    from skillbank.serve.engine import Job
    from skillbank.serve.fairness import StepCost

    class Engine:
        continuous = True

        def __init__(self):
            self.cost, self.rows = StepCost(), []
            for rows, seconds in ((1, 0.010), (8, 0.045)):  # rows_within(2.0) == 3
                for _ in range(5):
                    self.cost.observe(rows, seconds)

        def admit(self, jobs, deliver):
            self.rows += [(j, deliver) for j in jobs]

        def finish(self, client):
            i = next(i for i, (j, _) in enumerate(self.rows) if j.client == client)
            job, deliver = self.rows.pop(i)
            deliver(job, "output", None)

        def clients(self):
            return sorted(j.client for j, _ in self.rows)

    async def settle():
        for _ in range(20):
            await asyncio.sleep(0)

    async def scenario():
        engine, loop = Engine(), asyncio.get_running_loop()
        b = Batcher(engine, max_batch=16, window_s=0, queue_size=64, client_queue=32, fair_slowdown=2.0)
        b.start()

        def jobs(client, n):
            return [Job("r", "s", None, 4, loop.create_future(), client=client) for _ in range(n)]
        b.submit(jobs("flood", 30))
        await settle()
        alone = engine.clients()
        b.submit(jobs("polite", 1))
        for _ in range(16):  # the flood's rows finish one by one; the cap applies as they are replaced
            engine.finish("flood")
            await settle()
        shared = engine.clients()
        engine.finish("polite")  # answered: still active for ACTIVE_S (it sends one request at a time)
        engine.finish("flood")
        await settle()
        still = engine.clients()
        b._answered = {c: t - batcher_mod.ACTIVE_S for c, t in b._answered.items()}  # ... time passes
        engine.finish("flood")
        await settle()
        later = engine.clients()
        await b.stop()
        return alone, shared, still, later

    alone, shared, still, later = asyncio.run(scenario())
    assert alone == ["flood"] * 16
    assert shared == ["flood", "flood", "polite"]  # 3 rows (2x a lone row's step): one kept for the polite client
    assert still == ["flood", "flood"]
    assert later == ["flood"] * 12  # all the flood has left (30 - 19 finished or running): the batch is its own


def test_serve_command_passes_the_new_settings(bank_dir, monkeypatch):
    from typer.testing import CliRunner

    import skillbank.serve.app as app_mod
    from skillbank.cli import app as cli

    seen = {}
    monkeypatch.setattr(app_mod, "create_app", lambda bank, cfg: seen.update(cfg=cfg) or object())
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: seen.update(uvicorn=k))
    res = CliRunner().invoke(cli, ["serve", str(bank_dir), "--body-timeout-s", "3", "--body-min-rate", "0",
                                   "--no-fair-admission", "--client-queue", "5", "--fair-slowdown", "1.5",
                                   "--engine", "torch"])
    assert res.exit_code == 0, res.output
    cfg = seen["cfg"]
    assert (cfg.body_timeout_s, cfg.body_min_rate, cfg.fair_admission, cfg.client_queue, cfg.fair_slowdown,
            cfg.engine) == (3.0, 0.0, False, 5, 1.5, "torch")
    assert cfg.effective_client_queue is None  # admission is first come, first served
    assert seen["uvicorn"]["http"].__name__ == "DeadlineH11Protocol"
    assert ServeConfig().effective_client_queue == 64  # a quarter of the queue
    res = CliRunner().invoke(cli, ["serve", str(bank_dir), "--body-timeout-s", "0"])
    assert res.exit_code == 2 and "body_timeout_s" in res.output
    res = CliRunner().invoke(cli, ["serve", str(bank_dir), "--engine", "vllm"])
    assert res.exit_code == 2 and "engine" in res.output
