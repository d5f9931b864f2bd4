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
    r = invoke("exp", "stream", "build", "--out", tmp_path / "s", "--train-per-family", 20, "--test-per-family", 5)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s" / "train" / "t1_daily_life.jsonl").is_file()
    r = invoke("exp", "stream", "info", tmp_path / "s")
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
    r = invoke("exp", "route-eval", "--stream", stream_dir, "--order", "O1", "--order", "O2", "--json")
    assert r.exit_code == 0, r.output
    results = json.loads(r.stdout)
    assert [x["order_name"] for x in results] == ["O1", "O2"]
    for x in results:
        assert set(x["selectors"]) == {"address (hashing+NB)", "offline TF-IDF+LR"}
        rows = x["selectors"]["address (hashing+NB)"]
        assert len(rows) == 5 and rows[0]["micro"] == 1.0  # one family learned: nothing to confuse
        assert set(rows[-1]["per_family"]) == set(x["order"])
    r = invoke("exp", "route-eval", "--stream", stream_dir / "nope")
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
    # six training requests cannot tell every held-out request from English: plan them all with --no-scope
    r = invoke("plan", bank, "--file", tmp_path / "reqs.jsonl", "--max-new-tokens", 4, "--no-scope")
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.strip().splitlines()]
    assert [x["id"] for x in lines] == [x.id for x in small_stream.test[key]]
    assert all(x["shard"] == key for x in lines)
    r = invoke("plan", bank, "what is the capital of France?", "--max-new-tokens", 4)
    refused = json.loads(r.stdout)
    assert refused["out_of_scope"] and refused["shard"] is None and "no learned skill family" in refused["reason"]
    assert f"words {key} never uses: " in refused["reason"] and "'capital'" in refused["reason"]  # what is missing
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


def test_help_texts_keep_their_bracketed_words():
    """Typer renders help through rich, which swallows an unescaped ``[train]`` as a markup tag ("TOML with a
    section"): every bracketed word in a help text is escaped, so the rendered help shows it."""
    import re

    import typer.main
    from rich.markup import render

    def texts(command, path):
        yield path, command.help or ""
        for param in command.params:
            yield f"{path} {param.name}", getattr(param, "help", None) or ""
        for name, sub in getattr(command, "commands", {}).items():
            yield from texts(sub, f"{path} {name}")

    for where, text in texts(typer.main.get_command(app), "skillbank"):
        for word in re.findall(r"(?<!\\)\[[a-z_./]+\]", text):
            assert word in render(text).plain, f"{where}: {word} vanishes from the rendered help (escape it: \\{word})"


# -- issue 37: a CLI of the bank's verbs, the lab under `exp`, old names as hidden aliases ------------------
def test_top_level_lists_the_banks_verbs_and_one_exp_group():
    import typer.main
    root = typer.main.get_command(app)
    shown = [name for name, c in root.commands.items() if not c.hidden]
    assert len(shown) <= 17, shown
    assert {"create", "learn", "validate", "plan", "info", "skills", "forget", "relearn", "export", "import",
            "serve", "score", "demo", "doctor", "exp"} <= set(shown)
    assert set(root.commands["exp"].commands) >= {"run", "sweep", "report", "progress", "selectors", "route-scale",
                                                  "route-eval", "decoding", "diagnose", "reactivate", "scope", "stream"}
    assert set(root.commands["export"].commands) == {"family", "vllm"}
    help_text = invoke("--help").output
    for old in ("route-scale", "decoding-eval", "export-family", "import-family", "selectors", "reactivate"):
        assert old not in help_text


