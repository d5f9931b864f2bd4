"""Throughput probe for executor training and generation on the real embedded base (SmolLM2-135M).

Measures, with synthetic but realistic records (~25-word requests, 1-3 node graphs with ids like
``Builtin::t1_daily_life::book_flight``) and batch 8:

* mean prompt and target tokens for each system prompt (paper / short) and target format (json / compact);
* training throughput (tokens/s counting prompt + target tokens, examples/s) for json vs compact targets,
  paper vs short system prompt, LoRA on all layers vs the top half, under the default precision (bf16
  autocast where the CPU supports it), plus fp32 and bfloat16-weight controls;
* greedy generation throughput (generated tokens/s, seconds per request) for fp32 and bf16 weights at
  batch 8 and 16.

Run: ``.venv/bin/python bench/train_probe.py`` (about 5 minutes on 2 CPU cores; ``--quick`` for less).
Numbers move with other load on the machine; the load average is printed with the table.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

from skillbank.data.records import Record
from skillbank.graph import TaskGraph
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.model.generate import GenerationStats, generate_for_requests
from skillbank.model.prompts import DEFAULT_SYSTEM_PROMPT, PAPER_SYSTEM_PROMPT, build_example
from skillbank.model.serialization import decode, encode
from skillbank.train.executor import TrainConfig, top_layers, train_executor

PREFIX = "Builtin::t1_daily_life::"
SKILLS = {  # skill -> (argument name -> value pool), request phrase
    "book_flight": ({"from": ["Boston", "Denver", "Lyon"], "to": ["Paris", "Tokyo", "Lima"], "date": ["2024-05-12", "next Friday"]},
                    "book a flight from {from} to {to} on {date}"),
    "set_alarm": ({"time": ["07:00", "6:30 am", "21:15"]}, "set an alarm for {time}"),
    "send_email": ({"to": ["alice@example.com", "my manager"], "subject": ["Quarterly report", "Trip plans"]},
                   "send an email to {to} about '{subject}'"),
    "daily_bill_payment": ({"bill": ["electricity", "water", "internet"]}, "pay my {bill} bill"),
    "attend_meeting_online": ({"topic": ["Budget Review", "Electricity Bill Management"]},
                              "join the online meeting about '{topic}'"),
    "order_food_delivery": ({"food": ["pizza", "sushi"], "location": ["home", "the office"]},
                            "order {food} delivered to {location}"),
    "check_weather": ({"location": ["Paris", "Seattle"], "date": ["tomorrow", "Saturday"]},
                      "check the weather in {location} for {date}"),
    "translate_text": ({"text": ["<node-0>", "Where is the station?"], "language": ["French", "German"]},
                       "translate that into {language}"),
}
OPENERS = ["I'm planning a busy week and could really use a hand.", "Could you help me with a couple of things today?",
           "My schedule is packed, so please take care of this for me.", "I have a few errands I keep postponing."]


def synthetic_records(n: int, seed: int = 0) -> list[Record]:
    rng = random.Random(seed)
    names = [s for s in SKILLS if s != "translate_text"]
    out = []
    for i in range(n):
        k = rng.choice([1, 1, 2, 2, 3])
        chosen = rng.sample(names, k)
        nodes, phrases = [], []
        for name in chosen:
            pool, phrase = SKILLS[name]
            args = {a: rng.choice(v) for a, v in pool.items()}
            nodes.append({"task": PREFIX + name, "arguments": [{"name": a, "value": v} for a, v in args.items()]})
            phrases.append(phrase.format(**args))
        links = [{"source": nodes[j]["task"], "target": nodes[j + 1]["task"]} for j in range(k - 1)]
        if k < 3 and rng.random() < 0.3:  # a reference-based step: links implied by <node-i>
            nodes.append({"task": PREFIX + "translate_text",
                          "arguments": [{"name": "text", "value": f"<node-{len(nodes) - 1}>"},
                                        {"name": "language", "value": rng.choice(["French", "German"])}]})
            phrases.append("translate the result into " + nodes[-1]["arguments"][1]["value"])
        request = f"{rng.choice(OPENERS)} Please {', then '.join(phrases)}, and let me know once everything is done."
        out.append(Record(f"s{i}", "t1_daily_life", request, TaskGraph.from_dict({"task_nodes": nodes, "task_links": links})))
    return out


def token_table(base, records) -> None:
    tok = base.tokenizer
    print("\n## mean tokens per example (SmolLM2 tokenizer)")
    print(f"request words: {statistics.mean(len(r.request.split()) for r in records):.1f}")
    for sp_name, sp in (("paper", PAPER_SYSTEM_PROMPT), ("short", DEFAULT_SYSTEM_PROMPT)):
        ex = [build_example(tok, r.request, encode(r.graph, "json", PREFIX), sp) for r in records]
        print(f"prompt tokens ({sp_name} system prompt): {statistics.mean(e.n_prompt for e in ex):.1f}")
    for fmt in ("json", "compact"):
        targets = [encode(r.graph, fmt, PREFIX) for r in records]
        assert all(decode(t, fmt, PREFIX).graph.canonical_key() == r.graph.canonical_key() for t, r in zip(targets, records))
        n = [len(tok(t, add_special_tokens=False).input_ids) + 1 for t in targets]
        print(f"target tokens ({fmt}, incl. end-of-turn): {statistics.mean(n):.1f}")


def train_row(base, records, label, cfg) -> dict:
    name = f"probe{train_row.count}"
    train_row.count += 1
    _, s = train_executor(base, records, cfg, adapter_name=name, family_prefix=PREFIX, progress=False)
    base.remove_adapter(name)
    row = {"config": label, "precision": s.precision, "tok/ex": s.total_tokens / (s.examples * s.epochs),
           "tok/s": s.tokens_per_second, "ex/s": s.examples_per_second, "s/step": s.wall_seconds / s.steps}
    print(f"| {label:<44} | {row['precision']:>4} | {row['tok/ex']:6.1f} | {row['tok/s']:7.1f} | {row['ex/s']:5.2f} | "
          f"{row['s/step']:6.2f} |", flush=True)
    return row


train_row.count = 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per training configuration")
    ap.add_argument("--quick", action="store_true", help="fewer configurations")
    args = ap.parse_args()
    t_start = time.perf_counter()
    base = load_base(BaseModelConfig(), progress=False)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpu count {os.cpu_count()}, "
          f"load average at start {os.getloadavg()[0]:.2f}")
    records = synthetic_records(200)
    token_table(base, records)

    n = 8 * args.steps
    train = records[:n]
    top = top_layers(base.num_layers, base.num_layers // 2)
    print(f"\n## training throughput (batch 8, {args.steps} optimizer steps; LoRA r16 on q/k/v/o, dropout 0 unless noted)")
    print("| configuration                                | prec | tok/ex |   tok/s |  ex/s | s/step |")
    print("|----------------------------------------------|------|--------|---------|-------|--------|")
    grid = [(fmt, sp, layers) for layers in ("all", "top") for fmt in ("json", "compact") for sp in ("paper", "short")]
    if args.quick:
        grid = [("json", "paper", "all"), ("compact", "short", "all"), ("compact", "short", "top")]

    def cfg_for(fmt, sp, layers, **kw):
        return TrainConfig(epochs=1, dropout=kw.pop("dropout", 0.0), target_format=fmt,
                           system_prompt=PAPER_SYSTEM_PROMPT if sp == "paper" else DEFAULT_SYSTEM_PROMPT,
                           layers_to_transform=top if layers == "top" else None, **kw)

    for fmt, sp, layers in grid:
        train_row(base, train, f"{fmt} / {sp} prompt / {layers} layers", cfg_for(fmt, sp, layers))
    if not args.quick:
        train_row(base, train, "compact / short prompt / all layers, fp32", cfg_for("compact", "short", "all", precision="fp32"))
        train_row(base, train, "compact / short prompt / all layers, drop .05", cfg_for("compact", "short", "all", dropout=0.05))

    requests = [r.request for r in records[100:132]]
    print("\n## generation throughput (greedy, untrained base: rows run to the cap, so this is decode speed)")
    print("| weights  | batch | new tokens cap | gen tok/s | s/request |")
    print("|----------|-------|----------------|-----------|-----------|")
    bf16_base = None
    for dtype in ("float32", "bfloat16"):
        model_base = base if dtype == "float32" else (bf16_base := load_base(BaseModelConfig(dtype="bfloat16"), progress=False))
        for bs in (8, 16):
            cap = 48
            st = GenerationStats()
            generate_for_requests(model_base.model, model_base.tokenizer, requests[:bs * 2 if not args.quick else bs],
                                  batch_size=bs, max_new_tokens=cap, stats=st)
            print(f"| {dtype:<8} | {bs:5d} | {cap:14d} | {st.tokens_per_second:9.1f} | {st.seconds / st.prompts:9.2f} |", flush=True)
    if bf16_base is not None and not args.quick:
        print("\n## bfloat16 weights, training (autocast bf16)")
        train_row(bf16_base, train, "compact / short prompt / all layers, bf16 wts",
                  TrainConfig(epochs=1, dropout=0.0, target_format="compact"))
    print(f"\nload average at end {os.getloadavg()[0]:.2f}; probe wall time {time.perf_counter() - t_start:.0f} s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
