"""Which structured-generation library: llguidance vs xgrammar on the same shard grammars, measured.

For each built-in family and both target formats, the family's grammar (``skillbank.model.constrain``,
rendered as Lark for llguidance and as EBNF for xgrammar) is compiled with the embedded base's tokenizer,
then the gold outputs of --records held-out records are replayed token by token as a decoder would (the one
whole-plan grammar for both, not the plan-prefix grammars the local decoder follows with llguidance): fill
the row's allowed-token bitmask, consume the token. Prints the one-off tokenizer conversion, compile time
per grammar, and the mean bitmask time per generated token (what constrained decoding adds to each step),
and checks every gold output stays inside its grammar under both libraries. No model runs.

    .venv/bin/pip install -e '.[grammar-bench]'      # xgrammar (and triton) are not installed by default
    .venv/bin/python bench/grammar_backends.py [--records 40]
"""
from __future__ import annotations

import argparse
import time

from transformers import AutoTokenizer

from skillbank.data.builtin import build_builtin_stream
from skillbank.model.base import embedded_tokenizer_dir
from skillbank.model.constrain import BACKENDS, GrammarCache, SkillSpec, build_grammar
from skillbank.model.prompts import stop_token_ids
from skillbank.model.serialization import encode
from skillbank.train.executor import common_prefix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=40, help="gold outputs replayed per family")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    stops = stop_token_ids(tok)
    stream = build_builtin_stream(seed=0, train_per_family=10, test_per_family=args.records)
    summary = {}
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        raise SystemExit("xgrammar is not installed: .venv/bin/pip install -e '.[grammar-bench]'")
    for backend in BACKENDS:
        cache = GrammarCache(tok, stops, len(tok), backend)
        print(f"{backend}: tokenizer converted in {cache.tokenizer_seconds:.2f} s")
        for fmt in ("compact", "json"):
            compile_s, mask_s, tokens, rejected = [], 0.0, 0, 0
            for family in stream.family_keys:
                ids = stream.catalog.family(family).skills
                prefix = common_prefix(sorted(ids))
                grammar = build_grammar([SkillSpec(s, stream.catalog.skills[s].argument_names) for s in ids], fmt,
                                        prefix)
                cache.compile(grammar)
                compile_s.append(cache.compile_seconds[grammar.digest])
                bitmask = cache.bitmask(1)
                for r in stream.test[family]:
                    matcher = cache.matcher(grammar, plan_prefixes=False)  # the same grammar for both
                    for t in tok(encode(r.graph, fmt, prefix), add_special_tokens=False)["input_ids"] + [stops[0]]:
                        t0 = time.perf_counter()
                        matcher.fill(bitmask, 0)
                        mask_s += time.perf_counter() - t0
                        tokens += 1
                        if not matcher.consume(t):
                            rejected += 1
                            break
            summary[(backend, fmt)] = (max(compile_s), 1000 * mask_s / tokens)
            print(f"  {fmt:8s} compile per family {1000 * min(compile_s):6.1f}-{1000 * max(compile_s):6.1f} ms, "
                  f"bitmask {1000 * mask_s / tokens:6.3f} ms/token over {tokens} tokens, gold outputs rejected: "
                  f"{rejected}")
    for fmt in ("compact", "json"):
        (lc, lm), (xc, xm) = summary[("llguidance", fmt)], summary[("xgrammar", fmt)]
        print(f"{fmt}: xgrammar / llguidance - slowest compile {xc / lc:.1f}x, bitmask per token {xm / lm:.1f}x")


if __name__ == "__main__":
    main()
