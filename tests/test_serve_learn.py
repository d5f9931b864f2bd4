"""Learning while serving: a background learn keeps the served answers exactly as they were, publishes
atomically, and the new family is routed to afterwards; bad uploads, auth, and a killed job."""
import json
import time

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import AUTH, MAX_NEW, TOKEN, build_bank, copy_bank, fresh_base, jsonl, wait_for  # noqa: E402

from skillbank.serve.app import create_app, service_of  # noqa: E402
from skillbank.serve.config import ServeConfig  # noqa: E402


@pytest.fixture(scope="module")
def two_family_bank(tmp_path_factory, tiny_model_dir, small_stream):
    return build_bank(tmp_path_factory.mktemp("learn") / "bank", tiny_model_dir, small_stream,
                      small_stream.family_keys[:2])


def app_for(bank, model_dir, **cfg):
    # These tests follow routed answers across a learn: every request must get a shard, so the out-of-scope
    # check (which the tiny random model's banks trip; tested on its own) is off unless a test asks for it.
    cfg = {"scope": False, **cfg}
    return create_app(bank, ServeConfig(max_new_tokens=MAX_NEW, admin_token=TOKEN, **cfg), base=fresh_base(model_dir))


def plan_all(c, reqs):
    # One at a time: each request is then a batch of one, so answers do not depend on batch composition.
    return [c.post("/v1/plan", json={"request": r}).json()["plans"][0] for r in reqs]


def key(p):
    return p["shard"], p["probabilities"], p["raw"], p["graph"], p["error"]


def test_learn_while_serving(tmp_path, two_family_bank, tiny_model_dir, small_stream):
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    app = app_for(bank, tiny_model_dir)
    held_out = [r.request for k in (k1, k2, k3) for r in small_stream.test[k]]
    with TestClient(app) as c:
        before = plan_all(c, held_out)
        assert {p["shard"] for p in before} <= {k1, k2}
        r = c.post(f"/v1/families?family={k3}", content=jsonl(small_stream.train[k3]),
                   headers={**AUTH, "Content-Type": "application/x-ndjson"})
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["family"] == k3 and job["records"] == len(small_stream.train[k3])
        assert r.headers["location"] == f"/v1/families/{job['job']}"
        assert c.get("/healthz").json()["learning"] == job["job"]
        assert_busy = c.post("/v1/families", json={"family": "another", "records": jsonl(small_stream.train[k3])},
                             headers=AUTH)
        assert assert_busy.status_code == 409 and "still running" in assert_busy.json()["error"]["message"]

        # while the job runs, every answer is exactly the pre-learn bank's
        rounds, states = 0, set()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            status = c.get(f"/v1/families/{job['job']}", headers=AUTH).json()
            states.add(status["state"])
            if status["state"] in ("done", "failed", "cancelled"):
                break
            during = plan_all(c, held_out)
            if c.get("/healthz").json()["version"] != 1:
                break  # published during this round: its later answers may come from the new bank
            assert [key(p) for p in during] == [key(p) for p in before]
            rounds += 1
        wait_for(lambda: c.get(f"/v1/families/{job['job']}", headers=AUTH).json()["state"] in ("done", "failed"),
                 600, "the job to end")
        status = c.get(f"/v1/families/{job['job']}", headers=AUTH).json()
        assert status["state"] == "done", status
        assert rounds >= 1 and status["progress"]["fraction"] == 1.0
        assert status["result"]["shard"].endswith(f"-{k3}") and status["error"] is None
        assert not service_of(app).learner.jobs[job["job"]].workdir.exists()  # the uploaded records are gone
        assert "training" in states or "loading" in states

        # published: the new family is served without a restart and routed to
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["skillbank", k1, k2, k3]
        assert c.get("/healthz").json()["version"] == 2
        after = plan_all(c, held_out)
        new_family = [p for p, r in zip(after, held_out) if r in {x.request for x in small_stream.test[k3]}]
        assert all(k3 in p["probabilities"] for p in after)
        assert sum(p["shard"] == k3 for p in new_family) > len(new_family) / 2
        forced = c.post("/v1/plan", json={"request": held_out[0], "shard": k3}).json()["plans"][0]
        assert forced["shard"] == k3
        jobs = c.get("/v1/families", headers=AUTH).json()["jobs"]
        assert [j["state"] for j in jobs] == ["done"]
        assert 'skillbank_learn_jobs_total{state="done"} 1.0' in c.get("/metrics").text
    # the bank on disk is the published one and keeps no records
    manifest = json.loads((bank / "bank.json").read_text())
    assert [s["name"] for s in manifest["shards"]] == [k1, k2, k3]
    blob = b"".join(p.read_bytes() for p in bank.rglob("*") if p.is_file())
    assert all(r.request.encode() not in blob for r in small_stream.train[k3])


