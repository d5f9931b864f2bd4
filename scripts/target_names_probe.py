"""Does a fresh executor learn its family better when its targets write each skill's full id?

In the router comparison's order O2, FSM's first shard (t3, trained fresh) reached 60 and 50 EM with training seeds
0 and 1, where Progressive-LoRA's first adapter - the same records, recipe, LoRA initialisation and batch order -
reached 66 and 64. The one difference left is the target text: a shard writes bare skill names
(``web_search{...}``, its family prefix restored on decode), Progressive-LoRA's adapter the full ids
(``Builtin::t3_retrieval_understanding::web_search{...}``, 50% more target tokens). Two readings: the extra,
easy tokens dilute a per-token mean loss (an effectively lower learning rate), or they give the model positions
to work in before it commits to a skill name. This probe trains one family's executor fresh under each variant
and seed and measures it with its family forced (Oracle), under the family's grammar, decoded by llama.cpp:

    bare       the shard's format (the family prefix stripped)
    full       full skill ids (no prefix stripped), as Progressive-LoRA's adapters write them
    bare-lr    bare names at the learning rate times the ratio of the two formats' target tokens

    .venv/bin/python scripts/target_names_probe.py --config configs/compare-router.toml --family t3_retrieval_understanding \\
        --seeds 0,1 --variants bare,full --test 200 --json results/init/target-names.json

Held-out requests: the family's ``--test`` first held-out records of the config's stream built with that many test
records a family (the training records do not depend on it: the sampler draws every family's training records
first). Why a script: one measurement for a decision, not a feature.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from skillbank.config import RunConfig
from skillbank.data.builtin import build_builtin_stream
from skillbank.metrics import score_example
from skillbank.model.base import load_base
from skillbank.model.constrain import SkillSpec, build_grammar
from skillbank.model.prompts import render_prompt
from skillbank.model.serialization import decode_output, encode
from skillbank.train.executor import common_prefix, train_executor


def oracle_outputs(engine, model, tokenizer, catalog, skills, records, fmt: str, prefix: str, system_prompt: str,
                   batch: int, progress: bool = False) -> tuple[list[float], list[str]]:
    """Each record's graph EM and output text: ``model`` (its active adapters) decoded by ``engine`` (the harness's
    :class:`~skillbank.continual.engines.LlamaCppOutputs`) under the grammar of ``skills``, read in ``fmt``."""
    grammar = build_grammar([SkillSpec.of(catalog.skills[s]) for s in sorted(skills)], fmt, prefix)
    prompts = [render_prompt(tokenizer, r.request, system_prompt) for r in records]
    outs = engine.generate(model, tokenizer, prompts, grammars=[grammar] * len(prompts), batch_size=batch,
                           max_new_tokens=256, progress=progress)
    em = [score_example(r.graph, decode_output(o.text, fmt, prefix, stopped=o.stopped, reason=o.reason).graph).graph_em
          for r, o in zip(records, outs)]
    return em, [o.text for o in outs]


def evaluate(engine, base, cfg, catalog, family: str, records, prefix: str, batch: int) -> dict:
    t0 = time.perf_counter()
    em, _ = oracle_outputs(engine, base.peft, base.tokenizer, catalog, catalog.family(family).skills, records,
                           cfg.target_format, prefix, cfg.system_prompt, batch, progress=True)
    return {"em": 100 * sum(em) / len(em), "n": len(em), "seconds": round(time.perf_counter() - t0, 1),
            "per_request": em}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--family", required=True)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--variants", default="bare,full")
    ap.add_argument("--test", type=int, default=200, help="held-out requests of the family to measure on")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--json", help="write the results here (kept between runs: finished cells are skipped)")
    args = ap.parse_args()

    from skillbank.continual.engines import LlamaCppOutputs

    run = RunConfig.from_toml(args.config)
    s = run.stream
    stream = build_builtin_stream(seed=s.seed, train_per_family=s.train_per_family,
                                  test_per_family=max(args.test, s.test_per_family or 0))
    reference = build_builtin_stream(seed=s.seed, train_per_family=s.train_per_family,
                                     test_per_family=s.test_per_family)
    train = stream.train[args.family]
    if [r.request for r in train] != [r.request for r in reference.train[args.family]]:
        raise SystemExit("the training records depend on test_per_family here; the probe's premise fails")
    test = stream.test[args.family][:args.test]
    base = load_base(run.base_config())
    engine = LlamaCppOutputs(base.identity)
    catalog = stream.catalog
    family_prefix = common_prefix(sorted(catalog.family(args.family).skills))
    base_cfg = run.train_config_for("fsm")
    tokens = {p: sum(len(base.tokenizer(encode(r.graph, base_cfg.target_format, p))["input_ids"]) for r in train)
              for p in (family_prefix, "")}
    print(f"target tokens over {len(train)} records: bare {tokens[family_prefix]}, full {tokens['']}")
    out_path = Path(args.json) if args.json else None
    results = json.loads(out_path.read_text()) if out_path and out_path.is_file() else {}
    results["target_tokens"] = {"bare": tokens[family_prefix], "full": tokens[""]}
    cells = results.setdefault("cells", {})
    for seed in [int(x) for x in args.seeds.split(",")]:
        for variant in args.variants.split(","):
            key = f"{args.family}/{variant}/seed{seed}"
            if key in cells:
                print(f"{key}: {cells[key]['em']:.1f} (kept)")
                continue
            prefix = "" if variant == "full" else family_prefix
            cfg = dataclasses.replace(base_cfg, seed=seed)
            if variant == "bare-lr":
                cfg = dataclasses.replace(cfg, lr=cfg.lr * tokens[family_prefix] / tokens[""])
            name = f"probe_{variant.replace('-', '_')}_{seed}"
            _, summary = train_executor(base, train, cfg, adapter_name=name, family_prefix=prefix)
            base.activate([name])
            ev = evaluate(engine, base, cfg, catalog, args.family, test, prefix, args.batch)
            engine.close_decoder()
            base.remove_adapter(name)
            cells[key] = {"em": ev["em"], "n": ev["n"], "lr": cfg.lr, "train_seconds": round(summary.wall_seconds, 1),
                          "final_loss": summary.final_loss, "eval_seconds": ev["seconds"],
                          "per_request": ev["per_request"]}
            print(f"{key}: EM {ev['em']:.1f} over {ev['n']} (trained {summary.wall_seconds:.0f} s, "
                  f"final loss {summary.final_loss:.3f})", flush=True)
            if out_path:
                out_path.parent.mkdir(parents=True, exist_ok=True)
                out_path.write_text(json.dumps(results, indent=1) + "\n")
    engine.close()


if __name__ == "__main__":
    main()
