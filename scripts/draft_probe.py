"""Which drafts speed up the llama.cpp engine's plans? (the experiment behind the engine's rule; docs/decoding.md)

Plans the bank's hand-written requests at batch 1 and 16 with three draft rules, alternating rounds: no drafts,
the grammar's forced tokens only (the engine's rule), and forced tokens or else a lookup in the request (what
followed the row's last two tokens where they occur in its prompt: values are copied from the request, the
prompt-lookup drafts of transformers' ``prompt_lookup_num_tokens``). Prints tokens/s per rule.

    .venv/bin/python scripts/draft_probe.py runs/gate-bank
"""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import skillbank.model.llamacpp as LC  # noqa: E402
from latency import bank_requests  # noqa: E402
from skillbank.memory.bank import SkillBank  # noqa: E402


def main() -> None:
    os.environ["SKILLBANK_LANES"] = "1"  # one shard group at a time: the prompt bookkeeping below is not shared
    bank = SkillBank.open(sys.argv[1], engine="llama.cpp")
    requests = bank_requests(Path(sys.argv[1]))[:48]
    engine = bank.engine
    shards, _ = bank.route(requests)
    engine.generate(requests[:5], shards[:5], batch_size=1)  # every shard's merged model made and loaded once
    forced = LC.LlamaCppDecoder._draft

    def forced_or_lookup(self, row, room):
        draft = forced(self, row, room)
        room = min(room, LC.DRAFT_MAX, row.cap - len(row.tokens) - 1)
        key = row.tokens[-2:]
        if draft or room <= 0 or len(key) < 2:
            return draft
        prompt = prompts[id(row)]
        for i in range(len(prompt) - 3, -1, -1):  # the latest occurrence
            if prompt[i:i + 2] == key:
                return prompt[i + 2:i + 2 + room]
        return []

    prompts: dict = {}  # row -> its prompt, recorded as rows are made
    real_row = LC._Row.__init__

    def row_init(self, index, seq, pos, matcher, logits):
        real_row(self, index, seq, pos, matcher, logits)
        prompts[id(self)] = current[0][index] if current else []

    current: list = []
    real_many, real_one = LC.LlamaCppDecoder.decode_many, LC.LlamaCppDecoder.decode

    def decode_many(self, prompts_, *a, **k):
        current[:] = [list(prompts_)]
        return real_many(self, prompts_, *a, **k)

    def decode(self, prompt, *a, **k):
        current[:] = [[list(prompt)]]
        return real_one(self, prompt, *a, **k)

    LC._Row.__init__ = row_init
    LC.LlamaCppDecoder.decode_many, LC.LlamaCppDecoder.decode = decode_many, decode
    rules = {"none": lambda self, row, room: [], "forced": forced, "forced+lookup": forced_or_lookup}
    for round_ in range(2):
        for batch in (1, 16):
            for name, rule in rules.items():
                LC.LlamaCppDecoder._draft = rule
                t0 = time.perf_counter()
                outs = []
                for k in range(0, len(requests), batch):
                    outs += engine.generate(requests[k:k + batch], shards[k:k + batch], batch_size=batch)
                dt = time.perf_counter() - t0
                n = sum(o.n_tokens for o in outs)
                print(f"round {round_ + 1} batch {batch:2d} drafts {name:14s} {n} tokens {dt:6.2f} s "
                      f"{n / dt:6.1f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
