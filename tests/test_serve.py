"""The HTTP service on a tiny random model: every endpoint, bad input, batching, back-pressure, timeouts,
client disconnects mid-batch, and the vLLM export."""
import asyncio
import importlib
import json
import socket
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import MAX_NEW, Gate, build_bank, fresh_base, live_server, wait_for  # noqa: E402

from skillbank.serve import schemas  # noqa: E402
from skillbank.serve.app import _request_of_chat, create_app, service_of  # noqa: E402
from skillbank.serve.config import ServeConfig  # noqa: E402


@pytest.fixture(scope="module")
def bank_dir(tmp_path_factory, tiny_model_dir, small_stream):
    return build_bank(tmp_path_factory.mktemp("serve") / "bank", tiny_model_dir, small_stream,
                      small_stream.family_keys[:2])


@pytest.fixture(scope="module")
def client(bank_dir, tiny_model_dir):
    # Every request routed and generated: six training requests a family are too few for the scope check
    # (test_out_of_scope_is_answered_without_generating has it on).
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False, batch_window_ms=5), base=fresh_base(tiny_model_dir))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def requests_of(stream, *keys):
    return [r.request for k in keys for r in stream.test[k]]


def assert_error(resp, status, match):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and match in body["error"]["message"], body
    assert "Traceback" not in resp.text


def test_plan_one_and_many_match_the_bank(client, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    svc = service_of(client.app)
    reqs = requests_of(small_stream, k1, k2)
    one = client.post("/v1/plan", json={"request": reqs[0]})
    assert one.status_code == 200
    [p] = one.json()["plans"]
    assert p["routed"] and p["shard"] in (k1, k2) and set(p["probabilities"]) == {k1, k2}
    assert abs(sum(p["probabilities"].values()) - 1) < 1e-6
    assert p["valid"] == (p["graph"] is not None) == (p["error"] is None)
    assert set(p["timings"]) == {"queue_ms", "route_ms", "generate_ms", "total_ms"} and p["timings"]["total_ms"] > 0
    assert (p["out_of_scope"], p["reason"]) == (False, None)
    conf = p["confidence"]
    assert set(conf) == {"route", "scope_margin", "executor_logprob"}
    assert conf["route"] == round(p["probabilities"][p["shard"]], 4) and conf["scope_margin"] is None  # check off
    assert conf["executor_logprob"] <= 0
    # the service answers exactly what the library does for the same request
    [ref] = svc.snapshot.bank.plan([reqs[0]], max_new_tokens=MAX_NEW, scope=False)
    assert (p["shard"], p["raw"], p["probabilities"], p["graph"], p["error"]) == \
        (ref.shard, ref.raw, ref.probabilities, ref.graph, ref.error)
    # (the library reports its scope verdict even when it plans regardless; the service, check off, none)
    assert {k: conf[k] for k in ("route", "executor_logprob")} == \
        pytest.approx({k: ref.confidence[k] for k in ("route", "executor_logprob")}, abs=1e-3)

    many = client.post("/v1/plan", json={"request": reqs})
    plans = many.json()["plans"]
    assert [q["request"] for q in plans] == reqs
    routed, _ = svc.snapshot.route(reqs)
    assert [q["shard"] for q in plans] == routed
    forced = client.post("/v1/plan", json={"request": reqs[:2], "shard": k2}).json()["plans"]
    assert [(q["shard"], q["routed"], q["probabilities"]) for q in forced] == [(k2, False, {k2: 1.0})] * 2
    assert [q["confidence"]["route"] for q in forced] == [1.0, 1.0]
    assert [q["confidence"]["scope_margin"] for q in forced] == [None, None]  # a forced shard is not checked


def test_mixed_shard_batch_equals_one_shard_at_a_time(client, small_stream):
    """Rows of different shards share one batch (PEFT mixed adapters); each row gets its own shard's output."""
    k1, k2 = small_stream.family_keys[:2]
    svc = service_of(client.app)
    reqs = requests_of(small_stream, k1)[:2] + requests_of(small_stream, k2)[:2]
    shards = [k1, k2, k1, k2]
    outs = svc.engine.execution.generate(reqs, shards, batch_size=1, max_new_tokens=MAX_NEW)
    from skillbank.model.generate import generate
    from skillbank.model.prompts import render_prompt
    base, tok = svc.engine.execution.base, svc.engine.tokenizer
    prompts = [render_prompt(tok, r, svc.snapshot.entry(s).system_prompt) for r, s in zip(reqs, shards)]
    grammars = [svc.engine.execution.grammar(s) for s in shards]  # each row under its own shard's grammar
    mixed = generate(base.peft, tok, prompts, max_new_tokens=MAX_NEW, batch_size=4, adapter_names=shards, base=base,
                     grammars=grammars)
    assert [o.text for o in mixed] == [o.text for o in outs]
    free = svc.engine.execution.generate(reqs, shards, batch_size=1, max_new_tokens=MAX_NEW, constrain=False)
    mixed_free = generate(base.peft, tok, prompts, max_new_tokens=MAX_NEW, batch_size=4, adapter_names=shards, base=base)
    assert [o.text for o in mixed_free] == [o.text for o in free]
    # and through the service: one call of four requests is one batch of four rows
    plans = client.post("/v1/plan", json={"request": reqs}).json()["plans"]
    assert {p["batch_size"] for p in plans} == {4}
    routed = svc.engine.execution.generate(reqs, [p["shard"] for p in plans], batch_size=1, max_new_tokens=MAX_NEW)
    assert [p["raw"] for p in plans] == [o.text for o in routed]


def test_chat_completions(client, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    req = requests_of(small_stream, k2)[0]
    r = client.post("/v1/chat/completions", json={"model": "skillbank", "temperature": 0.7,
                                                  "messages": [{"role": "system", "content": "ignored"},
                                                               {"role": "user", "content": req}]})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] in (k1, k2)
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    [plan] = client.post("/v1/plan", json={"request": req}).json()["plans"]
    expected = json.dumps(plan["graph"], ensure_ascii=False) if plan["valid"] else plan["raw"]
    assert choice["message"]["content"] == expected and body["skillbank"]["shard"] == plan["shard"]
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] > 0
    # a shard name as the model forces it; text parts work as content
    forced = client.post("/v1/chat/completions", json={"model": k1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": req}]}]}).json()
    assert forced["model"] == k1 and forced["skillbank"]["routed"] is False
    assert_error(client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}),
                 404, "unknown model 'gpt-4'")
    assert_error(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True}),
                 400, "stream=true is not supported")
    assert_error(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "n": 2}),
                 400, "n must be 1")
    assert_error(client.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": "x"}]}),
                 400, "no user message")
    # a malformed field is a 400 naming it, as OpenAI answers (the rest of the API answers 422)
    bad = client.post("/v1/chat/completions", json={"messages": []})
    assert_error(bad, 400, "messages")
    assert bad.json()["error"]["param"] == "messages"


