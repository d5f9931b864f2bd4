"""The harness's evaluation on its two engines, in one run: seconds, tokens/s and EM, torch vs llama.cpp.

A finished run's last stage is evaluated again on every held-out request of every family, the way the runner
evaluates it (``continual.runner.evaluate_stage``: the method's own variants, its states, the run's grammars and
eval batch size), once with each engine, in fresh output caches so nothing is reused. Printed per engine: the
seconds generation took (merging each state into the base included, for llama.cpp), outputs and output tokens
per second, macro EM of each variant; then the ratio of the seconds and the share of outputs that are the same
text on both engines. The two engines take turns over ``--rounds`` rounds (the host's speed drifts).

    .venv/bin/python bench/eval_engines.py --run runs/demo [--method fsm] [--order O1] [--rounds 2]

The run must be on the embedded base (llama.cpp runs its GGUF) and have kept its last stage's state (every run
does). Writes nothing into the run directory.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished run directory (skillbank exp run / demo)")
    ap.add_argument("--method", default="fsm")
    ap.add_argument("--order", default=None, help="default: the run's first order")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of both engines, taking turns")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    from skillbank.config import RunConfig
    from skillbank.continual.engines import LlamaCppOutputs, TorchOutputs
    from skillbank.continual.reactivation import final_method
    from skillbank.continual.runner import OutputCache, evaluate_stage
    from skillbank.metrics import task_macro
    from skillbank.model.base import load_base
    from skillbank.run_dir import build_run_stream

    cfg = RunConfig.from_run(json.loads((args.run / "config.json").read_text()), str(args.run / "config.json"))
    stream = build_run_stream(cfg)
    order_name = args.order or cfg.eval.orders[0]
    order = stream.order(order_name)
    base = load_base(cfg.base_config(), progress=False)
    method = final_method(cfg, stream, args.method, order_name, args.run / "methods" / args.method, base)
    engines = {"torch": TorchOutputs(), "llama.cpp": LlamaCppOutputs(base.identity)}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    results: dict[str, dict] = {}
    texts: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(args.rounds):
            for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
                cache = OutputCache.for_run(Path(scratch) / f"{name}-{r}.jsonl", cfg, stream, engines[name])
                t0 = time.perf_counter()
                ev = evaluate_stage(method, len(order), order, stream, cache, split=cfg.eval.split,
                                    keep_predictions=True)
                seconds[name].append(time.perf_counter() - t0)
                tokens = sum(o["n_tokens"] for o in cache.outputs.values())
                results[name] = {"outputs": cache.generated, "tokens": tokens,
                                 "macro_em": {v: round(100 * task_macro(m["graph_em"] for m in e["tasks"].values()), 1)
                                              for v, e in ev["variants"].items()}}
                texts[name] = {(p["variant"], p["id"]): p["output"] for p in ev["predictions"]}
                print(f"round {r + 1} {name:9s} {seconds[name][-1]:6.1f} s  {cache.generated} outputs  "
                      f"{tokens / seconds[name][-1]:6.1f} tokens/s  macro EM {results[name]['macro_em']}", flush=True)
    for name in engines:
        results[name]["seconds"] = [round(s, 2) for s in seconds[name]]
        results[name]["median_seconds"] = round(statistics.median(seconds[name]), 2)
    same = sum(texts["torch"][k] == texts["llama.cpp"].get(k) for k in texts["torch"]) / max(1, len(texts["torch"]))
    ratio = results["torch"]["median_seconds"] / results["llama.cpp"]["median_seconds"]
    merge = engines["llama.cpp"].merge_seconds / max(1, engines["llama.cpp"].merges)
    print(f"\nevaluation of {args.method} {order_name} after stage {len(order)}, eval batch {cfg.eval.batch_size}, "
          f"{base.identity.get('dtype')} torch: torch {results['torch']['median_seconds']} s, llama.cpp "
          f"{results['llama.cpp']['median_seconds']} s (medians of {args.rounds}): **{ratio:.2f}x** faster; "
          f"{100 * same:.1f}% of outputs the same text; a state merged and loaded in {merge:.2f} s")
    engines["llama.cpp"].close()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"run": str(args.run), "method": args.method, "order": order_name,
                                         "batch_size": cfg.eval.batch_size, "engines": results,
                                         "speedup": round(ratio, 3), "same_text": round(same, 4),
                                         "merge_seconds": round(merge, 3)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
