"""The report's check of the paper's findings: verdicts from numbers, and 'not measured' for what is
missing or unfinished rather than a verdict on partial results."""
from skillbank.report.findings import check_findings, findings_markdown


def _entry(macro, bwt, diag=0.6, complete=True, stages=5):
    return {"complete": complete, "stages_done": stages if complete else 3,
            "summary": {"macro_em": macro, "bwt": bwt, "diagonal_macro_em": diag}}


def _record(**methods):
    """methods: name -> entry (the same for both orders)."""
    out = {}
    for name, e in methods.items():
        per_order = {"complete": e["complete"], "stages_done": e["stages_done"],
                     "variants": {name: {"summary": e["summary"]}}}
        out[name] = {"O1": per_order, "O2": per_order}
    return {"name": "r", "methods": out}


def _paper_like():
    return {"sft": _entry(0.15, -0.60), "lwf": _entry(0.15, -0.55), "ewc": _entry(0.10, -0.50),
            "olora": _entry(0.15, -0.65), "progressive-routed": _entry(0.50, -0.09), "replay": _entry(0.68, -0.02),
            "fsm": _entry(0.66, -0.04)}


def test_a_run_like_the_papers_holds_every_finding():
    found = check_findings(_record(**_paper_like()))
    assert {(f.key, f.order) for f in found} == {(k, o) for k in ("forgetting", "retention", "beats-progressive-routed",
                                                                 "replay-reference") for o in ("O1", "O2")}
    assert {f.verdict for f in found} == {"holds"}
    beats = next(f for f in found if f.key == "beats-progressive-routed")
    assert beats.claim == "FSM beats Progressive-LoRA (routed: Address Memory) on macro EM"
    assert "vs Progressive-LoRA (routed: Address Memory) 50.0" in beats.evidence


def test_each_reading_of_progressive_lora_is_its_own_named_finding():
    m = _paper_like()
    m["stacked"] = _entry(0.70, -0.60)           # the summed, unrouted stack above FSM
    found = {f.key: f for f in check_findings(_record(**m)) if f.order == "O1"}
    assert found["beats-progressive-routed"].verdict == "holds"
    stacked = found["beats-stacked"]
    assert stacked.verdict == "does not hold" and "Stacked-LoRA (summed, unrouted)" in stacked.claim
    # a replay-free reading above Replay fails the Replay finding, named
    assert "not as the paper: Stacked-LoRA (summed, unrouted)" in found["replay-reference"].evidence


def test_the_stacked_reading_evaluated_by_the_routed_method_is_judged_too():
    # progressive-routed evaluates Stacked-LoRA from the same adapters: a run without a `stacked` method has it
    m = _paper_like()
    record = _record(**m)
    for per_order in record["methods"]["progressive-routed"].values():
        per_order["variants"]["stacked"] = {"summary": {"macro_em": 0.15, "bwt": -0.68, "diagonal_macro_em": 0.6}}
    found = {f.key: f for f in check_findings(record) if f.order == "O1"}
    assert found["beats-stacked"].verdict == "holds" and "Stacked-LoRA (summed, unrouted) 15.0" in found["beats-stacked"].evidence
    assert "Stacked-LoRA (summed, unrouted) 15.0" in found["replay-reference"].evidence


def test_a_run_saved_before_the_rename_is_judged_under_its_old_name():
    m = _paper_like()
    del m["progressive-routed"]
    m["progressive"] = _entry(0.14, -0.63)       # what `progressive` ran: the summed, unrouted stack
    found = {f.key: f for f in check_findings(_record(**m)) if f.order == "O2"}
    old = found["beats-progressive"]
    assert old.verdict == "holds" and "run as 'progressive'" in old.claim
    assert "beats-progressive-routed" not in found  # only the readings the run has are judged
    assert found["replay-reference"].verdict == "holds"


def test_without_any_reading_the_routed_one_is_not_measured():
    m = _paper_like()
    del m["progressive-routed"]
    found = {f.key: f for f in check_findings(_record(**m)) if f.order == "O1"}
    beats = found["beats-progressive-routed"]
    assert beats.verdict == "not measured" and "Progressive-LoRA (routed: Address Memory) not run" in beats.evidence
    assert found["replay-reference"].verdict == "not measured"


def test_each_finding_can_fail():
    m = _paper_like()
    m["ewc"] = _entry(0.40, -0.02)              # EWC keeps its old families
    m["fsm"] = _entry(0.45, -0.08)              # FSM forgets and falls below Progressive-LoRA
    m["sft"] = _entry(0.70, -0.60)              # a replay-free baseline above Replay
    found = {f.key: f for f in check_findings(_record(**m)) if f.order == "O1"}
    assert all(f.verdict == "does not hold" for f in found.values()), found
    assert "not as the paper: EWC" in found["forgetting"].evidence
    assert "not as the paper: SFT" in found["replay-reference"].evidence


def test_unfinished_or_missing_methods_are_not_judged():
    m = _paper_like()
    m["progressive-routed"] = _entry(0.70, 0.0, complete=False)   # would beat FSM, but only after stage 3
    del m["replay"]
    found = {f.key: f for f in check_findings(_record(**m)) if f.order == "O2"}
    prog = found["beats-progressive-routed"]
    assert prog.verdict == "not measured" and "stopped after stage 3" in prog.evidence
    replay = found["replay-reference"]
    assert replay.verdict == "not measured" and "Replay not run" in replay.evidence
    assert found["retention"].verdict == "holds"
    # a failure already seen is reported even while other methods are unfinished
    m["sft"] = _entry(0.3, 0.0)
    m["lwf"] = _entry(0.1, -0.5, complete=False)
    forgetting = next(f for f in check_findings(_record(**m)) if f.key == "forgetting")
    assert forgetting.verdict == "does not hold"


def test_markdown_lists_every_verdict_and_the_acquisition_line():
    record = _record(**_paper_like())
    for name in record["methods"]:
        for per_order in record["methods"][name].values():
            per_order["variants"][name]["summary"]["diagonal_macro_em"] = 0.5
    md = "\n".join(findings_markdown([record]))
    assert md.count("| holds |") == 8
    assert "- order O1: FSM 50.0, SFT 50.0, LwF 50.0 (1.00x SFT)" in md
    # a baseline that learns less than 0.6x what SFT learns is marked
    for per_order in record["methods"]["ewc"].values():
        per_order["variants"]["ewc"]["summary"]["diagonal_macro_em"] = 0.25
    md = "\n".join(findings_markdown([record]))
    assert "EWC 25.0 (0.50x SFT, **below 0.6x**)" in md and "LwF 50.0 (1.00x SFT)," in md