def test_text_parts_of_a_chat_message_are_joined_at_line_breaks():
    body = schemas.ChatRequest(messages=[
        {"role": "user", "content": "an earlier request"},
        {"role": "assistant", "content": "{}"},
        {"role": "user", "content": [{"type": "text", "text": "Find flights to Paris"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                                     {"type": "text", "text": "tomorrow morning, then book a hotel."}]}])
    assert _request_of_chat(body) == "Find flights to Paris\ntomorrow morning, then book a hotel."


def test_models_shards_health_metrics_openapi(client, small_stream):
    k1, k2 = small_stream.family_keys[:2]
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["skillbank", k1, k2]
    shards = client.get("/v1/shards").json()
    assert [s["name"] for s in shards["shards"]] == [k1, k2]
    skills = shards["shards"][0]["skills"]
    assert {s["id"] for s in skills} == set(small_stream.catalog.family(k1).skills)
    assert all("description" in s for s in skills)  # specs from the shard's skills.json
    health = client.get("/healthz").json()
    assert health == {"status": "ok", "mode": "local", "engine": "torch", "shards": 2, "queue_depth": 0, "learning": None,
                      "version": 1}
    client.post("/v1/plan", json={"request": requests_of(small_stream, k1)[0]})
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    for series in ('skillbank_http_requests_total{endpoint="/v1/plan",method="POST",status="200"}',
                   "skillbank_http_request_seconds_bucket", "skillbank_batch_size_bucket",
                   "skillbank_route_seconds_bucket", "skillbank_queue_depth", "skillbank_shards 2.0",
                   'skillbank_plans_total{shard="'):
        assert series in text, series
    schema = client.get("/openapi.json").json()
    for path in ("/v1/plan", "/v1/chat/completions", "/v1/models", "/v1/shards", "/v1/families",
                 "/v1/families/{job_id}", "/healthz", "/metrics"):
        assert path in schema["paths"], path
    plan_op = schema["paths"]["/v1/plan"]["post"]
    assert {"200", "413", "422", "429"} <= set(plan_op["responses"])
    assert "application/x-ndjson" in schema["paths"]["/v1/families"]["post"]["requestBody"]["content"]
    plan_result = schema["components"]["schemas"]["PlanResult"]["properties"]
    assert {"out_of_scope", "reason", "confidence"} <= set(plan_result)
    assert "out_of_scope" in plan_op["description"]
    chat_op = schema["paths"]["/v1/chat/completions"]["post"]
    assert "tool_calls" in chat_op["description"] and "skillbank.links" in chat_op["description"]
    assert "tool_calls" in schema["components"]["schemas"]["ChatChoiceMessage"]["properties"]
    assert {"tools", "tool_choice", "skillbank"} <= set(schema["components"]["schemas"]["ChatRequest"]["properties"])
    page = client.get("/")
    assert page.status_code == 200 and 'id="graph"' in page.text and 'id="prob-chart"' in page.text


@pytest.mark.attack
def test_bad_input_gets_clear_errors(client, small_stream):
    k1 = small_stream.family_keys[0]
    post = client.post
    assert_error(post("/v1/plan", content=b'{"request": "x"', headers={"content-type": "application/json"}),
                 400, "malformed JSON")
    assert_error(post("/v1/plan", json={"request": 5}), 422, "request:")
    assert_error(post("/v1/plan", json={"requests": ["x"]}), 422, "requests: Extra inputs are not permitted")
    assert_error(post("/v1/plan", json={"request": "   "}), 422, "request is empty")
    assert_error(post("/v1/plan", json={"request": ["ok", ""]}), 422, "request[1] is empty")
    assert_error(post("/v1/plan", json={"request": []}), 422, "no requests given")
    assert_error(post("/v1/plan", json={"request": "x" * 4001}), 413, "4001 characters long, the limit is 4000")
    assert_error(post("/v1/plan", json={"request": ["a"] * 65}), 413, "65, the limit is 64")
    assert_error(post("/v1/plan", content=b"x" * 2_000_000, headers={"content-type": "application/json"}),
                 413, "over the limit")
    # forced: "9 9 9 ..." has no words, so a routed one is out of scope and never tokenized
    assert_error(post("/v1/plan", json={"request": "9 " * 1990, "shard": k1}), 413, "exceed the base model's context")
    assert_error(post("/v1/plan", json={"request": "x", "shard": "../../etc"}), 404, "unknown shard '../../etc'")
    assert_error(post("/v1/plan", json={"request": "x", "max_new_tokens": 0}), 422, "max_new_tokens")
    assert_error(client.get("/v1/nothing"), 404, "no such endpoint")
    assert_error(client.get("/v1/plan"), 405, "Method Not Allowed")
    # the service is unharmed
    assert post("/v1/plan", json={"request": "book a table", "shard": k1}).status_code == 200


@pytest.mark.attack
def test_unexpected_error_is_a_500_without_traceback(bank_dir, tiny_model_dir, small_stream, monkeypatch):
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False), base=fresh_base(tiny_model_dir))
    with TestClient(app, raise_server_exceptions=False) as c:
        def boom(batch, jobs):
            raise RuntimeError("secret internal detail")
        service_of(app).engine.join_rows = boom
        r = c.post("/v1/plan", json={"request": requests_of(small_stream, small_stream.family_keys[0])[0]})
        assert r.status_code == 500 and "secret" not in r.text and "Traceback" not in r.text
        assert r.json()["error"]["type"] == "internal_error"