def test_learn_refusals(tmp_path, two_family_bank, tiny_model_dir, small_stream):
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    manifest = (bank / "bank.json").read_bytes()
    good = jsonl(small_stream.train[k3])

    no_token = create_app(bank, ServeConfig(max_new_tokens=MAX_NEW), base=fresh_base(tiny_model_dir))
    with TestClient(no_token) as c:
        r = c.post("/v1/families", json={"family": k3, "records": good}, headers=AUTH)
        assert r.status_code == 403 and "SKILLBANK_ADMIN_TOKEN" in r.json()["error"]["message"]

    app = app_for(bank, tiny_model_dir)
    with TestClient(app) as c:
        def learn(body=None, headers=AUTH, **kw):
            return c.post("/v1/families", json=body, headers=headers, **kw)

        def err(r, status, match):
            assert r.status_code == status, r.text
            assert match in r.json()["error"]["message"] and "Traceback" not in r.text

        err(learn({"family": k3, "records": good}, headers={}), 401, "bearer token")
        assert learn({"family": k3, "records": good}, headers={}).headers["www-authenticate"] == "Bearer"
        err(learn({"family": k3, "records": good}, headers={"Authorization": "Bearer wrong"}), 401, "bearer token")
        err(c.get("/v1/families", headers={"Authorization": "Basic x"}), 401, "bearer token")
        for name in ("../evil", "a/b", ".hidden", "..", "x" * 65):
            err(learn({"family": name, "records": good}), 422, "invalid family name")
        err(learn({"family": k1, "records": good}), 409, "already in the bank")
        bad = good.splitlines()
        bad[1] = '{"id": "oops", "family": "x"'
        bad[2] = '{"id": "nograph", "family": "x", "request": "r"}'
        err(learn({"family": k3, "records": "\n".join(bad)}), 422, "2 bad record line(s): line 2: malformed JSON")
        err(learn({"family": k3, "records": "\n".join(bad)}), 422, "line 3: missing field 'graph'")
        err(learn({"family": k3, "records": ""}), 422, "no records uploaded")
        err(learn({"family": k3, "records": jsonl(small_stream.train[k1])}), 422, f"family '{k1}', expected '{k3}'")
        stolen = "".join(json.dumps({**r.to_dict(), "family": k3}) + "\n" for r in small_stream.train[k1])
        err(learn({"family": k3, "records": stolen}), 422, "already learned by another shard")
        err(learn({"family": k3, "records": good, "train": {"epochs": 0}}), 422, "TrainConfig.epochs")
        err(learn({"family": k3, "records": good, "train": {"nope": 1}}), 422, "unknown TrainConfig field")
        err(learn({"family": k3, "records": good, "recipe": "fast"}), 422, "recipe")
        err(learn({"family": k3}), 422, "records")
        err(c.post("/v1/families", content=b'{"family": ', headers={**AUTH, "Content-Type": "application/json"}),
            400, "malformed JSON")
        err(c.post("/v1/families", content=good, headers={**AUTH, "Content-Type": "application/x-ndjson"}),
            422, "family name is missing")
        err(c.post("/v1/families?family=x", content=good, headers={**AUTH, "Content-Type": "image/png"}),
            415, "unsupported content type")
        err(c.get("/v1/families/nope", headers=AUTH), 404, "no learn job 'nope'")
        assert (bank / "bank.json").read_bytes() == manifest
        assert c.get("/v1/families", headers=AUTH).json() == {"jobs": []}


def test_killed_learn_job_leaves_the_served_bank_unchanged(tmp_path, two_family_bank, tiny_model_dir, small_stream):
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    manifest = (bank / "bank.json").read_bytes()
    app = app_for(bank, tiny_model_dir)
    reqs = [r.request for k in (k1, k3) for r in small_stream.test[k]]
    with TestClient(app) as c:
        before = plan_all(c, reqs)
        job = c.post("/v1/families", json={"family": k3, "records": jsonl(small_stream.train[k3])}, headers=AUTH).json()
        wait_for(lambda: service_of(app).learner.jobs[job["job"]].process is not None, what="the learn process")
        cancelled = c.post(f"/v1/families/{job['job']}/cancel", headers=AUTH).json()
        assert cancelled["state"] == "cancelled"
        wait_for(lambda: service_of(app).learner.jobs[job["job"]].finished is not None, 60, "the job to end")
        status = c.get(f"/v1/families/{job['job']}", headers=AUTH).json()
        assert status["state"] == "cancelled" and "bank is unchanged" in status["error"]
        assert not service_of(app).learner.jobs[job["job"]].workdir.exists()  # the uploaded records are gone
        assert (bank / "bank.json").read_bytes() == manifest
        assert [key(p) for p in plan_all(c, reqs)] == [key(p) for p in before]
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["skillbank", k1, k2]
        # a new job after the kill works (its learn clears the killed one's leftovers)
        job2 = c.post("/v1/families", json={"family": k3, "records": jsonl(small_stream.train[k3])}, headers=AUTH).json()
        wait_for(lambda: service_of(app).learner.jobs[job2["job"]].finished is not None, 600, "the second job")
        assert c.get(f"/v1/families/{job2['job']}", headers=AUTH).json()["state"] == "done"
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["skillbank", k1, k2, k3]


