"""Access versus execution: is a forgotten skill gone, or only no longer reached from the raw request?

Two diagnostics on sequential SFT (one LoRA, task A then task B):

* **Forgetting trajectory** - while B is learned, every few optimizer steps task A's held-out requests
  are answered closed-book and with the correct skill address appended (the gold skill ids), and B's
  closed-book EM is tracked too. The paper's finding: A's closed-book EM collapses within a few steps
  while +address EM stays high for a while, then erodes.
* **Correct-skill-address reactivation** - on the checkpoint after B (closed-book access to A lost), A is
  answered with the correct address appended and with controls that add as much text but not the right
  key: a wrong address from A's own family, an unrelated valid address (B's skills), token-matched random
  text, a generic instruction; and the frozen base with the correct address (can the address alone do
  it without the trained skill?).

The address is plain text after the request (``address_hint``); nothing else in the prompt changes.
The diagnostics use the methods (``SequentialSFT``, the address helpers of ``continual.methods.base``);
no method imports this module.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from skillbank.continual.methods.base import address_hint, with_text  # continual.reactivation reads them here too
from skillbank.data.records import Record
from skillbank.metrics import score_example

if TYPE_CHECKING:
    from skillbank.config import RunConfig

Say = Callable[[str], None]
GENERIC_INSTRUCTION = "Use the appropriate skills for this request and fill in every argument."
DEFAULT_SCHEDULE = (0, 1, 2, 3, 4, 6, 8, 10, 12, 15, 18, 22, 26, 30, 40, 50, 60, 80, 100, 150, 200, 300)


def control_texts(record: Record, family_skills: Sequence[str], other_skills: Sequence[str], tokenizer,
                  rng: random.Random) -> dict[str, str]:
    """The text appended under each condition for one record (empty = closed-book)."""
    gold = list(record.graph.tasks)
    correct = address_hint(gold)
    wrong_pool = [s for s in family_skills if s not in gold] or list(family_skills)
    wrong = address_hint([rng.choice(wrong_pool) for _ in gold])
    unrelated = address_hint([rng.choice(list(other_skills)) for _ in gold])
    n_tokens = len(tokenizer(correct, add_special_tokens=False)["input_ids"])
    vocab = [t for t in tokenizer.get_vocab() if t.isalpha() and len(t) > 2]
    vocab.sort()
    random_text = ""
    while len(tokenizer(random_text, add_special_tokens=False)["input_ids"]) < n_tokens:
        random_text = (random_text + " " + rng.choice(vocab)).strip()
    return {"closed_book": "", "correct_address": correct, "wrong_address_same_family": wrong,
            "unrelated_valid_address": unrelated, "token_matched_random": random_text,
            "generic_instruction": GENERIC_INSTRUCTION}


def _em(model, tokenizer, records: Sequence[Record], requests: Sequence[str], cfg: RunConfig, fmt: str, prefix: str,
        system_prompt: str) -> float:
    from skillbank.model.generate import generate_for_requests
    from skillbank.model.serialization import decode

    gens = generate_for_requests(model, tokenizer, list(requests), system_prompt=system_prompt,
                                 batch_size=cfg.eval.batch_size, max_new_tokens=cfg.eval.max_new_tokens)
    scores = [score_example(r.graph, decode(g.text, fmt, prefix).graph).graph_em for r, g in zip(records, gens)]
    return sum(scores) / len(scores) if scores else 0.0


def run_diagnostics(cfg: RunConfig, out_dir: str | Path, *, first: str = "T1", second: str = "T2",
                    eval_requests: int = 50, schedule: Sequence[int] = DEFAULT_SCHEDULE, say: Say | None = None,
                    progress: bool = True) -> dict:
    """Train sequential SFT on ``first`` then ``second`` (the runner's SFT recipe and seeds) and measure both
    diagnostics. Writes ``diagnostics.json``, ``diagnostics.md`` and ``forgetting_trajectory.png``."""
    from skillbank.continual.methods import MethodContext
    from skillbank.continual.methods.sequential import ADAPTER, SequentialSFT
    from skillbank.run_dir import build_run_stream
    from skillbank.model.base import load_base

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    stream = build_run_stream(cfg)
    order = stream.order(f"{first},{second}")
    fam_a, fam_b = order
    base = load_base(cfg.base_config(), progress=progress)
    train = cfg.train_config_for("sft")  # the diagnostic follows sequential SFT
    ctx = MethodContext(base=base, train=train, stream=stream, order_name=f"{first},{second}", order=order,
                        workdir=out, progress=progress, say=say)
    sft = SequentialSFT(ctx)
    tok = base.tokenizer
    fmt, prefix, system = train.target_format, sft.stream_prefix, train.system_prompt
    test_a = stream.test[fam_a][:eval_requests]
    test_b = stream.test[fam_b][:eval_requests]
    rng = random.Random(cfg.stream.seed)
    skills_a = list(stream.catalog.family(fam_a).skills)
    skills_b = list(stream.catalog.family(fam_b).skills)
    texts = [control_texts(r, skills_a, skills_b, tok, rng) for r in test_a]

    def em_a(model, condition: str) -> float:
        reqs = [with_text(r.request, t[condition]) if t[condition] else r.request for r, t in zip(test_a, texts)]
        return _em(model, tok, test_a, reqs, cfg, fmt, prefix, system)

    def em_b(model) -> float:
        return _em(model, tok, test_b, [r.request for r in test_b], cfg, fmt, prefix, system)

    if say:
        say(f"diagnostics: sequential SFT on {first} ({fam_a}) then {second} ({fam_b}); "
            f"{len(test_a)} held-out requests of {first}")
    sft.learn(1, fam_a, stream.train[fam_a])
    model = base.activate([ADAPTER])
    after_a = {"closed_book": em_a(model, "closed_book"), "correct_address": em_a(model, "correct_address")}
    if say:
        say(f"  after {first}: closed-book {100 * after_a['closed_book']:.1f}, +address {100 * after_a['correct_address']:.1f}")

    trajectory: list[dict] = []
    wanted = set(schedule)
    conditions = ["closed_book", "correct_address", "wrong_address_same_family", "unrelated_valid_address",
                  "token_matched_random", "generic_instruction"]
    at_access_loss: dict = {}

    def probe(step: int) -> None:
        if step not in wanted:
            return
        m = base.activate([ADAPTER])
        point = {"step": step, "closed_book": em_a(m, "closed_book"), "correct_address": em_a(m, "correct_address"),
                 "second_closed_book": em_b(m)}
        trajectory.append(point)
        if say:
            say(f"  step {step}: {first} closed-book {100 * point['closed_book']:.1f}, +address "
                f"{100 * point['correct_address']:.1f}; {second} closed-book {100 * point['second_closed_book']:.1f}")
        # The first checkpoint that lost closed-book access while the address still works is where the
        # controls tell whether it is *the right address* that reactivates the skill, or any added text.
        if not at_access_loss and point["closed_book"] == 0.0 and point["correct_address"] > 0.0:
            at_access_loss.update({"step": step, **{c: point[c] for c in ("closed_book", "correct_address")}})
            for c in conditions[2:]:
                at_access_loss[c] = em_a(m, c)
            if say:
                say(f"  controls at step {step}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in at_access_loss.items()
                                                               if k != "step"))

    probe(0)
    sft.on_step = probe
    summary_b = sft.learn(2, fam_b, stream.train[fam_b])
    sft.on_step = None
    model = base.activate([ADAPTER])
    reactivation = {c: em_a(model, c) for c in conditions}
    with base.peft.disable_adapter():
        reactivation["frozen_base_correct_address"] = em_a(base.peft, "correct_address")
    if say:
        say("  reactivation after " + second + ": " + ", ".join(f"{k} {100 * v:.1f}" for k, v in reactivation.items()))
    record = {
        "first": {"task": first, "family": fam_a}, "second": {"task": second, "family": fam_b},
        "eval_requests": len(test_a), "after_first": after_a, "trajectory": trajectory,
        "second_stage_steps": summary_b["steps"], "reactivation_after_second": reactivation,
        "reactivation_at_access_loss": at_access_loss or None,
        "hierarchy": hierarchy(trajectory, after_a),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "examples": [{"request": test_a[i].request, **{c: texts[i][c] for c in conditions[1:]}} for i in range(min(2, len(test_a)))],
    }
    (out / "diagnostics.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    write_diagnostics_report(record, out)
    return record


def hierarchy(trajectory: Sequence[dict], after_first: dict) -> dict:
    """When closed-book EM first hits zero, what +address recovers then, and when +address falls below half
    of its value after the first task."""
    zero = next((p for p in trajectory if p["closed_book"] == 0.0), None)
    ref = after_first.get("correct_address") or 0.0
    eroded = next((p for p in trajectory if ref and p["correct_address"] < 0.5 * ref), None)
    return {"closed_book_zero_at_step": zero["step"] if zero else None,
            "address_em_when_closed_book_zero": zero["correct_address"] if zero else None,
            "address_below_half_at_step": eroded["step"] if eroded else None}


def write_diagnostics_report(record: dict, out: Path) -> Path:
    from skillbank.report.plots import line_plot

    a, b = record["first"]["task"], record["second"]["task"]
    traj = record["trajectory"]
    png = line_plot({f"{a} closed-book": [(p["step"], p["closed_book"]) for p in traj],
                     f"{a} + correct address": [(p["step"], p["correct_address"]) for p in traj],
                     f"{b} closed-book (being learned)": [(p["step"], p["second_closed_book"]) for p in traj]},
                    out / "forgetting_trajectory.png",
                    f"Sequential SFT: {a} while {b} is learned", xlabel=f"optimizer steps on {b}", ylabel="EM (%)")
    h = record["hierarchy"]
    r = record["reactivation_after_second"]

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}"

    lines = ["## Diagnostics: access versus execution (sequential SFT)", "",
             f"{a} learned, then {b}. {record['eval_requests']} held-out {a} requests per measurement. After {a}: "
             f"closed-book EM {pct(record['after_first']['closed_book'])}, with the correct skill address "
             f"{pct(record['after_first']['correct_address'])}.", "",
             f"- closed-book EM on {a} first reaches 0 at step {h['closed_book_zero_at_step']} of {b}"
             f" (of {record['second_stage_steps']}); +address EM then {pct(h['address_em_when_closed_book_zero'])}",
             f"- +address EM falls below half its post-{a} value at step {h['address_below_half_at_step']}", "",
             f"Reactivation on the checkpoint after {b} (EM on {a}, %):", "",
             "| condition | EM |", "|---|---:|"]
    names = {"closed_book": "closed-book (raw request)", "correct_address": "+ correct skill address",
             "wrong_address_same_family": "+ wrong address, same family", "unrelated_valid_address": f"+ valid address of {b}",
             "token_matched_random": "+ token-matched random text", "generic_instruction": "+ generic instruction",
             "frozen_base_correct_address": "frozen base + correct address"}
    lines += [f"| {names.get(k, k)} | {pct(v)} |" for k, v in r.items()]
    early = record.get("reactivation_at_access_loss")
    if early:
        lines += ["", f"Reactivation at step {early['step']} of {b}, the first probe where closed-book EM on {a} was 0 "
                  "but the correct address still worked (EM on {a}, %):".replace("{a}", a), "",
                  "| condition | EM |", "|---|---:|"]
        lines += [f"| {names.get(k, k)} | {pct(v)} |" for k, v in early.items() if k != "step"]
    else:
        lines += ["", "No probe found closed-book EM at 0 with the correct address still working."]
    lines += ["", f"![forgetting trajectory]({png.name})", ""]
    path = out / "diagnostics.md"
    path.write_text("\n".join(lines) + "\n")
    return path