def test_concurrent_requests_are_batched(bank_dir, tiny_model_dir, small_stream):
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False, batch_window_ms=200, max_batch=8),
                     base=fresh_base(tiny_model_dir))
    reqs = requests_of(small_stream, *small_stream.family_keys[:2])
    with TestClient(app) as c:
        results = [None] * len(reqs)

        def call(i):
            results[i] = c.post("/v1/plan", json={"request": reqs[i]}).json()["plans"][0]

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert max(p["batch_size"] for p in results) > 1
        assert "skillbank_batch_size_count" in c.get("/metrics").text


def test_no_batching_generates_one_at_a_time(bank_dir, tiny_model_dir, small_stream):
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False, batching=False), base=fresh_base(tiny_model_dir))
    with TestClient(app) as c:
        plans = c.post("/v1/plan", json={"request": requests_of(small_stream, small_stream.family_keys[0])}).json()["plans"]
        assert [p["batch_size"] for p in plans] == [1] * len(plans)


@pytest.mark.attack
def test_full_queue_answers_429_with_retry_after(bank_dir, tiny_model_dir, small_stream):
    req = requests_of(small_stream, small_stream.family_keys[0])[0]
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False, queue_size=2, batch_window_ms=0),
                     base=fresh_base(tiny_model_dir))
    with TestClient(app) as c:
        svc = service_of(app)
        gate = Gate(svc.engine)
        first = {}
        # in-scope requests: an out-of-scope one would never reach the engine (nor hold the gate)
        t = threading.Thread(target=lambda: first.update(r=c.post("/v1/plan", json={"request": [req] * 2})))
        t.start()
        gate.wait_entered()
        r = c.post("/v1/plan", json={"request": req})
        assert_error(r, 429, "the queue is full")
        assert int(r.headers["retry-after"]) >= 1
        gate.release()
        t.join(60)
        assert first["r"].status_code == 200
        assert c.post("/v1/plan", json={"request": req}).status_code == 200
        assert 'skillbank_errors_total{kind="queue_full"} 1.0' in c.get("/metrics").text


@pytest.mark.attack
def test_timeout_is_a_504_and_spares_the_rest(bank_dir, tiny_model_dir, small_stream):
    req = requests_of(small_stream, small_stream.family_keys[0])[0]
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False, timeout_s=0.5, batch_window_ms=0),
                     base=fresh_base(tiny_model_dir))
    with TestClient(app) as c:
        gate = Gate(service_of(app).engine)
        r = {}
        t = threading.Thread(target=lambda: r.update(a=c.post("/v1/plan", json={"request": req})))
        t.start()
        gate.wait_entered()
        t.join(30)
        assert_error(r["a"], 504, "timeout")
        gate.release()
        wait_for(lambda: service_of(app).batcher.depth == 0, what="the held batch to finish")
        # The point is that the service still answers: give the follow-up a deadline a loaded CI machine meets
        # (0.5 s is shorter than one tiny-model plan takes while the other test worker trains).
        svc = service_of(app)
        svc.config = svc.config.model_copy(update={"timeout_s": 60.0})
        assert c.post("/v1/plan", json={"request": req}).status_code == 200


@pytest.mark.attack
def test_client_disconnect_mid_batch_does_not_disturb_its_batch_mates(bank_dir, tiny_model_dir, small_stream):
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False, batch_window_ms=300, max_batch=4),
                     base=fresh_base(tiny_model_dir))
    svc = service_of(app)
    req_a, req_b = requests_of(small_stream, small_stream.family_keys[0])[:2]
    with live_server(app) as url:
        import httpx
        alone = httpx.post(url + "/v1/plan", json={"request": req_b}, timeout=60).json()["plans"][0]
        gate = Gate(svc.engine)
        # client A: a raw socket that sends its request and then hangs up while its batch is generating
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"request": req_a}).encode()
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/plan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        result = {}
        t = threading.Thread(target=lambda: result.update(b=httpx.post(url + "/v1/plan", json={"request": req_b},
                                                                         timeout=60)))
        t.start()
        gate.wait_entered()
        wait_for(lambda: svc.batcher.depth == 2, what="both requests in one batch")
        sock.close()
        wait_for(lambda: 'kind="client_disconnected"} 1.0' in svc.metrics.render().decode(), what="the disconnect")
        gate.release()
        t.join(60)
        b = result["b"].json()["plans"][0]
        assert result["b"].status_code == 200 and b["batch_size"] == 2
        assert (b["shard"], b["raw"]) == (alone["shard"], alone["raw"])
        wait_for(lambda: svc.batcher.depth == 0, what="an empty queue")
        assert httpx.get(url + "/healthz").json()["status"] == "ok"