@pytest.mark.parametrize("old, new", [
    (["route-eval", "--stream", "DIR"], "skillbank exp route-eval"),
    (["route-scale", "--stream", "DIR", "--out", "DIR"], "skillbank exp route-scale"),
    (["selectors", "--bank", "DIR", "--stream", "DIR", "--out", "DIR"], "skillbank exp selectors"), (["decoding-eval", "BANK", "--out", "DIR"], "skillbank exp decoding"),
    (["export-family", "BANK", "F", "--out", "DIR"], "skillbank export family"), (["import-family", "BANK", "DIR"], "skillbank import"),
    (["run", "--config", "DIR"], "skillbank exp run"), (["progress", "DIR"], "skillbank exp progress"), (["report", "DIR"], "skillbank exp report"),
    (["reactivate", "DIR"], "skillbank exp reactivate"), (["diagnose", "--config", "DIR"], "skillbank exp diagnose"),
    (["sweep"], "skillbank exp sweep"), (["stream", "info", "DIR"], "skillbank exp stream info"),
    (["scope", "eval", "--offdomain", "DIR", "--out", "DIR"], "skillbank exp scope")])
def test_old_command_names_still_work_with_one_deprecation_line(tmp_path, old, new):
    args = [str(tmp_path / "missing") if a in ("BANK", "DIR") else a for a in old]
    r = runner.invoke(app, args)
    assert r.exit_code in (0, 1, 2), r.output
    warnings = [line for line in r.stderr.splitlines() if "deprecated" in line]
    assert len(warnings) == 1 and f"use `{new}`" in warnings[0], r.stderr


def test_an_old_name_runs_the_same_command(stream_dir):
    new = runner.invoke(app, ["exp", "route-eval", "--stream", str(stream_dir), "--json"])
    old = runner.invoke(app, ["route-eval", "--stream", str(stream_dir), "--json"])
    assert new.exit_code == old.exit_code == 0
    assert json.loads(old.stdout)[0]["order"] == json.loads(new.stdout)[0]["order"]
    assert "deprecated" not in new.stderr and "skillbank exp route-eval" in old.stderr


def test_library_errors_stay_one_line_under_the_new_and_the_old_names(tmp_path):
    for args in (["exp", "stream", "info", tmp_path / "nope"], ["stream", "info", tmp_path / "nope"],
                 ["export", "family", tmp_path / "nobank", "f", "--out", tmp_path / "o"],
                 ["export-family", tmp_path / "nobank", "f", "--out", tmp_path / "o"]):
        r = runner.invoke(app, [str(a) for a in args])
        assert r.exit_code == 2, r.output
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in r.output, r.output


# -- issue 15 item 7: plan --file forms, a quiet plan, score on the runner's predictions, shard base names ----
@pytest.fixture(scope="module")
def tiny_bank(tmp_path_factory, tiny_model_dir, small_stream):
    """A one-shard bank on the tiny model, learned through the CLI (with its catalog: complete grammars)."""
    root = tmp_path_factory.mktemp("cli-bank")
    key = "t4_vision_document"
    write_records(root / "stage.jsonl", small_stream.train[key])
    small_stream.catalog.save(root / "catalog.json")
    r = invoke("learn", root / "bank", "--family", key, "--data", root / "stage.jsonl", "--catalog",
               root / "catalog.json", "--base", tiny_model_dir, "--epochs", 1, "--recipe", "small-cpu")
    assert r.exit_code == 0, r.output
    return root / "bank"


