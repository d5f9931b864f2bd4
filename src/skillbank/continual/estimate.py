"""How long a run will take on this machine, told before it trains: a few optimizer steps of its recipe timed here.

The demo takes 10 minutes on one CPU and 50 on another (AVX-512 with native bfloat16 against AVX2 in float32, and
how many cores it got). So before the first stage trains, :func:`estimate_run` builds every stage's training
examples (tokenizing is cheap), trains :data:`TIMED_EXAMPLES` of the first family's examples for one epoch on a
throwaway adapter - the run's own recipe, dtype and threads -, and extrapolates from that rate to every stage's
tokens and epochs. Evaluation is priced from the batch-16 decoding rate llama.cpp measured on this machine
(:mod:`skillbank.model.encoding_choice`), or left out of the figure where the run evaluates on torch.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

TIMED_EXAMPLES = 24  # three batches of the demo's 8: past the first step's warm-up, ~10-30 s on 2 cores
EVAL_TOKENS_PER_REQUEST = 45  # a compact plan of the built-in stream, with its stop token (the demo's outputs)


@dataclass
class RunEstimate:
    tokens_per_second: float  # training, measured here
    training_tokens: int  # every stage's examples times its epochs
    training_seconds: float
    eval_requests: int
    eval_seconds: float | None  # None: not priced (the run evaluates with torch)
    timed_seconds: float  # what the estimate itself cost
    threads: int

    def text(self) -> str:
        total = self.training_seconds + (self.eval_seconds or 0.0)
        evaluation = (f" + decoding ~{self.eval_requests} held-out plans ~{self.eval_seconds / 60:.0f} min"
                      if self.eval_seconds is not None else f" + decoding ~{self.eval_requests} held-out plans (not priced)")
        return (f"estimate for this CPU: ~{total / 60:.0f} min (training {self.training_tokens:,} tokens at "
                f"{self.tokens_per_second:.0f} tokens/s on {self.threads} threads ~{self.training_seconds / 60:.0f} "
                f"min{evaluation}; timed from {TIMED_EXAMPLES} training examples in {self.timed_seconds:.0f} s)")


def estimate_run(cfg, stream, engine: str, encoding: str) -> RunEstimate:
    """The estimate of a run of ``cfg`` over ``stream`` that trains each family once (FSM; the other methods
    train about as much) and evaluates every seen family's held-out requests after every stage."""
    import torch

    from skillbank.model.base import load_base
    from skillbank.train import loop
    from skillbank.train.executor import add_lora, build_examples, common_prefix

    t0 = time.perf_counter()
    train_cfg = cfg.train_config()
    base = load_base(cfg.base_config(), progress=False)
    tokens = 0
    first = None
    for t, family in enumerate(stream.family_keys):
        records = stream.train[family]
        prefix = common_prefix(sorted({s for r in records for s in r.graph.tasks}))
        examples = build_examples(base, records, train_cfg, prefix)[0]
        epochs = train_cfg.epochs if t == 0 else train_cfg.warm().epochs  # later stages start warm (merged start)
        tokens += epochs * sum(len(ex.input_ids) for ex in examples)
        first = first if first is not None else examples
    timed = dataclasses.replace(train_cfg, epochs=1)
    add_lora(base, "__estimate__", timed)
    try:
        result = loop.fit(base, first[:TIMED_EXAMPLES], timed, adapter="__estimate__", progress=False)
    finally:
        base.remove_adapter("__estimate__")
    rate = result.total_tokens / max(result.wall_seconds, 1e-9)
    # Each family's held-out requests are decoded about once: a frozen shard's outputs are reused by every later
    # evaluation (routed and Oracle-routed alike) and only requests routed elsewhere are decoded again.
    eval_requests = sum(len(stream.test[f]) for f in stream.family_keys)
    eval_seconds = None
    if engine == "llama.cpp":
        from skillbank.model.encoding_choice import measured_choice

        choice = measured_choice(torch.get_num_threads())
        decode_rate = choice.tokens_per_s.get(encoding, {}).get(16)
        if decode_rate:
            eval_seconds = eval_requests * EVAL_TOKENS_PER_REQUEST / decode_rate
    return RunEstimate(tokens_per_second=rate, training_tokens=tokens, training_seconds=tokens / rate,
                       eval_requests=eval_requests, eval_seconds=eval_seconds,
                       timed_seconds=time.perf_counter() - t0, threads=torch.get_num_threads())