def test_export_vllm_command(bank_dir, small_stream, tmp_path):
    from typer.testing import CliRunner

    from skillbank.cli import app as cli
    k1, k2 = small_stream.family_keys[:2]
    runner = CliRunner()
    res = runner.invoke(cli, ["export", "vllm", str(bank_dir), "--port", "9001"])
    assert res.exit_code == 0, res.output
    cmd = res.stdout.strip()
    base = json.loads((bank_dir / "bank.json").read_text())["base"]["name"]
    assert cmd.startswith(f"vllm serve {base} --host 127.0.0.1 --port 9001 --enable-lora --lora-modules ")
    assert f"{k1}={bank_dir.resolve()}/shards/0001-{k1}" in cmd and f"{k2}={bank_dir.resolve()}/shards/0002-{k2}" in cmd
    assert "--max-lora-rank 16 --max-loras 2" in cmd  # rank 16 (the recipe's), two shards
    res = runner.invoke(cli, ["export", "vllm", str(bank_dir), "--out", str(tmp_path / "vllm.sh")])
    assert res.exit_code == 0 and (tmp_path / "vllm.sh").read_text().startswith("#!/bin/sh")
    res = runner.invoke(cli, ["export", "vllm", str(tmp_path)])
    assert res.exit_code == 2 and "not a skill bank" in res.output