def test_plan_file_plain_text_jsonl_and_stdin(tmp_path, tiny_bank, small_stream):
    reqs = [x.request for x in small_stream.test["t4_vision_document"]]
    # Plain text: one request per non-blank line, the id its line number (blank lines keep the numbering).
    (tmp_path / "reqs.txt").write_text(f"{reqs[0]}\n\n  {reqs[1]}  \n")
    r = invoke("plan", tiny_bank, "--file", tmp_path / "reqs.txt", "--max-new-tokens", 4)
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.strip().splitlines()]
    assert [(x["id"], x["request"]) for x in lines] == [(1, reqs[0]), (3, reqs[1])]
    # stdin, as JSONL (decided by the first line's '{', not by a suffix) and as plain text.
    jsonl = "".join(json.dumps({"id": f"r{i}", "request": q}) + "\n" for i, q in enumerate(reqs[:2]))
    r = runner.invoke(app, ["plan", str(tiny_bank), "--file", "-", "--max-new-tokens", "4"], input=jsonl)
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["id"] for x in r.stdout.strip().splitlines()] == ["r0", "r1"]
    # a request may hold characters str.splitlines treats as line breaks; JSON carries them unescaped
    odd = reqs[0] + "\u2028" + "\x85 and more"
    (tmp_path / "odd.jsonl").write_text(json.dumps({"id": "odd", "request": odd}, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    r = invoke("plan", tiny_bank, "--file", tmp_path / "odd.jsonl", "--max-new-tokens", 4)
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["request"] for x in r.stdout.strip().split("\n")] == [odd]
    # a JSONL file saved with a byte-order mark and CRLF line ends is still JSONL (the mark used to hide the '{')
    (tmp_path / "bom.jsonl").write_bytes(jsonl.replace("\n", "\r\n").encode("utf-8-sig"))
    r = invoke("plan", tiny_bank, "--file", tmp_path / "bom.jsonl", "--max-new-tokens", 4)
    assert r.exit_code == 0, r.output
    assert [(x["id"], x["request"]) for x in map(json.loads, r.stdout.strip().splitlines())] == [("r0", reqs[0]),
                                                                                               ("r1", reqs[1])]
    r = runner.invoke(app, ["plan", str(tiny_bank), "--file", "-", "--max-new-tokens", "4"], input=reqs[2] + "\n")
    assert r.exit_code == 0, r.output
    assert [(x["id"], x["request"]) for x in map(json.loads, r.stdout.strip().splitlines())] == [(1, reqs[2])]
    r = invoke("plan", "-h")
    help_text = " ".join(r.output.replace("│", " ").split())  # rich wraps the help inside a box
    assert "plain text" in help_text and "'-' for stdin" in help_text
    # several requests as arguments: one line each, in order; with --file as well, or with neither, an error
    r = invoke("plan", tiny_bank, reqs[0], reqs[1], "--max-new-tokens", 4)
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["request"] for x in r.stdout.strip().splitlines()] == [reqs[0], reqs[1]]
    for args in ([reqs[0], "--file", tmp_path / "reqs.txt"], []):
        r = invoke("plan", tiny_bank, *args)
        assert r.exit_code == 2 and "one of the two" in " ".join(r.output.replace("│", " ").split()), r.output


def test_plan_exits_1_when_a_request_failed_after_printing_every_plan(tmp_path, tiny_bank, small_stream):
    """A request too long for the model fails alone: every line is printed, the failed one says why, and the
    exit status is 1 so a script notices; refusals and plans alone exit 0 (the test above)."""
    ok = small_stream.test["t4_vision_document"][0].request
    (tmp_path / "reqs.txt").write_text("word " * 3000 + "\n" + ok + "\n")
    r = invoke("plan", tiny_bank, "--file", tmp_path / "reqs.txt", "--max-new-tokens", 4, "--no-scope")
    assert r.exit_code == 1, r.output
    lines = [json.loads(x) for x in r.stdout.strip().splitlines()]
    assert [x["id"] for x in lines] == [1, 2]
    assert lines[0]["failed"] and "too long" in lines[0]["error"] and not lines[1].get("failed")
    assert "1 of 2 requests failed" in r.stderr


def test_plan_file_errors_name_file_and_line(tmp_path):
    bank = tmp_path / "no-bank"  # the input is read before any bank or model is opened
    (tmp_path / "bad.jsonl").write_text('{"id": 1, "request": "a"}\n\n{"id": 2, "request": \n')
    r = invoke("plan", bank, "--file", tmp_path / "bad.jsonl")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "bad.jsonl:3: malformed JSON" in r.output and "first line starts with '{'" in r.output
    (tmp_path / "bad.jsonl").write_text('{"id": 1, "request": "a"}\n{"id": 2, "text": "b"}\n')
    r = invoke("plan", bank, "--file", tmp_path / "bad.jsonl")
    assert r.exit_code == 2 and "bad.jsonl:2: each JSONL line needs a string 'request'" in r.output
    (tmp_path / "bad.jsonl").write_text('{"id": 1, "request": "a"}\n{"id": 2, "request": "  "}\n')
    r = invoke("plan", bank, "--file", tmp_path / "bad.jsonl")
    assert r.exit_code == 2 and "bad.jsonl:2: the request is empty" in r.output
    r = runner.invoke(app, ["plan", str(bank), "--file", "-"], input='{"request": "a"}\nnot json\n')
    assert r.exit_code == 2 and "<stdin>:2: malformed JSON" in r.output
    r = runner.invoke(app, ["plan", str(bank), "--file", "-"], input="\n  \n")
    assert r.exit_code == 2 and "no requests" in r.output
    r = invoke("plan", bank, "--file", tmp_path / "missing.txt")
    assert r.exit_code == 2 and "missing.txt: no such file" in r.output


