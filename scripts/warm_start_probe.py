"""Would FSM's executors learn better if each started from the previous family's executor?

In the comparison, Progressive-LoRA routed by the Address Memory beats FSM by 5-6 macro EM points with the same
router and data: family j's adapter is trained on top of the frozen adapters 1..j-1, and later families gain.
This probe asks whether a cheaper form of that transfer - a new executor initialised from the previous one's
weights, then trained on its own family's requests only, one adapter per plan as in FSM - brings the same gain.

For a chain of families (default: the built-in O1 order's first three), it trains each executor after the first
from the previous one's weights (the first is the bank's own shard), with the bank's recipe for that family, and
measures each with its gold family forced (Oracle EM, constrained decoding) against the bank's own executor on
the same held-out requests. Nothing in the bank is written: the warm-started weights replace the shard's only in
memory, for the measurement.

    .venv/bin/python scripts/warm_start_probe.py --bank runs/compare-cpu/methods/fsm/bank \\
        --stream runs/streams/builtin-200-50 [--family t1_daily_life --family t2_language_speech ...]

Why a script: it is one measurement for the planning side, not a method of the harness (yet).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from skillbank.continual.stage_cache import under_stored_name
from skillbank.data.stream import Stream
from skillbank.graph import TaskGraph
from skillbank.memory.bank import SkillBank
from skillbank.metrics import score_example
from skillbank.train.executor import TrainConfig, add_lora, build_examples
from skillbank.train.loop import adapter_parameters, fit


def lora_tensors(model, adapter: str) -> dict[str, torch.Tensor]:
    """Every LoRA weight of ``adapter``, keyed by a name that no longer says which adapter (so two match)."""
    return under_stored_name(adapter_parameters(model, adapter), adapter)


def oracle_em(bank: SkillBank, family: str, records) -> float:
    # Mixed-shard batches read stacked copies of the LoRA weights, which follow adapters added or removed but
    # not weights edited in place (as here): drop them so this measurement reads the weights as they are now.
    bank.execution.base._stacked = None
    plans = bank.plan([r.request for r in records], shard=family, batch_size=16)
    return sum(score_example(r.graph, TaskGraph.from_dict(p.graph) if p.graph else None).graph_em
               for p, r in zip(plans, records)) / len(records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--family", action="append", help="The chain, in order (default: O1's first three).")
    ap.add_argument("--out", help="Write the measurements as JSON here.")
    args = ap.parse_args()
    stream = Stream.load(args.stream)
    chain = args.family or stream.order("O1")[:3]
    bank = SkillBank.open(args.bank)
    base = bank.execution.base
    entries = {e.name: e for e in bank.manifest.shards}
    rows = []
    previous = chain[0]
    bank.execution.ensure_resident(chain)
    for family in chain[1:]:
        entry = entries[family]
        cfg = TrainConfig.from_dict(entry.training["config"])
        reference = oracle_em(bank, family, stream.test[family])
        examples, _ = build_examples(base, stream.train[family], cfg, entry.family_prefix)
        warm = f"warm-{family}"
        add_lora(base, warm, cfg)
        source, target = lora_tensors(base.peft, previous), lora_tensors(base.peft, warm)
        with torch.no_grad():
            for key, tensor in target.items():
                tensor.copy_(source[key])
        t0 = time.perf_counter()
        fit(base, examples, cfg, adapter=warm, seed=cfg.seed, progress=True, desc=f"{family} from {previous}")
        seconds = time.perf_counter() - t0
        # measure through the bank's own path (its grammar, prompt and decoding): the shard's weights, in memory only
        shard = lora_tensors(base.peft, family)
        saved = {k: v.detach().clone() for k, v in shard.items()}
        with torch.no_grad():
            for key, tensor in shard.items():
                tensor.copy_(target[key])
        warmed = oracle_em(bank, family, stream.test[family])
        rows.append({"family": family, "initialised_from": previous, "oracle_em_fsm": reference,
                     "oracle_em_warm_start": warmed, "train_seconds": round(seconds, 1), "n": len(stream.test[family])})
        print(json.dumps(rows[-1]), flush=True)
        previous = warm  # the chain continues from the warm-started executor
        with torch.no_grad():  # the next family's reference must be the bank's, so nothing else changes
            for key, tensor in shard.items():
                tensor.copy_(saved[key])
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"bank": args.bank, "stream": args.stream, "chain": chain, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
