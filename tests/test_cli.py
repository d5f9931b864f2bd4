"""The `skillbank` command: thin layer over the API, one-line errors, exit codes."""
import json

import pytest
from typer.testing import CliRunner

from skillbank.cli import app
from skillbank.data.records import write_records

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture()
def stream_dir(tmp_path, small_stream):
    return small_stream.save(tmp_path / "stream")


def test_stream_build_and_info(tmp_path):
    r = invoke("stream", "build", "--out", tmp_path / "s", "--train-per-family", 20, "--test-per-family", 5)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s" / "train" / "t1_daily_life.jsonl").is_file()
    r = invoke("stream", "info", tmp_path / "s")
    assert r.exit_code == 0 and "t5_generation_editing" in r.output


def test_score_prints_metrics_and_json(tmp_path, small_stream):
    golds = small_stream.test["t2_language_speech"]
    write_records(tmp_path / "gold.jsonl", golds)
    with open(tmp_path / "pred.jsonl", "w") as fh:
        fh.write(json.dumps({"id": golds[0].id, "output": "Here: " + golds[0].graph.to_json()}) + "\n")
        fh.write(json.dumps({"id": golds[1].id, "graph": golds[1].graph.to_dict()}) + "\n")
        # golds[2] has no prediction: scored invalid, counted as missing
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", tmp_path / "pred.jsonl", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["overall"]["graph_em"] == pytest.approx(2 / 3)
    assert out["missing"] == 1 and out["invalid_reasons"] == {"no prediction": 1}
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", tmp_path / "pred.jsonl")
    assert r.exit_code == 0 and "node F1" in r.output


def test_score_bad_input_is_one_line(tmp_path, small_stream):
    write_records(tmp_path / "gold.jsonl", small_stream.test["t2_language_speech"])
    (tmp_path / "pred.jsonl").write_text('{"id": "x"\n')
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", tmp_path / "pred.jsonl")
    assert r.exit_code == 2
    assert "pred.jsonl:1: malformed JSON" in r.output and "Traceback" not in r.output
    (tmp_path / "pred.jsonl").write_text('{"id": "nope", "output": ""}\n')
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", tmp_path / "pred.jsonl")
    assert r.exit_code == 2 and "match no gold record" in r.output


def test_route_eval(stream_dir):
    r = invoke("route-eval", "--stream", stream_dir, "--order", "O1", "--order", "O2", "--json")
    assert r.exit_code == 0, r.output
    results = json.loads(r.stdout)
    assert [x["order_name"] for x in results] == ["O1", "O2"]
    for x in results:
        assert set(x["selectors"]) == {"address (hashing+NB)", "offline TF-IDF+LR"}
        rows = x["selectors"]["address (hashing+NB)"]
        assert len(rows) == 5 and rows[0]["micro"] == 1.0  # one family learned: nothing to confuse
        assert set(rows[-1]["per_family"]) == set(x["order"])
    r = invoke("route-eval", "--stream", stream_dir / "nope")
    assert r.exit_code == 2 and "not a stream directory" in r.output


def test_learn_plan_info_via_cli(tmp_path, tiny_model_dir, small_stream):
    key = "t4_vision_document"
    write_records(tmp_path / "stage.jsonl", small_stream.train[key])
    bank = tmp_path / "bank"
    r = invoke("learn", bank, "--family", key, "--data", tmp_path / "stage.jsonl", "--base", tiny_model_dir,
               "--epochs", 1, "--recipe", "small-cpu")
    assert r.exit_code == 0, r.output
    r = invoke("info", bank, "--json")
    assert json.loads(r.stdout)["shards"][0]["name"] == key
    (tmp_path / "reqs.jsonl").write_text("".join(json.dumps({"id": x.id, "request": x.request}) + "\n"
                                                 for x in small_stream.test[key]))
    r = invoke("plan", bank, "--file", tmp_path / "reqs.jsonl", "--max-new-tokens", 4)
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.strip().splitlines()]
    assert [x["id"] for x in lines] == [x.id for x in small_stream.test[key]]
    assert all(x["shard"] == key for x in lines)
    r = invoke("learn", bank, "--family", key, "--data", tmp_path / "stage.jsonl")
    assert r.exit_code == 2 and "already in the bank" in r.output
    r = invoke("plan", tmp_path / "stage.jsonl", "hello")
    assert r.exit_code == 2 and "error:" in r.output


def test_version_and_short_help():
    from typer.testing import CliRunner

    from skillbank.cli import app
    runner = CliRunner()
    v = runner.invoke(app, ["--version"])
    assert v.exit_code == 0 and v.output.startswith("skillbank ")
    for args in (["-h"], ["plan", "-h"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0 and "Usage" in r.output