def test_serve_command_refuses_bad_settings(bank_dir):
    from typer.testing import CliRunner

    from skillbank.cli import app as cli
    res = CliRunner().invoke(cli, ["serve", str(bank_dir), "--upstream", "ftp://x"])
    assert res.exit_code == 2 and "upstream must be an http(s):// URL" in res.output
    res = CliRunner().invoke(cli, ["serve", str(bank_dir.parent / "missing")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_batcher_drops_cancelled_jobs_before_generation():
    """A job whose client left while it was queued never reaches the engine."""
    from skillbank.serve.batcher import Batcher
    from skillbank.serve.engine import Job

    class Recorder:
        continuous = True

        def __init__(self):
            self.seen = []

        def admit(self, jobs, deliver):
            self.seen.append([j.request for j in jobs])
            for j in jobs:
                deliver(j, j.request.upper(), None)

    async def scenario():
        engine = Recorder()
        b = Batcher(engine, max_batch=8, window_s=0.05, queue_size=8)
        b.start()
        loop = asyncio.get_running_loop()
        jobs = [Job(r, "s", None, 4, loop.create_future()) for r in ("a", "b", "c")]
        b.submit(jobs)
        jobs[1].cancelled = True
        out = await asyncio.gather(jobs[0].future, jobs[2].future)
        await b.stop()
        return engine.seen, out, b.depth

    seen, out, depth = asyncio.run(scenario())
    assert seen == [["a", "c"]] and out == ["A", "C"] and depth == 0


def test_row_batch_matches_hf_generate_when_rows_stop_early(client, small_stream, monkeypatch):
    """Rows that stop leave the batch, free slots are refilled, rows of two shards share it; every output
    stays exactly that of transformers' greedy ``model.generate`` for the prompt alone."""
    import torch

    dec_mod = importlib.import_module("skillbank.model.decode")  # the package exports a function named decode
    from skillbank.model.generate import generate
    from skillbank.model.prompts import stop_token_ids
    k1, k2 = small_stream.family_keys[:2]
    svc = service_of(client.app)
    base, tok = svc.engine.execution.base, svc.engine.tokenizer
    svc.engine.execution.ensure_resident([k1, k2])  # the bank loads shards lazily: alone, this test plans nothing first
    # The tiny random model answers every chat-templated prompt alike (the template's last tokens decide),
    # so use raw text prompts: each row then repeats a token of its own.
    prompts = ["book a flight to Paris", "translate this", "9 9 9 9 hello", "What is the weather like in Lisbon",
               "zebra", "Ana"]
    names = [k1, k2, k1, k2, k1, k2]
    first = []
    with torch.inference_mode():
        for p, n in zip(prompts, names):
            ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"]])
            first.append(int(base.activate(n)(input_ids=ids).logits[0, -1].argmax()))
    stops = stop_token_ids(tok, base.model) + [first[0], first[3]]  # rows 0 and 3 (and any alike) stop at once
    monkeypatch.setattr(dec_mod, "stop_token_ids", lambda *a: stops)
    mine = generate(base.peft, tok, prompts, max_new_tokens=12, batch_size=4, adapter_names=names, base=base)
    assert mine[0].n_tokens == 1 and mine[0].stopped and len({d.n_tokens for d in mine}) > 1
    for p, n, d in zip(prompts, names, mine):
        ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"]])
        with torch.inference_mode():
            out = base.activate(n).generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                            max_new_tokens=12, eos_token_id=stops, pad_token_id=stops[0],
                                            output_scores=True, return_dict_in_generate=True)
        new = out.sequences[0, ids.shape[1]:].tolist()
        stop_at = next((k for k, t in enumerate(new) if t in stops), None)
        n_tokens = stop_at + 1 if stop_at is not None else len(new)
        text = tok.decode(new[:stop_at] if stop_at is not None else new, skip_special_tokens=True).strip()
        logps = [float(torch.log_softmax(out.scores[k][0].float(), -1)[new[k]]) for k in range(n_tokens)]
        assert (d.text, d.n_tokens, d.stopped) == (text, n_tokens, stop_at is not None)
        assert d.mean_logprob == pytest.approx(sum(logps) / n_tokens, abs=1e-4)


def test_prefix_reuse_matches_whole_prompt_prefill(client, small_stream):
    """Rows prefilled from a shard's reused prompt prefix (also joining mid-batch, several shards, a prompt
    too short to share) get the logits and tokens of whole-prompt prefill."""
    import torch

    from skillbank.model.decode import RowBatch
    k1, k2 = small_stream.family_keys[:2]
    svc = service_of(client.app)
    base, tok = svc.engine.execution.base, svc.engine.tokenizer
    lead = "Plan the following request carefully and reply with the graph: "
    first = [lead + "book a flight to Paris", lead + "translate this letter", lead + "9 9 9 hello"]
    later = [lead + "what is the weather like in Lisbon", "zebra", lead + "Ana"]
    runs = {}
    for reuse in (False, True):
        batch = RowBatch(base.peft, tok, base, reuse_prefixes=reuse)
        batch.add(first, [0, 1, 2], [k1, k2, k1], [8] * 3)
        logits = [batch.logits.clone()]
        for _ in range(2):
            batch.step()
        batch.add(later, [3, 4, 5], [k2, k1, k1], [8] * 3)
        logits.append(batch.logits.clone())
        done = {}
        while batch.rows:
            done.update((row.key, (row.tokens, d.text)) for row, d in batch.step())
        runs[reuse] = (logits, done)
        if reuse:
            shared = len(tok(lead, add_special_tokens=False)["input_ids"])
            kept = {name: len(tokens) for name, (tokens, _) in batch.prefixes.entries.items()}
            assert set(kept) == {k1, k2} and all(n >= shared - 1 for n in kept.values()), kept
    for plain, reused in zip(runs[False][0], runs[True][0]):
        torch.testing.assert_close(reused, plain, rtol=1e-4, atol=1e-4)
    assert runs[True][1] == runs[False][1]
    # adapters changed: the prefixes are dropped rather than reused stale
    batch.forget_prefixes()
    assert batch.prefixes.entries == {}


@pytest.mark.attack
def test_hostile_input_is_refused_cleanly(bank_dir, tiny_model_dir, small_stream):
    """Each of these was a 500 or got through before: a lone surrogate in a request, a non-string text part,
    a NUL byte in a path, a chunked body past the limit, a family name with a trailing newline."""
    import httpx

    from skillbank.errors import BankError
    from skillbank.memory.bank import check_family_name

    k1 = small_stream.family_keys[0]
    token = "hostile-test-token"
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False, admin_token=token), base=fresh_base(tiny_model_dir))
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        lone = b'{"request": "book \\ud800 a table", "shard": "' + k1.encode() + b'"}'
        assert_error(http.post("/v1/plan", content=lone, headers={"content-type": "application/json"}),
                     422, "not valid Unicode")
        part = {"model": k1, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
        assert_error(http.post("/v1/chat/completions", json=part), 400, "string 'text'")
        assert_error(http.post("/v1/load_lora_adapter", headers={"Authorization": f"Bearer {token}"},
                               json={"lora_name": k1, "lora_path": "/tmp/\u0000x"}), 422, "NUL byte")

        def chunks():
            for _ in range(40):
                yield b"x" * 65536  # 2.6 MB with no Content-Length: past the 1 MB limit
        assert_error(http.post("/v1/plan", content=chunks(), headers={"content-type": "application/json"}),
                     413, "over the limit")
        # the same client connection pool keeps working
        assert http.post("/v1/plan", json={"request": "book a table", "shard": k1}).status_code == 200
    with pytest.raises(BankError, match="invalid family name"):
        check_family_name("nl\n")


@pytest.mark.attack
def test_head_host_check_and_early_queue_refusal(bank_dir, tiny_model_dir, small_stream, monkeypatch):
    """HEAD answers on GET routes; a service on loopback answers only loopback Host names (DNS rebinding);
    a call that cannot fit the queue is refused before any routing or tokenizing."""
    import httpx

    from skillbank.serve.config import LOOPBACK_NAMES
    from skillbank.serve.state import Snapshot

    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False, queue_size=2, allowed_hosts=LOOPBACK_NAMES),
                     base=fresh_base(tiny_model_dir))
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        head = http.head("/healthz")
        assert head.status_code == 200 and head.content == b"" and head.headers["content-type"].startswith("application/json")
        assert http.head("/v1/models").status_code == 200
        rebound = http.get("/healthz", headers={"Host": "attacker.example:8000"})
        assert_error(rebound, 400, "is not one this service answers to")
        assert http.get("/healthz", headers={"Host": "localhost"}).status_code == 200

        def no_routing(*args, **kwargs):
            raise AssertionError("routed a call the queue could not take")
        monkeypatch.setattr(Snapshot, "route", no_routing)
        full = http.post("/v1/plan", json={"request": ["a b", "c d", "e f"]})
        assert_error(full, 429, "the queue is full")
        assert full.headers["retry-after"]