def test_reload_picks_up_a_family_learned_by_another_process(tmp_path, two_family_bank, tiny_model_dir, small_stream):
    from serve_helpers import CFG

    from skillbank.memory.bank import SkillBank
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    app = app_for(bank, tiny_model_dir)
    with TestClient(app) as c:
        before = plan_all(c, [small_stream.test[k1][0].request])
        # `skillbank learn` on the same directory, as another process would do it
        other = SkillBank.open(bank, base=fresh_base(tiny_model_dir))
        other.learn(k3, small_stream.train[k3], CFG, catalog=small_stream.catalog, progress=False)
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["skillbank", k1, k2]  # not yet
        assert c.post("/v1/reload").status_code == 401
        shards = c.post("/v1/reload", headers=AUTH).json()
        assert [s["name"] for s in shards["shards"]] == [k1, k2, k3] and shards["version"] == 2
        after = plan_all(c, [small_stream.test[k1][0].request])
        assert set(after[0]["probabilities"]) == {k1, k2, k3} and before[0]["shard"] in (k1, k2)
        assert c.post("/v1/reload", headers=AUTH).json()["version"] == 2  # nothing new: unchanged


def test_learn_recipe_auto_follows_the_base_and_records_must_match_the_family(tmp_path, tiny_model_dir):
    from skillbank.serve.learn_jobs import LearnRefused, train_config
    from skillbank.train.executor import TrainConfig
    assert train_config("auto", None, "embedded") == TrainConfig.for_small_cpu()
    assert train_config("auto", {"epochs": 1}, str(tiny_model_dir)).epochs == 1
    assert train_config("auto", None, "someone/Qwen3-8B-not-cached") == TrainConfig()
    with pytest.raises(LearnRefused, match="recipe must be one of"):
        train_config("fast", None, "embedded")


def _learn_body(small_stream, family, epochs):
    return {"family": family, "records": jsonl(small_stream.train[family]), "train": {"epochs": epochs}}


def test_a_learn_cut_short_by_a_shutdown_continues_when_posted_again(tmp_path, two_family_bank, tiny_model_dir,
                                                                   small_stream):
    from skillbank.memory.bank import learn_checkpoint_path
    k1, k2, k3 = small_stream.family_keys[:3]
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    manifest = (bank / "bank.json").read_bytes()
    checkpoint = learn_checkpoint_path(bank, k3)
    body = _learn_body(small_stream, k3, epochs=40)  # long enough to be stopped halfway
    app = app_for(bank, tiny_model_dir, learn_checkpoint_minutes=1e-9)  # a checkpoint after every step
    with TestClient(app) as c:
        job = c.post("/v1/families", json=body, headers=AUTH).json()
        wait_for(lambda: c.get(f"/v1/families/{job['job']}", headers=AUTH).json()["progress"].get("step", 0) >= 3
                 and checkpoint.is_file(), 600, "a few checkpointed steps")
    # the service shut down mid-training: nothing published, the training so far kept
    stopped = service_of(app).learner.jobs[job["job"]]
    assert stopped.state == "cancelled" and "training so far is kept" in stopped.error
    assert checkpoint.is_file() and (bank / "bank.json").read_bytes() == manifest

    app = app_for(bank, tiny_model_dir)  # the rest without a checkpoint at every step (each one is a save)
    with TestClient(app) as c:
        job = c.post("/v1/families", json=body, headers=AUTH).json()
        wait_for(lambda: service_of(app).learner.jobs[job["job"]].finished is not None, 600, "the continued job")
        status = c.get(f"/v1/families/{job['job']}", headers=AUTH).json()
        assert status["state"] == "done", status
        assert status["result"]["resumed_after_step"] >= 3  # continued, not started over
        assert not checkpoint.exists()  # a finished training removes its checkpoint
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["skillbank", k1, k2, k3]


def test_a_learn_cancelled_by_request_leaves_no_checkpoint(tmp_path, two_family_bank, tiny_model_dir, small_stream):
    from skillbank.memory.bank import learn_checkpoint_path
    k3 = small_stream.family_keys[2]
    bank = copy_bank(two_family_bank, tmp_path / "bank")
    checkpoint = learn_checkpoint_path(bank, k3)
    app = app_for(bank, tiny_model_dir, learn_checkpoint_minutes=1e-9)
    with TestClient(app) as c:
        job = c.post("/v1/families", json=_learn_body(small_stream, k3, epochs=40), headers=AUTH).json()
        wait_for(lambda: checkpoint.is_file(), 600, "a checkpoint")
        # DELETE cancels and forgets: the job is 404 at once, and kept (out of sight) until its process ended
        deleted = c.delete(f"/v1/families/{job['job']}", headers=AUTH).json()
        assert deleted["state"] == "cancelled" and "kept" not in deleted["error"]
        assert c.get(f"/v1/families/{job['job']}", headers=AUTH).status_code == 404
        assert c.get("/v1/families", headers=AUTH).json() == {"jobs": []}
        wait_for(lambda: job["job"] not in service_of(app).learner.jobs, 60, "the job to end and be forgotten")
        assert not checkpoint.exists()  # the user gave that training up: nothing is left to continue
