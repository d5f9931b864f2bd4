"""Bring your own skills (issue 15, item 1): the README walk-through on the tiny model, `validate`, the
checks `learn` runs before loading anything, the recipe `learn` picks, and the Python API."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from skillbank.cli import app
from skillbank.train.recipes import recipe_for_base
from skillbank.errors import RecordError

from conftest import killed_after_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "home_energy"
SECTIONS = ("## Teach a bank your own skill family", "## Plan\n")
runner = CliRunner()


def invoke(args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def readme_section() -> str:
    """The README's sections on teaching a family and planning, which together walk through both."""
    text = (REPO / "README.md").read_text()
    parts = []
    for title in SECTIONS:
        start = text.index(title)
        end = text.find("\n## ", start + len(title))
        parts.append(text[start:end if end > 0 else None])
    return "\n".join(parts)


def code_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", readme_section(), flags=re.S)


def walkthrough_commands() -> list[list[str]]:
    """The `skillbank ...` lines of the section's bash block(s), as argument lists."""
    cmds = []
    for block in code_blocks("bash"):
        for raw in block.replace("\\\n", " ").splitlines():
            args = shlex.split(raw, comments=True)
            if args and args[0] == "skillbank":
                cmds.append(args[1:])
    return cmds


@pytest.fixture()
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the README's paths are relative to the repository root


def test_readme_walkthrough_runs_on_the_tiny_model(tmp_path, tiny_model_dir, in_repo):
    cmds = [c for c in walkthrough_commands() if c[0] != "augment"]  # augment's input is the reader's own file
    assert [c[0] for c in cmds][:3] == ["validate", "learn", "plan"]
    cmds = cmds[:3] + [["info", "mybank"]]
    bank = str(tmp_path / "ex-bank")
    outputs = {}
    for args in cmds:
        args = [bank if a == "mybank" else a for a in args]
        if args[0] == "learn":  # the tiny random model instead of the embedded one; one epoch is enough here
            args += ["--base", tiny_model_dir, "--epochs", 1]
        if args[0] == "plan":
            args += ["--max-new-tokens", 8]
        r = invoke(args)
        assert r.exit_code == 0, (args, r.output)
        outputs[args[0]] = r
    assert "85 record(s), all valid" in outputs["validate"].stdout
    assert "recipe small-cpu (auto)" in outputs["learn"].output  # a tiny base: auto picks the small recipe
    assert "learned home_energy" in outputs["learn"].output
    plan = json.loads(outputs["plan"].stdout.strip().splitlines()[0])
    assert plan["shard"] == "home_energy"
    assert "home_energy" in outputs["info"].stdout
    # The shard keeps the tools' specs (required flags included) and the names the agent calls.
    info = json.loads(invoke(["info", bank, "--json"]).stdout)
    shard_dir = Path(bank) / info["shards"][0]["dir"]
    skills = json.loads((shard_dir / "skills.json").read_text())
    assert sorted(skills["skills"]) == sorted(t["function"]["name"] for t in json.loads((EXAMPLE / "tools.json").read_text()))
    thermo = next(s for s in skills["specs"] if s["id"] == "set_thermostat")
    assert [(a["name"], a.get("required", False)) for a in thermo["arguments"]] == [("room", True), ("temperature", True)]


def test_readme_python_walkthrough_runs_on_the_tiny_model(tmp_path, tiny_model_dir, in_repo):
    learn_code, plan_code = code_blocks("python")
    code = learn_code + plan_code
    swaps = {'SkillBank.create("mybank")':
             f'SkillBank.create({str(tmp_path / "home-bank")!r}, base_config=BaseModelConfig(name={str(tiny_model_dir)!r}))',
             'SkillBank.open("mybank")':
             f'SkillBank.open({str(tmp_path / "home-bank")!r}, base_config=BaseModelConfig(name={str(tiny_model_dir)!r}))',
             'catalog="examples/home_energy/tools.json")':
             'catalog="examples/home_energy/tools.json", train_config=TrainConfig.for_small_cpu(epochs=1))',
             "bank.plan([": "bank.plan(max_new_tokens=8, requests=["}
    for old, new in swaps.items():
        assert old in code, f"the README's Python example changed: {old!r} is gone; update this test"
        code = code.replace(old, new)
    printed = []
    scope = {"print": lambda *a: printed.append(a)}
    exec("from skillbank.model.base import BaseModelConfig\nfrom skillbank.train import TrainConfig\n" + code, scope)
    assert printed and printed[0][0] in ("home_energy", None)  # planned, or refused by a one-epoch tiny bank
    assert scope["bank"].shard_names == ["home_energy"]