@pytest.mark.attack
def test_a_500_keeps_the_keep_alive_connection(bank_dir, tiny_model_dir, small_stream):
    """After an unexpected error the same connection answers the next request (it used to be reset)."""
    k1 = small_stream.family_keys[0]
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False), base=fresh_base(tiny_model_dir))
    engine = service_of(app).engine
    real = engine.join_rows

    def boom_once(batch, jobs):
        engine.join_rows = real
        raise RuntimeError("secret internal detail")
    engine.join_rows = boom_once
    with live_server(app) as url:
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"request": "book a table", "shard": k1}).encode()
        request = (f"POST /v1/plan HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            answers = []
            for _ in range(2):
                sock.sendall(request)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += sock.recv(65536)
                head, rest = data.split(b"\r\n\r\n", 1)
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(rest) < length:
                    rest += sock.recv(65536)
                answers.append((head.split(b" ")[1], json.loads(rest)))
        assert answers[0][0] == b"500" and "secret" not in json.dumps(answers[0][1])
        assert answers[0][1]["error"]["type"] == "internal_error"
        assert answers[1][0] == b"200" and answers[1][1]["plans"][0]["shard"] == k1


def test_docs_load_offline(client):
    """/docs names only this service's own assets (no CDN), and they are served."""
    import re
    page = client.get("/docs")
    assert page.status_code == 200
    urls = re.findall(r'(?:src|href)="([^"]+)"', page.text) + re.findall(r"url: '([^']+)'", page.text)
    assert urls and all(u.startswith("/") for u in urls), urls
    for u in urls:
        assert client.get(u).status_code == 200, u
    assert "https://" not in page.text


OFF_DOMAIN = ["what is the capital of France?", "asdf"]


@pytest.fixture(scope="module")
def scoped_client(bank_dir, tiny_model_dir):
    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, batch_window_ms=5), base=fresh_base(tiny_model_dir))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_out_of_scope_is_answered_without_generating(scoped_client, small_stream, monkeypatch):
    """A routed request no learned family covers gets no plan: shard and graph null, the reason, the same
    verdict and confidence as the library, and it never reaches the queue; a forced shard is not checked."""
    client = scoped_client
    k1, k2 = small_stream.family_keys[:2]
    svc = service_of(client.app)
    queued = []
    submit = svc.batcher.submit
    monkeypatch.setattr(svc.batcher, "submit", lambda jobs: (queued.extend(j.request for j in jobs), submit(jobs))[1])
    # a held-out request the library finds in scope (six training requests a family do not cover them all)
    inside = next(r for r in requests_of(small_stream, k1) if svc.snapshot.bank.check_scope([r])[0].in_scope)
    reqs = [OFF_DOMAIN[0], inside, OFF_DOMAIN[1]]
    plans = client.post("/v1/plan", json={"request": reqs}).json()["plans"]
    assert queued == [inside]  # only the in-scope request was queued
    refs = svc.snapshot.bank.plan(reqs, max_new_tokens=MAX_NEW)
    for p, ref in zip(plans, refs):
        assert (p["shard"], p["out_of_scope"], p["reason"]) == (ref.shard, ref.out_of_scope, ref.reason)
        assert p["confidence"] == pytest.approx(ref.confidence, abs=1e-3)
    for p in (plans[0], plans[2]):
        assert p["out_of_scope"] is True and p["shard"] is None and p["routed"] is True
        assert (p["valid"], p["graph"], p["error"], p["raw"], p["tokens"], p["batch_size"]) == (False, None, None, "", 0, 0)
        assert "no learned skill family covers this request" in p["reason"]
        assert p["confidence"]["scope_margin"] < 0 and p["confidence"]["executor_logprob"] is None
        assert set(p["probabilities"]) == {k1, k2}
        assert p["confidence"]["route"] == round(max(p["probabilities"].values()), 4)
    assert plans[1]["out_of_scope"] is False and plans[1]["shard"] == k1 and plans[1]["batch_size"] == 1
    # all out of scope: answered without the engine at all
    queued.clear()
    alone = client.post("/v1/plan", json={"request": OFF_DOMAIN[0]}).json()["plans"][0]
    assert alone["out_of_scope"] and queued == []
    # a forced shard plans it anyway
    forced = client.post("/v1/plan", json={"request": OFF_DOMAIN[0], "shard": k2}).json()["plans"][0]
    assert (forced["shard"], forced["out_of_scope"], forced["confidence"]["scope_margin"]) == (k2, False, None)
    assert queued == [OFF_DOMAIN[0]]
    metrics = client.get("/metrics").text
    assert 'skillbank_out_of_scope_total{closest="' in metrics

    # chat: a plain assistant message with the reason, in text and in tool_calls form alike
    for extra in ({}, {"tools": [{"type": "function", "function": {"name": "x", "parameters": {}}}]}):
        body = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": OFF_DOMAIN[0]}],
                                                         **extra}).json()
        [choice] = body["choices"]
        assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"] is None
        assert choice["message"]["content"].startswith("No skill in this bank covers that request")
        assert plans[0]["reason"] in choice["message"]["content"]
        assert body["model"] == "skillbank" and body["usage"]["total_tokens"] == 0
        info = body["skillbank"]
        assert (info["out_of_scope"], info["shard"], info["valid"], info["links"]) == (True, None, False, None)
        assert info["reason"] == plans[0]["reason"] and info["confidence"]["scope_margin"] < 0


