"""The report's failure analysis: final predictions sorted into failure kinds against the run's own gold
requests, old prediction rows re-read, and a row that cannot be re-read to its recorded EM refused."""
import json

import pytest

from skillbank.config import RunConfig
from skillbank.run_dir import build_run_stream
from skillbank.errors import SkillbankError
from skillbank.graph import TaskGraph
from skillbank.model.serialization import encode
from skillbank.report.failures import count_failures, failures_markdown
from skillbank.report.run_report import VARIANT_TITLES

ORDER = "T1,T2,T3"


def _drifted(graph: TaskGraph, family: str) -> TaskGraph:
    """The same graph with every skill id moved to ``family`` (the skill names kept)."""
    d = graph.to_dict()
    rename = {n["task"]: "::".join(n["task"].split("::")[:-2] + [family, n["task"].split("::")[-1]])
              for n in d["task_nodes"]}
    for n in d["task_nodes"]:
        n["task"] = rename[n["task"]]
    for link in d["task_links"]:
        link["source"], link["target"] = rename[link["source"]], rename[link["target"]]
    return TaskGraph.from_dict(d)


def _run_dir(root, cfg):
    """A run directory holding cfg's config and a finished stage-01 of ORDER for SFT (no model involved)."""
    stream = build_run_stream(cfg)
    order = stream.order(ORDER)
    odir = root / "methods" / "sft" / ORDER
    (odir / "stage-01").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(cfg.resolved()))
    (odir / "stage-01" / "eval.json").write_text(json.dumps({"order": order}))
    return stream, order, odir


@pytest.fixture
def fake_run(tmp_path):
    """A run directory with config, stage-01 order and hand-made SFT predictions (no model involved)."""
    cfg = RunConfig.from_dict({"name": "f", "methods": ["sft"], "train": {"target_format": "compact"},
                               "stream": {"source": "builtin", "train_per_family": 2, "test_per_family": 4},
                               "eval": {"orders": [ORDER]}})
    stream, order, odir = _run_dir(tmp_path, cfg)
    first, last = stream.test[order[0]], stream.test[order[-1]]
    rows = [
        {"id": first[0].id, "graph": first[0].graph.to_dict(), "em": 1.0},                      # exact
        {"id": first[1].id, "graph": _drifted(first[1].graph, order[-1]).to_dict(), "em": 0.0},  # address drift
        {"id": first[2].id, "graph": last[0].graph.to_dict(), "em": 0.0},                       # newest family
        {"id": first[3].id, "graph": None, "em": 0.0},                                          # unparsable
        # a row from before the runner stored the graph: re-read from the compact text with the stream prefix
        {"id": last[0].id, "output": encode(last[0].graph, "compact", "Builtin::"), "em": 1.0},
        {"id": last[1].id, "graph": first[1].graph.to_dict(), "em": 1.0, "variant": "sft+address"},  # not counted
    ]
    with open(odir / "predictions.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps({"variant": "sft", "route": None, "output": "", **r}) + "\n")
    return tmp_path, odir / "predictions.jsonl"


def test_failure_kinds_are_counted_per_group(fake_run):
    run_dir, _ = fake_run
    counts = count_failures(run_dir)[ORDER]
    assert set(counts) == {"sft"}  # the +address probe is not closed-book
    assert dict(counts["sft"]["earlier"]) == {"correct": 1, "address": 1, "newest_family": 1, "unparsed": 1}
    assert dict(counts["sft"]["last"]) == {"correct": 1}
    md = "\n".join(failures_markdown([run_dir], run_dir, VARIANT_TITLES))
    assert "| Sequential SFT | 4 | 25.0 | 0.0 | 25.0 | 25.0 | 0.0 | 0.0 | 25.0 |" in md
    assert (run_dir / f"failures_{ORDER}.png").is_file()


def test_a_tuning_run_is_read_against_its_validation_split(tmp_path):
    """A run evaluated on the validation split (the sweep's screens) predicted validation requests: the failure
    analysis reads them against that split, not the held-out one."""
    cfg = RunConfig.from_dict({"name": "v", "methods": ["sft"], "train": {"target_format": "compact"},
                               "stream": {"source": "builtin", "train_per_family": 4, "test_per_family": 2,
                                          "validation_per_family": 2},
                               "eval": {"orders": [ORDER], "split": "validation"}})
    stream, order, odir = _run_dir(tmp_path, cfg)
    val = stream.validation[order[0]]
    with open(odir / "predictions.jsonl", "w") as fh:
        for r in val:
            fh.write(json.dumps({"variant": "sft", "route": None, "output": "", "id": r.id,
                                 "graph": r.graph.to_dict(), "em": 1.0}) + "\n")
    assert dict(count_failures(tmp_path)[ORDER]["sft"]["earlier"]) == {"correct": len(val)}


def test_a_row_that_does_not_reproduce_its_em_is_refused_with_file_and_line(fake_run):
    run_dir, path = fake_run
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    row["em"] = 1.0  # the drifted graph is not an exact match
    lines[1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SkillbankError, match=r"predictions.jsonl:2: .*recorded EM"):
        count_failures(run_dir)
    # the report says why the section is missing instead of failing or printing an empty table
    md = "\n".join(failures_markdown([run_dir], run_dir, VARIANT_TITLES))
    assert "Not analysed for" in md and "predictions.jsonl:2:" in md


def test_a_request_outside_the_stream_is_refused(fake_run):
    run_dir, path = fake_run
    path.write_text(path.read_text().replace('"id": "builtin-', '"id": "other-', 1))
    with pytest.raises(SkillbankError, match="jsonl:1: request 'other-.*not in the run's stream"):
        count_failures(run_dir)


@pytest.mark.parametrize("bad, reason", [("{not json", "malformed JSON"),
                                         ('{"variant": "sft", "id": "x"}', "not a prediction row"),
                                         ('{"variant": "sft", "id": "x", "em": 0, "graph": {"task_nodes": []}}',
                                          "not a prediction row")])
def test_a_malformed_row_names_its_file_and_line(fake_run, bad, reason):
    run_dir, path = fake_run
    path.write_text(path.read_text() + bad + "\n")
    with pytest.raises(SkillbankError, match=f"predictions.jsonl:7: .*{reason}"):
        count_failures(run_dir)