def test_plan_stderr_has_only_our_own_lines(tiny_bank, small_stream):
    """No transformers warnings or weight-loading bars: a real process, so every writer to stderr is seen."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "skillbank", "plan", str(tiny_bank),
                        small_stream.test["t4_vision_document"][0].request, "--max-new-tokens", "4"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["request"] == small_stream.test["t4_vision_document"][0].request
    foreign = [line for line in p.stderr.splitlines() if line.strip() and not line.startswith("skillbank:")]
    assert foreign == [], p.stderr


def test_load_base_restores_transformers_switches(tiny_model_dir):
    """The quiet load is scoped: transformers' verbosity and bar switch are as they were afterwards."""
    from transformers.utils import logging as hf_logging

    from skillbank.model.base import BaseModelConfig, load_base
    before = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    load_base(BaseModelConfig(name=str(tiny_model_dir), threads=1))
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == before


def _runner_row(variant, rec, output, graph, error=None):
    # The continual runner's predictions.jsonl row (skillbank.continual.runner.evaluate_stage).
    return {"variant": variant, "id": rec.id, "family": rec.family, "route": rec.family,
            "state": f"shard:{rec.family}:sha256:0", "output": output, "em": None, "error": error,
            "graph": graph, "mean_logprob": -0.1}


def test_score_reads_runner_predictions(tmp_path, small_stream):
    from skillbank.model.serialization import encode
    from skillbank.train.executor import common_prefix
    fams = ["t1_daily_life", "t2_language_speech"]
    golds = [r for k in fams for r in small_stream.test[k]]  # 3 + 3
    write_records(tmp_path / "gold.jsonl", golds)
    prefix = {k: common_prefix(list(small_stream.catalog.family(k).skills)) for k in fams}
    compact = {r.id: encode(r.graph, "compact", prefix[r.family]) for r in golds}
    rows = []
    # fsm: graph + compact output (the graph is the prediction); one invalid (graph null, its reason kept);
    # golds[5] is missing.
    for r in golds[:4]:
        rows.append(_runner_row("fsm", r, compact[r.id], r.graph.canonical().to_dict()))
    rows.append(_runner_row("fsm", golds[4], "book{", None, "line 1 (book): arguments are not a JSON object"))
    # oracle: the same ids again (another group); compact output only, decoded with the routed family's
    # prefix; golds[0]'s output is another request's graph (wrong), golds[1]'s a JSON output.
    for r in golds:
        row = _runner_row("oracle", r, compact[r.id], None)
        del row["graph"], row["error"]
        row["format"] = "compact"
        rows.append(row)
    rows[5]["output"] = compact[golds[3].id]
    rows[6].update(format="json", output=golds[1].graph.to_json())
    pred = tmp_path / "predictions.jsonl"
    pred.write_text("".join(json.dumps(x) + "\n" for x in rows))

    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", pred, "--json")
    assert r.exit_code == 0, r.output
    out = {g["group"]["variant"]: g for g in json.loads(r.stdout)["groups"]}
    assert out["fsm"]["overall"]["graph_em"] == pytest.approx(4 / 6)
    assert out["fsm"]["missing"] == 1
    assert out["fsm"]["invalid_reasons"] == {"line 1 (book)": 1, "no prediction": 1}
    assert out["oracle"]["overall"]["graph_em"] == pytest.approx(5 / 6) and out["oracle"]["missing"] == 0
    assert out["oracle"]["per_family"]["t2_language_speech"]["graph_em"] == 1.0
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", pred)
    assert r.exit_code == 0 and "variant=fsm" in r.output and "variant=oracle" in r.output

    # A stream directory as gold (its test split and catalog): the same scores for the families it has.
    stream_dir = small_stream.save(tmp_path / "stream")
    r = invoke("score", "--gold", stream_dir, "--pred", pred, "--json")
    assert r.exit_code == 0, r.output
    fsm = next(g for g in json.loads(r.stdout)["groups"] if g["group"] == {"variant": "fsm"})
    assert fsm["per_family"]["t1_daily_life"]["graph_em"] == 1.0
    assert fsm["missing"] == 1 + 9  # golds[5] and the three families without predictions

    # Compact output without a format field is JSON unless --format says otherwise; without a known family
    # its prefix cannot be found: an error naming the line.
    for row in rows[5:]:
        row.pop("format")
    rows[6]["output"] = compact[golds[1].id]
    pred.write_text("".join(json.dumps(x) + "\n" for x in rows))
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", pred, "--format", "compact", "--json")
    oracle = next(g for g in json.loads(r.stdout)["groups"] if g["group"] == {"variant": "oracle"})
    assert oracle["overall"]["graph_em"] == pytest.approx(5 / 6)
    rows[7]["route"] = rows[7]["family"] = "t9_nowhere"
    pred.write_text("".join(json.dumps(x) + "\n" for x in rows))
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", pred, "--format", "compact")
    assert r.exit_code == 2 and "predictions.jsonl:8: a compact output needs the family prefix" in r.output