def test_scope_check_can_be_turned_off(bank_dir, tiny_model_dir, monkeypatch):
    """--no-scope reaches the config, and a service without the check plans every request."""
    from typer.testing import CliRunner

    import skillbank.serve.app as app_mod
    from skillbank.cli import app as cli

    seen = {}

    def fake_create_app(bank, cfg):
        seen["cfg"] = cfg
        return object()
    monkeypatch.setattr(app_mod, "create_app", fake_create_app)
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: None)
    for args, expected in (([], True), (["--no-scope"], False)):
        res = CliRunner().invoke(cli, ["serve", str(bank_dir), *args])
        assert res.exit_code == 0, res.output
        assert seen["cfg"].scope is expected

    app = create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False), base=fresh_base(tiny_model_dir))
    with TestClient(app) as c:
        p = c.post("/v1/plan", json={"request": OFF_DOMAIN[0]}).json()["plans"][0]
        assert p["shard"] is not None and p["out_of_scope"] is False and p["tokens"] > 0
        assert p["confidence"]["scope_margin"] is None


def chain_graph(skills) -> dict:
    a, b, c = skills[:3]
    return {"task_nodes": [
        {"task": a, "arguments": [{"name": "city", "value": "Lisbon"}]},
        {"task": b, "arguments": [{"name": "input", "value": "<node-0>"}, {"name": "when", "value": "Friday"}]},
        {"task": c, "arguments": [{"name": "input", "value": "<node-1>"}]}],
        "task_links": [{"source": a, "target": b}, {"source": b, "target": c}]}