def bad_records(tmp_path) -> Path:
    lines = (EXAMPLE / "records.jsonl").read_text().splitlines()[:3]
    bad = json.loads(lines[1])
    bad["family"] = "travel"
    wrong_arg = json.loads(lines[2])
    wrong_arg["graph"]["task_nodes"][0]["arguments"].append({"name": "colour", "value": "blue"})
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join([lines[0], json.dumps(bad), "{nope", json.dumps(wrong_arg), lines[0]]) + "\n")
    return p


def test_validate_command_reports_every_bad_line(tmp_path, in_repo):
    p = bad_records(tmp_path)
    r = invoke(["validate", "--data", p, "--catalog", EXAMPLE / "tools.json", "--family", "home_energy"])
    assert r.exit_code == 1
    out = r.stdout.splitlines()
    assert out[0] == f"{p}:2: record he-002: family 'travel', expected 'home_energy'"
    assert out[1].startswith(f"{p}:3: malformed JSON")
    assert out[2] == (f"{p}:4: record he-003: node 0 (get_meter_reading) has undeclared argument(s) ['colour'] "
                      "(declared: ['meter', 'period'])")
    assert out[3] == f"{p}:5: duplicate record id 'he-001' (first on line 1)"
    assert out[4] == f"{p}: 4 bad line(s) of 5, 1 valid"
    r = invoke(["validate", "--data", p, "--json"])  # no catalog, no family: only the file's own problems
    assert r.exit_code == 1
    assert [e["line"] for e in json.loads(r.stdout)["errors"]] == [3, 5]
    r = invoke(["validate", "--data", EXAMPLE / "records.jsonl", "--catalog", EXAMPLE / "tools.mcp.json",
                "--family", "home_energy"])
    assert r.exit_code == 0 and "all valid" in r.stdout
    r = invoke(["validate", "--data", EXAMPLE / "records.jsonl", "--catalog", EXAMPLE / "tools.json"])
    assert r.exit_code == 2 and "has no families" in r.output  # a tools list needs --family
    r = invoke(["validate", "--data", tmp_path / "missing.jsonl"])
    assert r.exit_code == 2 and "no such file" in r.output


def test_learn_checks_everything_before_loading_a_model_or_creating_the_bank(tmp_path, monkeypatch, in_repo,
                                                                              tiny_model_dir):
    import skillbank.model.base as base_mod

    def no_model(*a, **k):
        raise AssertionError("learn loaded a model before checking its input")
    monkeypatch.setattr(base_mod, "load_base", no_model)
    bank = tmp_path / "bank"
    p = bad_records(tmp_path)
    r = invoke(["learn", bank, "--family", "home_energy", "--data", p, "--catalog", EXAMPLE / "tools.json"])
    assert r.exit_code == 2, r.output
    assert f"{p}:2:" in r.output and f"{p}:3:" in r.output and f"{p}:4:" in r.output and f"{p}:5:" in r.output
    assert "nothing learned" in r.output and not bank.exists()
    # Valid lines, but another --family than the records say: refused the same way.
    r = invoke(["learn", bank, "--family", "energy", "--data", EXAMPLE / "records.jsonl"])
    assert r.exit_code == 2 and "expected 'energy'" in r.output and not bank.exists()
    # A bad catalog, a bad family name and a non-bank directory are refused before loading too.
    (tmp_path / "rows.json").write_text('{"rows": []}')
    r = invoke(["learn", bank, "--family", "home_energy", "--data", EXAMPLE / "records.jsonl", "--catalog",
                tmp_path / "rows.json"])
    assert r.exit_code == 2 and "rows.json: not a skill catalog" in r.output and not bank.exists()
    r = invoke(["learn", bank, "--family", "../up", "--data", EXAMPLE / "records.jsonl"])
    assert r.exit_code == 2 and not bank.exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    r = invoke(["learn", tmp_path / "full", "--family", "home_energy", "--data", EXAMPLE / "records.jsonl"])
    assert r.exit_code == 2 and "not a skill bank" in r.output