def test_score_group_errors_name_file_and_line(tmp_path, small_stream):
    golds = small_stream.test["t2_language_speech"]
    write_records(tmp_path / "gold.jsonl", golds)
    g = golds[0].graph.to_dict()
    pred = tmp_path / "pred.jsonl"
    pred.write_text(json.dumps(_runner_row("fsm", golds[0], "", g)) + "\n"
                    + json.dumps(_runner_row("fsm", golds[0], "", g)) + "\n")
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", pred)
    assert r.exit_code == 2 and "pred.jsonl:2: duplicate prediction for id" in r.output and "variant=fsm" in r.output
    pred.write_text(json.dumps(_runner_row("fsm", golds[0], "", g)) + "\n"
                    + json.dumps({"id": golds[1].id, "graph": g}) + "\n")
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", pred)
    assert r.exit_code == 2 and "pred.jsonl:2: group fields [] differ" in r.output
    pred.write_text(json.dumps({"variant": "a", "id": golds[0].id, "output": "x", "format": "yaml"}) + "\n")
    r = invoke("score", "--gold", tmp_path / "gold.jsonl", "--pred", pred)
    assert r.exit_code == 2 and "pred.jsonl:1: 'format' must be one of" in r.output


def test_shard_adapter_config_names_a_loadable_base(tmp_path, tiny_bank, tiny_model_dir, monkeypatch):
    from peft import PeftConfig

    from skillbank.memory.bank import SkillBank, read_manifest
    from skillbank.memory.execution import EMBEDDED_HF_ID, peft_base_name
    shard_dir = tiny_bank / read_manifest(tiny_bank).shards[0].dir
    expected = str(tiny_model_dir.resolve())
    assert json.loads((shard_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == expected
    assert PeftConfig.from_pretrained(str(shard_dir)).base_model_name_or_path == expected
    # The embedded base is named by its hub id; the bank's own check stays the digest in bank.json.
    sb = SkillBank.open(tiny_bank)
    sb.execution.base.identity["name"] = "embedded"
    sb.execution.save_shard("t4_vision_document", tmp_path / "copy")
    assert PeftConfig.from_pretrained(str(tmp_path / "copy")).base_model_name_or_path == EMBEDDED_HF_ID
    assert read_manifest(tiny_bank).base["name"] == str(tiny_model_dir)
    # A relative directory is written absolute; a hub id as it is.
    monkeypatch.chdir(tiny_model_dir.parent)
    assert peft_base_name(tiny_model_dir.name) == expected
    assert peft_base_name("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