def test_chat_answers_in_tool_calls_form(client, small_stream, monkeypatch):
    """tools / tool_choice / skillbank.format ask for OpenAI tool_calls: one call per node, arguments as JSON
    text, <node-j> kept, links in skillbank.links; an invalid graph is a text message with the reason."""
    from skillbank.graph import parse_graph
    from skillbank.serve import engine as engine_mod

    k1 = small_stream.family_keys[0]
    req = requests_of(small_stream, k1)[0]
    chat = {"model": k1, "messages": [{"role": "user", "content": req}]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

    # the tiny model writes no valid graph: an invalid plan in tool_calls form is text with the reason
    body = client.post("/v1/chat/completions", json={**chat, "tools": tools}).json()
    message = body["choices"][0]["message"]
    assert message["tool_calls"] is None and message["content"].startswith("No plan: ")
    assert body["skillbank"]["error"] in message["content"] and body["skillbank"]["links"] is None
    assert body["choices"][0]["finish_reason"] in ("stop", "length")

    # whatever it writes, read it as a three-node chain of the shard's skills
    monkeypatch.setattr(engine_mod, "parse_output", lambda text, entry, *_: parse_graph(json.dumps(chain_graph(entry.skills))))
    a, b, c = client.get("/v1/shards").json()["shards"][0]["skills"][:3]
    a, b, c = a["id"], b["id"], c["id"]
    expected_calls = [
        {"id": "call_0", "type": "function", "function": {"name": a, "arguments": '{"city": "Lisbon"}'}},
        {"id": "call_1", "type": "function",
         "function": {"name": b, "arguments": '{"input": "<node-0>", "when": "Friday"}'}},
        {"id": "call_2", "type": "function", "function": {"name": c, "arguments": '{"input": "<node-1>"}'}}]
    asks = [{"tools": tools}, {"tool_choice": "auto"}, {"tool_choice": "required"},
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            {"skillbank": {"format": "tool_calls"}}, {"tools": tools, "tool_choice": "none",
                                                      "skillbank": {"format": "tool_calls"}}]
    for ask in asks:
        resp = client.post("/v1/chat/completions", json={**chat, **ask})
        assert resp.status_code == 200, (ask, resp.text)
        body = resp.json()
        [choice] = body["choices"]
        assert choice == {"index": 0, "finish_reason": "tool_calls",
                          "message": {"role": "assistant", "content": None, "tool_calls": expected_calls}}, ask
        assert body["skillbank"]["links"] == [{"source": a, "target": b}, {"source": b, "target": c}]
        assert body["skillbank"]["valid"] and not body["skillbank"]["out_of_scope"] and body["model"] == k1
    # without asking (or asking for text) the graph is JSON text, as before
    for ask in ({}, {"tools": tools, "tool_choice": "none"}, {"tools": tools, "skillbank": {"format": "text"}}):
        body = client.post("/v1/chat/completions", json={**chat, **ask}).json()
        [choice] = body["choices"]
        assert choice["message"]["tool_calls"] is None, ask
        graph = json.loads(choice["message"]["content"])
        assert [n["task"] for n in graph["task_nodes"]] == [a, b, c]
    assert_error(client.post("/v1/chat/completions", json={**chat, "skillbank": {"format": "xml"}}), 400, "format")
    assert_error(client.post("/v1/chat/completions", json={**chat, "tools": "all"}), 400, "tools")


def test_tool_calls_parse_with_the_openai_client_types(client, small_stream, monkeypatch):
    """What an OpenAI SDK user gets: the response validates as the openai package's ChatCompletion type."""
    openai_types = pytest.importorskip("openai.types.chat", reason="the openai package is not installed")
    from skillbank.graph import parse_graph
    from skillbank.serve import engine as engine_mod

    k1 = small_stream.family_keys[0]
    monkeypatch.setattr(engine_mod, "parse_output", lambda text, entry, *_: parse_graph(json.dumps(chain_graph(entry.skills))))
    a, b, c = [s["id"] for s in client.get("/v1/shards").json()["shards"][0]["skills"][:3]]
    chat = {"model": k1, "messages": [{"role": "user", "content": requests_of(small_stream, k1)[0]}]}
    body = client.post("/v1/chat/completions", json={**chat, "tool_choice": "auto"}).json()
    parsed = openai_types.ChatCompletion.model_validate(body)
    calls = parsed.choices[0].message.tool_calls
    assert [(t.id, t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        ("call_0", a, {"city": "Lisbon"}), ("call_1", b, {"input": "<node-0>", "when": "Friday"}),
        ("call_2", c, {"input": "<node-1>"})]
    assert parsed.choices[0].finish_reason == "tool_calls"


def test_lazy_shards_in_the_service(bank_dir, tiny_model_dir, small_stream, tmp_path):
    """Shards load on first use, max_resident bounds them, and a shard broken after startup fails only its
    own requests, naming it."""
    from serve_helpers import copy_bank
    k1, k2 = small_stream.family_keys[:2]
    reqs = requests_of(small_stream, k1)[:2]
    with TestClient(create_app(bank_dir, ServeConfig(max_new_tokens=MAX_NEW, scope=False, batch_window_ms=5),
                               base=fresh_base(tiny_model_dir)), raise_server_exceptions=False) as c:
        want = {k: c.post("/v1/plan", json={"request": reqs, "shard": k}).json() for k in (k1, k2)}
    bank = copy_bank(bank_dir, tmp_path / "bank")
    app = create_app(bank, ServeConfig(max_new_tokens=MAX_NEW, scope=False, batch_window_ms=5, max_resident=1),
                     base=fresh_base(tiny_model_dir))
    execution = service_of(app).snapshot.bank.execution
    assert execution.resident == {}  # nothing loaded at startup
    with TestClient(app, raise_server_exceptions=False) as c:
        for k in (k1, k2, k1, k2):
            got = c.post("/v1/plan", json={"request": reqs, "shard": k}).json()
            assert [p["raw"] for p in got["plans"]] == [p["raw"] for p in want[k]["plans"]]
            assert list(execution.resident) == [k]
        assert execution.loads == 4
        # break k1 on disk: it is evicted now (k2 was used last), so its next load finds the damage
        entry = next(e for e in service_of(app).snapshot.manifest.shards if e.name == k1)
        weights = bank / entry.dir / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
        broken = c.post("/v1/plan", json={"request": reqs[0], "shard": k1})
        assert broken.status_code == 200  # answered in its plan: a list's other requests would be generated
        [p] = broken.json()["plans"]
        assert (p["shard"], p["failed"], p["valid"], p["graph"]) == (k1, True, False, None)
        assert f"shard '{k1}'" in p["error"] and "does not match its digest" in p["error"]
        assert str(bank) not in p["error"] and str(bank.resolve()) not in p["error"]
        ok = c.post("/v1/plan", json={"request": reqs[0], "shard": k2})
        assert ok.status_code == 200 and ok.json()["plans"][0]["shard"] == k2


def test_shards_are_paged(client, small_stream):
    whole = client.get("/v1/shards").json()
    assert whole["total"] == 2 and whole["offset"] == 0 and whole["next_offset"] is None
    first = client.get("/v1/shards?limit=1").json()
    assert [s["name"] for s in first["shards"]] == [whole["shards"][0]["name"]] and first["next_offset"] == 1
    second = client.get("/v1/shards?offset=1&limit=1").json()
    assert second["shards"][0]["index"] == 2 and second["next_offset"] is None
    assert client.get("/v1/shards?offset=5").json()["shards"] == []
    assert_error(client.get("/v1/shards?limit=0"), 422, "limit")


def test_export_vllm_bounds_lora_slots_for_large_banks(bank_dir, monkeypatch):
    from skillbank.serve import vllm
    monkeypatch.setattr(vllm, "GPU_LORA_SLOTS", 1)
    plan = vllm.vllm_plan(bank_dir, base="some/base")
    assert plan.max_loras == 1 and plan.max_cpu_loras == 2 and "1 GPU slots" in plan.notes[0]
    assert "--max-loras 1 --max-cpu-loras 2" in plan.shell()


def test_explain_over_http_is_the_librarys(scoped_client, small_stream):
    """`explain: true` adds what `skillbank plan --explain` prints, for a refused and a planned request alike;
    a plan has the same keys over HTTP as Plan.to_dict() (one result type)."""
    client = scoped_client
    svc = service_of(client.app)
    k1 = small_stream.family_keys[0]
    reqs = [OFF_DOMAIN[0], requests_of(small_stream, k1)[0]]
    plans = client.post("/v1/plan", json={"request": reqs, "explain": True}).json()["plans"]
    refs = svc.snapshot.bank.plan(reqs, max_new_tokens=MAX_NEW, explain=True)
    for p, ref in zip(plans, refs):
        assert set(p) == set(ref.to_dict())
        assert p["explain"] == ref.explain
        assert {"scope_margin", "scope_family", "top_families", "counted_words", "values"} <= set(p["explain"])
        assert p["explain"]["scope_margin"] == p["confidence"]["scope_margin"]
    assert client.post("/v1/plan", json={"request": reqs[0]}).json()["plans"][0]["explain"] is None
