"""skillbank.continual.keep_results (scripts/keep_results.py): a run's results without its weights, from which
a run continues."""
import json

from test_runner import tiny_config

from skillbank.continual import keep_results
from skillbank.continual.runner import run


def _script():
    return keep_results


def test_results_are_kept_without_weights_and_a_run_continues_from_them(tmp_path, tiny_model_dir):
    cfg = tiny_config(tiny_model_dir, ["sft"], eval={"orders": ["T1,T2", "T2,T1"], "max_new_tokens": 6, "batch_size": 4},
                      method_params={"sft": {"address_probe": False}})
    src = tmp_path / "run"
    full = run(cfg, src, progress=False, report=False)
    # the second order as if killed before its last evaluation
    (src / "methods" / "sft" / "T2,T1" / "stage-02" / "eval.json").unlink()
    assert _script().main([str(src), str(tmp_path / "kept")]) == 0
    kept = tmp_path / "kept"
    files = {p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()}
    assert "config.json" in files and "methods/sft/T1,T2/stage-02/eval.json" in files
    assert "methods/sft/T1,T2/predictions.jsonl" in files
    assert not any("T2,T1" in f for f in files)  # unfinished: left out whole
    assert not any(f.endswith(".safetensors") or "/state/" in f or "shared-stages" in f or f.endswith("outputs.jsonl")
                   for f in files)
    # a run on the kept results reads the finished order back and trains the other one again
    messages = []
    again = run(cfg, kept, say=messages.append, progress=False, report=False)
    assert any("sft T1,T2: already finished" in m for m in messages)
    for order in ("T1,T2", "T2,T1"):
        assert again["methods"]["sft"][order]["variants"] == full["methods"]["sft"][order]["variants"], order
    assert json.loads((kept / "methods" / "sft" / "T2,T1" / "stage-02" / "eval.json").read_text())["order"]


def test_a_missing_source_is_refused(tmp_path, capsys):
    assert _script().main([str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_the_bank_of_each_order_is_left_out(tmp_path):
    """FSM started from earlier shards keeps a bank per order (methods/fsm/bank-<order>): weights, not results."""
    src = tmp_path / "run"
    files = {"config.json": "{}", "methods/fsm/O1/stage-01/eval.json": json.dumps({"order": ["a"]}),
             "methods/fsm/O1/extra.json": "{}", "methods/fsm/bank-O1/bank.json": "{}",
             "methods/fsm/bank-O1/shards/0001-a/adapter_config.json": "{}", "methods/fsm/bank/bank.json": "{}"}
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    keep_results.keep(src, tmp_path / "kept")
    kept = {p.relative_to(tmp_path / "kept").as_posix() for p in (tmp_path / "kept").rglob("*") if p.is_file()}
    assert kept == {"config.json", "methods/fsm/O1/stage-01/eval.json", "methods/fsm/O1/extra.json"}
