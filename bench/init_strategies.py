"""Where should a new executor start? FSM banks learned with each ``--init`` rule, same recipe, compared.

Each rule learns the five built-in families in the stream's order with the demo's recipe (``configs/demo``:
its seed, sizes, epochs and LoRA), a new shard starting from a fresh LoRA (``fresh``, the paper), the
family-neutral start (``neutral``: an adapter trained once on invented families, ``skillbank.memory.neutral``;
its one-off build is timed apart), the last shard added (``previous``) or the shard the Address Memory routes
most of the new family's own training requests to (``nearest``; replay-free) or the sum of the three nearest
shards' updates weighted by that routing's probability, cut back to the recipe's rank (``merge``). Every bank is
then planned on:

- the template held-out requests, routed by its own Address Memory (what a user gets) and with the right shard
  forced (Oracle: the executors alone), per family and as the macro mean over families;
- the hand-written development sets (``tests/fixtures/paraphrase_builtin*.jsonl``), routed and with the right
  shard forced;

with the scope gate off (every request planned), the grammar on and values decoded freely (``copy_values=False``,
as every bank made before copied values existed plans). The learning time of each family is the
wall time of ``SkillBank.learn`` (one heavy job on the machine at a time). A bank that already exists under
``--banks/<rule>`` is reused (``--banks`` may hold a ``fresh`` bank made by ``bench/gate_em.py --make``:
the same recipe); where ``--banks/fresh`` exists, ``previous``, ``nearest`` and ``merge`` import its first family's shard (a
fresh start under those rules) instead of training it again. The figures of rules run earlier stay in
``--json``; a rule run again replaces its own.

    .venv/bin/python bench/init_strategies.py --banks runs/init --rules fresh,previous,nearest \
        --json results/init/init.json
    .venv/bin/python bench/init_strategies.py --banks runs/init-O2 --order O2 --first-from runs/init/fresh \
        --rules previous --json results/init/init.json     # the other order (fresh shards do not depend on it)

Plans use the bank's default engine (llama.cpp on the embedded base where installed: ``bench/engine_parity.py``
measures how it compares with the torch reference, the same for every rule).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
DEV = ["paraphrase_builtin", "paraphrase_builtin_holdout", "paraphrase_builtin_short"]
ALL_RULES = "fresh,neutral,previous,nearest"


def make_bank(path: Path, rule: str, run, stream, first_from: Path | None, order: str = "O1",
              scope_params: dict | None = None) -> dict:
    """Learn the stream's families into a new bank at ``path`` with ``init=rule``. The first family has nothing
    to start from under any rule: with ``first_from`` (a bank of the same recipe) its shard is imported from
    there instead of trained again."""
    import tempfile

    from skillbank.memory.bank import SkillBank
    from skillbank.model.base import load_base

    bank = SkillBank.create(path, base=load_base(run.base_config()), scope_params=scope_params)
    seconds = {}
    families = stream.order(order)
    if rule == "neutral":  # built (or found in the cache) first: its one-off cost is not a family's
        from skillbank.memory.neutral import ensure_neutral_start
        t0 = time.perf_counter()
        directory, lineage = ensure_neutral_start(bank.execution, bank.manifest.base["digest"], run.train_config())
        seconds["neutral_start_build"] = round(time.perf_counter() - t0, 1)
        print(f"[neutral] start ready in {seconds['neutral_start_build']:.0f} s: {directory}", flush=True)
    if first_from is not None:
        with tempfile.TemporaryDirectory() as tmp:
            SkillBank.open_offline(first_from).export_family(families[0], Path(tmp) / "first")
            bank.import_family(Path(tmp) / "first")
        print(f"[{rule}] {families[0]} imported from {first_from} (a fresh start under every rule)", flush=True)
        families = families[1:]
    for family in families:
        t0 = time.perf_counter()
        entry = bank.learn(family, stream.train[family], run.train_config(), catalog=stream.catalog, init=rule)
        seconds[family] = round(time.perf_counter() - t0, 1)
        print(f"[{rule}] learned {family} in {seconds[family]:.0f} s, start: {entry.lineage}", flush=True)
    (path / "learn_seconds.json").write_text(json.dumps(seconds, indent=1) + "\n")
    return seconds


def graph_em(records, plans) -> list[int]:
    from skillbank.graph import TaskGraph
    from skillbank.metrics import score_example
    return [int(score_example(r.graph, TaskGraph.from_dict(p.graph) if p.graph else None).graph_em)
            for r, p in zip(records, plans)]


def evaluate(path: Path, stream, batch_size: int) -> dict:
    from skillbank.data.records import Record
    from skillbank.memory.bank import SkillBank

    bank = SkillBank.open(path)
    out: dict = {"lineage": {e.name: e.lineage for e in bank.manifest.shards}, "routed": {}, "oracle": {}}
    t0 = time.perf_counter()
    for family in stream.family_keys:
        records = stream.test[family]
        requests = [r.request for r in records]
        # values decoded freely, as in banks made before copied values existed: rules measured on different days
        # stay comparable
        routed = bank.plan(requests, scope=False, batch_size=batch_size, copy_values=False)
        oracle = bank.plan(requests, shard=family, batch_size=batch_size, copy_values=False)
        out["routed"][family] = round(100 * sum(graph_em(records, routed)) / len(records), 1)
        out["oracle"][family] = round(100 * sum(graph_em(records, oracle)) / len(records), 1)
    for kind in ("routed", "oracle"):
        out[f"{kind}_macro"] = round(sum(out[kind].values()) / len(out[kind]), 1)
    dev = [Record.from_dict(json.loads(line)) for f in DEV
           for line in (FIXTURES / f"{f}.jsonl").read_text().splitlines() if line.strip()]
    dev = [r for r in dev if r.family in bank.shard_names]
    plans = bank.plan([r.request for r in dev], scope=False, batch_size=batch_size, copy_values=False)
    # and the executors alone on them (each family's requests planned by its own shard): comparable across routers
    right = 0
    for family in sorted({r.family for r in dev}):
        mine = [r for r in dev if r.family == family]
        right += sum(graph_em(mine, bank.plan([r.request for r in mine], shard=family, batch_size=batch_size,
                                              copy_values=False)))
    out["handwritten_dev"] = {"n": len(dev), "em": round(100 * sum(graph_em(dev, plans)) / len(dev), 1),
                              "oracle_em": round(100 * right / len(dev), 1)}
    out["plan_seconds"] = round(time.perf_counter() - t0, 1)
    seconds = path / "learn_seconds.json"
    if seconds.is_file():
        out["learn_seconds"] = json.loads(seconds.read_text())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--banks", type=Path, required=True, help="one bank per rule is made (or reused) here")
    ap.add_argument("--rules", default="", help="comma-separated --init rules (default with --evaluate: none; "
                    f"without: {ALL_RULES})")
    ap.add_argument("--order", default="O1", help="the order families arrive in (O1, O2: the paper's two); a rule's "
                    "figures in another order than O1 are kept as RULE@ORDER")
    ap.add_argument("--first-from", type=Path, default=None,
                    help="a fresh bank of the same recipe to import the first family from (default: BANKS/fresh)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--config", type=Path, default=None,
                    help="a run config whose recipe, stream and base to use (default: the demo's; configs/compare.toml "
                         "is the same recipe in float32, as the method comparison trains)")
    ap.add_argument("--neutral-size", default=None, metavar="FAMILIESxPER_FAMILY",
                    help="the neutral start's training set (default: skillbank.memory.neutral's 20x10); the rule's "
                         "figures are then kept as neutral-FxP")
    ap.add_argument("--evaluate", action="append", default=[], metavar="NAME=BANK",
                    help="also evaluate a bank made elsewhere (e.g. the demo's, runs/demo/methods/fsm/bank) under NAME, "
                         "learning nothing; its routed figures are its own router's")
    ap.add_argument("--scope-encoder", default=None, choices=["none"],
                    help="none: banks with word statistics alone and the lexical Address Memory (no sentence "
                         "encoder needed, as on a machine without the MiniLM wheel)")
    args = ap.parse_args()

    from skillbank.config import RunConfig, packaged_config
    from skillbank.data.builtin import build_builtin_stream
    from skillbank.memory.lineage import EARLIER_SHARD_RULES

    run = RunConfig.from_toml(args.config or packaged_config("demo"))
    scope_params = {"encoder": None} if args.scope_encoder == "none" else None
    neutral_name = "neutral"
    if args.neutral_size:
        from skillbank.memory import neutral
        try:
            families, per_family = (int(n) for n in args.neutral_size.lower().split("x"))
        except ValueError:
            ap.error(f"--neutral-size takes FAMILIESxPER_FAMILY, e.g. 50x20; got {args.neutral_size!r}")
        neutral.NEUTRAL_FAMILIES, neutral.PER_FAMILY = families, per_family  # both are part of the cache key
        neutral_name = f"neutral-{families}x{per_family}"
    stream = build_builtin_stream(seed=run.stream.seed, train_per_family=run.stream.train_per_family,
                                  test_per_family=run.stream.test_per_family)
    report = {"recipe": run.name, "families": stream.family_keys, "rules": {}}
    if args.json and args.json.is_file():
        report["rules"] = json.loads(args.json.read_text()).get("rules", {})

    def record(key: str, row: dict) -> None:
        report["rules"][key] = row
        print(f"[{key}] macro EM routed {row['routed_macro']}, oracle {row['oracle_macro']}; hand-written dev "
              f"{row['handwritten_dev']['em']} (Oracle {row['handwritten_dev']['oracle_em']}; "
              f"n={row['handwritten_dev']['n']}); per family oracle {row['oracle']}", flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1) + "\n")

    for spec in args.evaluate:
        name, sep, bank_path = spec.partition("=")
        if not sep or not (Path(bank_path) / "bank.json").is_file():
            ap.error(f"--evaluate takes NAME=BANK with a bank at BANK; got {spec!r}")
        record(name, evaluate(Path(bank_path), stream, args.batch_size))
    fresh = args.first_from or args.banks / "fresh"
    rules = args.rules or ("" if args.evaluate else ALL_RULES)
    for rule in (r for r in rules.split(",") if r):
        name = neutral_name if rule == "neutral" else rule
        path = args.banks / name
        if not (path / "bank.json").is_file():
            first_from = fresh if rule in EARLIER_SHARD_RULES and (fresh / "bank.json").is_file() else None
            make_bank(path, rule, run, stream, first_from, args.order, scope_params)
        key = name if args.order == "O1" else f"{name}@{args.order}"
        row = evaluate(path, stream, args.batch_size)
        row["order"] = stream.order(args.order)
        record(key, row)


if __name__ == "__main__":
    main()
