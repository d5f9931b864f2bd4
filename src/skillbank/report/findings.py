"""Does a run show what the paper reports? Each of the paper's comparison findings, checked on a run's
numbers against a threshold fixed here in advance, with a plain verdict: holds, does not hold, or not
measured yet (a method missing or stopped before its last stage).

The findings (FSM paper, Table 2 and Section 6) and the thresholds that decide them:

* the direct sequential baselines (SFT, LwF, EWC, O-LoRA) lose closed-book EM on earlier families:
  BWT at most -10 points (the paper's are -38 to -71);
* FSM keeps them: BWT at least -6 points (the paper's are -3.7 and -5.1);
* FSM beats Progressive-LoRA on task-macro EM (by 14.3 points on average in the paper). The paper does not
  say which reading of Progressive-LoRA it ran, so the finding is judged against each one the run has, and
  names it: Progressive-LoRA routed by the Address Memory (``progressive-routed``: the same router as FSM,
  so the gap is the executors'), and Stacked-LoRA, every adapter summed for every request
  (``stacked``, or ``progressive`` in runs made before the rename). With neither run, the routed one is
  reported not measured;
* Replay is the strong reference: its macro EM is at least that of every replay-free trained baseline
  (SFT, LwF, EWC, O-LoRA, and each reading of Progressive-LoRA the run has, as above; the Oracle-routed
  variant is a reference, not a baseline). The paper also has Replay 1.9 points above FSM; the gap is
  reported, not judged.

A run is judged per order. The thresholds are not fitted to any run; change them here, not per report.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

FORGETTING_BWT = -0.10       # "loses old families": BWT at or below this
RETENTION_BWT = -0.06        # "keeps them (BWT near zero)": BWT at or above this
DIRECT_BASELINES = ("sft", "lwf", "ewc", "olora")
#: The readings of Progressive-LoRA that FSM is compared with, each a finding of its own when the run has it.
PROGRESSIVE_READINGS = ("progressive-routed", "stacked")
REPLAY_FREE_TRAINED = DIRECT_BASELINES + PROGRESSIVE_READINGS
#: a variant -> the method that evaluates it, where the names differ
VARIANT_METHOD = {"oracle": "fsm", "progressive-oracle": "progressive-routed"}
#: the name a method had in runs made before it was renamed
LEGACY_NAMES = {"stacked": "progressive"}
TITLES = {"sft": "SFT", "lwf": "LwF", "ewc": "EWC", "olora": "O-LoRA", "stacked": "Stacked-LoRA (summed, unrouted)",
          "progressive": "Stacked-LoRA (summed, unrouted; run as 'progressive')",
          "progressive-routed": "Progressive-LoRA (routed: Address Memory)",
          "progressive-oracle": "Progressive-LoRA (routed: Oracle)", "fsm": "FSM", "replay": "Replay"}


@dataclass
class Finding:
    key: str              # "forgetting" | "retention" | "beats-<variant>" (e.g. "beats-progressive-routed",
                          # "beats-stacked") | "replay-reference"
    claim: str
    order: str
    verdict: str          # "holds" | "does not hold" | "not measured"
    evidence: str


def _present(result: dict, variant: str) -> str:
    """``variant``, or its name before a rename when the run has only that (``stacked`` was ``progressive``)."""
    legacy = LEGACY_NAMES.get(variant)
    if legacy and variant not in result["methods"] and legacy in result["methods"]:
        return legacy
    return variant


def _method_of(result: dict, variant: str) -> str:
    """The method whose evaluation holds ``variant``: its own method when the run has one, else the method that
    evaluates it beside its own (``progressive-routed`` also evaluates Stacked-LoRA from the same adapters)."""
    if variant in result["methods"]:
        return variant
    if variant in VARIANT_METHOD:
        return VARIANT_METHOD[variant]
    for method, per_order in result["methods"].items():
        if any(variant in po.get("variants", {}) for po in per_order.values()):
            return method
    return variant


def _summary(result: dict, variant: str, order: str) -> tuple[dict | None, str | None]:
    """(summary, None) for a finished variant, else (None, why it is missing)."""
    method = _method_of(result, variant)
    per_order = result["methods"].get(method, {}).get(order)
    if per_order is None or variant not in per_order["variants"]:
        return None, f"{TITLES.get(variant, variant)} not run"
    if not per_order.get("complete", False):
        return None, f"{TITLES.get(variant, variant)} stopped after stage {per_order['stages_done']}"
    return per_order["variants"][variant]["summary"], None


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def check_findings(result: dict) -> list[Finding]:
    """Every finding for every order of one run (a ``load_run`` record)."""
    orders = sorted({o for per_order in result["methods"].values() for o in per_order})
    out: list[Finding] = []
    for order in orders:
        out.append(_forgetting(result, order))
        out.append(_retention(result, order))
        out.extend(_beats_progressive(result, order))
        out.append(_replay_reference(result, order))
    return out


def _every_method(key: str, claim: str, order: str, result: dict, methods: Sequence[str], fails, show,
                  lead: str = "") -> Finding:
    """A finding over several methods: it fails on any finished method that ``fails``, and is not measured
    while some are unfinished and none has failed yet."""
    parts, missing, failed = [], [], []
    for m in (_present(result, m) for m in methods):
        s, why = _summary(result, m, order)
        if s is None:
            missing.append(why)
            continue
        parts.append(f"{TITLES[m]} {show(s)}")
        if fails(s):
            failed.append(TITLES[m])
    evidence = lead + ", ".join(parts)
    if failed:
        return Finding(key, claim, order, "does not hold", f"{evidence}; not as the paper: {', '.join(failed)}")
    if missing:
        return Finding(key, claim, order, "not measured", "; ".join(filter(None, [evidence] + missing)))
    return Finding(key, claim, order, "holds", evidence)


def _forgetting(result: dict, order: str) -> Finding:
    return _every_method("forgetting", "SFT, LwF, EWC and O-LoRA lose closed-book EM on earlier families "
                         "(BWT <= -10 points)", order, result, DIRECT_BASELINES,
                         fails=lambda s: s["bwt"] > FORGETTING_BWT, show=lambda s: f"BWT {_pts(s['bwt'])}")


def _retention(result: dict, order: str) -> Finding:
    claim = "FSM keeps earlier families (BWT >= -6 points)"
    s, why = _summary(result, "fsm", order)
    if s is None:
        return Finding("retention", claim, order, "not measured", why)
    evidence = f"FSM BWT {_pts(s['bwt'])}, macro EM {_pct(s['macro_em'])}"
    return Finding("retention", claim, order, "holds" if s["bwt"] >= RETENTION_BWT else "does not hold", evidence)


def _readings(result: dict) -> list[str]:
    """The readings of Progressive-LoRA the run has (under the names it ran them); the routed one when none."""
    present = [v for v in (_present(result, r) for r in PROGRESSIVE_READINGS) if _method_of(result, v) in result["methods"]]
    return present or list(PROGRESSIVE_READINGS[:1])


def _beats_progressive(result: dict, order: str) -> list[Finding]:
    """FSM (Address-routed) against each reading of Progressive-LoRA the run has, each named."""
    return [_beats(result, order, v) for v in _readings(result)]


def _beats(result: dict, order: str, variant: str) -> Finding:
    title = TITLES[variant]
    key, claim = f"beats-{variant}", f"FSM beats {title} on macro EM"
    fsm, why_f = _summary(result, "fsm", order)
    prog, why_p = _summary(result, variant, order)
    if fsm is None or prog is None:
        return Finding(key, claim, order, "not measured", "; ".join(w for w in (why_f, why_p) if w))
    gap = fsm["macro_em"] - prog["macro_em"]
    evidence = f"FSM {_pct(fsm['macro_em'])} vs {title} {_pct(prog['macro_em'])} ({_pts(gap)} points)"
    return Finding(key, claim, order, "holds" if gap > 0 else "does not hold", evidence)


def _replay_reference(result: dict, order: str) -> Finding:
    claim = "Replay is the strong reference (macro EM >= every replay-free trained baseline)"
    replay, why = _summary(result, "replay", order)
    if replay is None:
        return Finding("replay-reference", claim, order, "not measured", why)
    fsm, _ = _summary(result, "fsm", order)
    lead = f"Replay {_pct(replay['macro_em'])}"
    if fsm is not None:
        lead += f" ({_pts(replay['macro_em'] - fsm['macro_em'])} points over FSM)"
    return _every_method("replay-reference", claim, order, result, DIRECT_BASELINES + tuple(_readings(result)),
                         fails=lambda s: s["macro_em"] > replay["macro_em"],
                         show=lambda s: _pct(s["macro_em"]), lead=lead + "; ")


#: a trained baseline "learns its families" when its diagonal EM is at least this share of sequential SFT's
#: (the bar the hyperparameter sweep holds every selected setting to: skillbank.report.sweep)
LEARNS = 0.6


def acquisition_lines(result: dict) -> list[str]:
    """How well each trained method learns a family when it arrives (mean EM on the diagonal of its
    accuracy matrix), next to FSM's executors trained on the same data alone: a baseline that forgets
    and one that never learned look alike in BWT and macro EM, but not here. A baseline below
    ``LEARNS`` x SFT's diagonal is marked."""
    orders = sorted({o for per_order in result["methods"].values() for o in per_order})
    lines = []
    for order in orders:
        parts = []
        sft = result["methods"].get("sft", {}).get(order)
        sft_d = sft["variants"]["sft"]["summary"]["diagonal_macro_em"] if sft and "sft" in sft["variants"] else None
        for m in ("fsm",) + tuple(_present(result, m) for m in REPLAY_FREE_TRAINED) + ("replay",):
            per_order = result["methods"].get(m, {}).get(order)
            if per_order is None or m not in per_order["variants"]:
                continue
            d = per_order["variants"][m]["summary"]["diagonal_macro_em"]
            done = "" if per_order.get("complete") else f" (stages 1-{per_order['stages_done']})"
            ratio = ""
            if m not in ("fsm", "sft") and sft_d:
                ratio = f" ({d / sft_d:.2f}x SFT{'' if d >= LEARNS * sft_d else f', **below {LEARNS:g}x**'})"
            parts.append(f"{TITLES[m]} {_pct(d)}{ratio}{done}")
        if parts:
            lines.append(f"- order {order}: " + ", ".join(parts))
    return lines


def findings_markdown(results: Sequence[dict]) -> list[str]:
    """The section for the report: one verdict table per run, and the acquisition line."""
    lines = ["## The paper's findings on this run", "",
             "Each finding of the paper's method comparison, judged on this run against a threshold fixed in "
             "advance (`skillbank/report/findings.py`); a method missing or stopped early leaves it not measured.", ""]
    multi = len(results) > 1
    for res in results:
        if multi:
            lines += [f"### {res.get('name', '')}", ""]
        lines += ["| finding | order | verdict | evidence |", "|---|---|---|---|"]
        for f in check_findings(res):
            verdict = f"**{f.verdict}**" if f.verdict == "does not hold" else f.verdict
            lines.append(f"| {f.claim} | {f.order} | {verdict} | {f.evidence} |")
        acq = acquisition_lines(res)
        if acq:
            lines += ["", "Learning each family when it arrives (mean EM on the accuracy matrix's diagonal, %); "
                      "the paper's sequential baselines learn the newest family about as well as SFT does:", ""] + acq
        lines.append("")
    return lines