def test_recipe_auto_by_base(tmp_path, tiny_model_dir):
    assert recipe_for_base("embedded")[0] == "small-cpu"
    recipe, why = recipe_for_base(str(tiny_model_dir))
    assert recipe == "small-cpu" and "config.json" in why
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 36, "vocab_size": 151936,
                                                 "intermediate_size": 12288, "num_attention_heads": 32,
                                                 "num_key_value_heads": 8, "head_dim": 128,
                                                 "tie_word_embeddings": False}))
    recipe, why = recipe_for_base(str(big))
    assert recipe == "paper" and "~8.2B" in why  # Qwen3-8B's shape
    assert recipe_for_base("someone/Qwen3-8B-not-cached")[0] == "paper"
    assert recipe_for_base("someone/SmolLM2-360M-not-cached")[0] == "small-cpu"
    assert recipe_for_base("someone/Qwen2.5-0.5B-not-cached")[0] == "small-cpu"
    recipe, why = recipe_for_base("someone/mystery-model")
    assert recipe == "paper" and "unknown" in why and "--recipe small-cpu" in why


def test_python_learn_takes_dicts_paths_and_tools_objects(tmp_path, tiny_model_dir):
    from skillbank import SkillBank
    from skillbank.model.base import BaseModelConfig, load_base
    from skillbank.train.executor import TrainConfig
    cfg = TrainConfig(epochs=1, batch_size=4, target_format="compact", seed=0)
    base = load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)
    bank = SkillBank.create(tmp_path / "bank", base=base)
    dicts = [json.loads(x) for x in (EXAMPLE / "records.jsonl").read_text().splitlines()]
    mcp = json.loads((EXAMPLE / "tools.mcp.json").read_text())
    # Bad dicts: every problem in one error, before any training (no shard directory appears).
    broken = [dict(dicts[0], family="x"), dict(dicts[1], request="")] + dicts[2:6]
    with pytest.raises(RecordError) as info:
        bank.learn("home_energy", broken, cfg, catalog=mcp, progress=False)
    assert "item 1: record he-001: family 'x'" in str(info.value) and "item 2: record he-002: empty request" in str(info.value)
    assert not any((tmp_path / "bank" / "shards").iterdir())
    entry = bank.learn("home_energy", dicts[:12], cfg, catalog=mcp, progress=False)
    assert entry.skills == sorted(t["name"] for t in mcp["tools"])
    # A path, checked the same way (here: the family does not match).
    with pytest.raises(RecordError, match="expected 'other'"):
        bank.learn("other", EXAMPLE / "records.jsonl", cfg, progress=False)


def test_import_skillbank_stays_light():
    code = ("import sys, skillbank; heavy = [m for m in ('torch', 'numpy', 'transformers') if m in sys.modules]; "
            "assert not heavy, heavy; from skillbank import SkillBank, Catalog, validate_records; "
            "assert SkillBank.__module__ == 'skillbank.memory.bank'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_killed_learn_continues_from_its_checkpoint(tmp_path, tiny_model_dir, in_repo):
    from skillbank.memory.bank import bank_info

    args = ["--family", "home_energy", "--data", EXAMPLE / "records.jsonl", "--catalog", EXAMPLE / "tools.json",
            "--base", tiny_model_dir, "--epochs", 2, "--checkpoint-minutes", 1e-9]
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    assert invoke(["learn", clean, *args]).exit_code == 0
    with killed_after_checkpoint(5):
        r = invoke(["learn", killed, *args])
    checkpoint = killed / "checkpoints" / "home_energy.fit.pt"
    assert r.exit_code == 130 and f"the training so far is in {checkpoint}; run the same command again" in r.output
    assert checkpoint.is_file() and bank_info(killed)["shards"] == []  # nothing published by the killed learn
    r = invoke(["learn", killed, *args])
    assert r.exit_code == 0 and f"fit checkpoint {checkpoint}: continuing this training after step 5" in r.output
    assert not checkpoint.exists()
    (want,), (got,) = (json.loads((b / "bank.json").read_text())["shards"] for b in (clean, killed))
    assert got["digests"]["adapter_model.safetensors"] == want["digests"]["adapter_model.safetensors"]  # byte for byte
