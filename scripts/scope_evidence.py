"""Which evidence separates hand-written in-domain requests from off-domain ones? The scope detector's word
statistics against a frozen sentence encoder's (all-MiniLM-L6-v2, as the embedding router loads it): cosine
similarity to each family's mean training embedding. Both are fitted on a stream's training requests only.

    python scripts/scope_evidence.py --stream runs/streams/builtin-200-50 \
        --records tests/fixtures/paraphrase_builtin.jsonl --offdomain tests/fixtures/offdomain.jsonl \
        --records tests/fixtures/paraphrase_builtin_holdout.jsonl --offdomain tests/fixtures/offdomain_holdout.jsonl

The i-th --records set is paired with the i-th --offdomain set. Per pair and score it prints the area under
the ROC curve (in-domain above off-domain: how well the score separates them whatever the threshold) and
what each score's own 1% training quantile keeps and refuses (how well its training requests calibrate it).
A per-family mean embedding is a statistic, not a request, so a detector built on it stays replay-free.
Embedding the requests costs ~1 minute on 2 CPU cores.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from skillbank.data.records import iter_jsonl, read_records
from skillbank.data.stream import Stream
from skillbank.report.scope import detector_for_stream

QUANTILE = 0.01


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream", type=Path, required=True)
    ap.add_argument("--records", type=Path, action="append", required=True)
    ap.add_argument("--offdomain", type=Path, action="append", required=True)
    args = ap.parse_args()
    if len(args.records) != len(args.offdomain):
        ap.error("give one --offdomain set per --records set (they are paired in order)")
    stream = Stream.load(args.stream)
    pairs = [([r.request for r in read_records(rec).records], [obj["request"] for _, obj in iter_jsonl(off)],
              f"{rec.stem} vs {off.stem}") for rec, off in zip(args.records, args.offdomain)]

    words = detector_for_stream(stream)
    word_train = np.concatenate([words.train_scores_[k] for k in words.classes_])

    from skillbank.memory.selectors.embedding import get_encoder
    encoder = get_encoder()
    train = {k: encoder.encode([r.request for r in stream.train[k]]) for k in stream.family_keys}
    means = np.stack([train[k].mean(axis=0) for k in stream.family_keys])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    # In-sample for the training requests (a request is 1 of 200 in its family's mean: the difference is small)
    embed_train = (np.concatenate(list(train.values())) @ means.T).max(axis=1)

    scores = {"words (the scope detector)": (lambda reqs: words.score(reqs).max(axis=1), word_train),
              "MiniLM cosine to family mean": (lambda reqs: (encoder.encode(reqs) @ means.T).max(axis=1), embed_train)}
    print(f"| pair | score | ROC AUC | kept at its {QUANTILE:.0%} training quantile | refused |")
    print("|---|---|---|---|---|")
    for inside, outside, name in pairs:
        for label, (score, train_scores) in scores.items():
            s_in, s_out = score(inside), score(outside)
            threshold = np.quantile(train_scores, QUANTILE)
            # a request with no words scores -inf: the lowest possible rank, which is what AUC needs
            both = np.nan_to_num(np.r_[s_in, s_out].astype(np.float64), neginf=-1e300)
            auc = roc_auc_score(np.r_[np.ones(len(s_in)), np.zeros(len(s_out))], both)
            print(f"| {name} | {label} | {auc:.3f} | {np.mean(s_in >= threshold):.1%} | {np.mean(s_out < threshold):.1%} |")


if __name__ == "__main__":
    main()
