"""Which evidence separates hand-written in-domain requests from off-domain ones? The scope detector's two
experts apart and together: word statistics against general English, the cosine similarity of a frozen
sentence encoder's embedding (all-MiniLM-L6-v2) to each family's mean training embedding, and the mean of
both standardised scores (the detector's default). All fitted on a stream's training requests only, as a
bank learning the stream would hold them.

    python scripts/scope_evidence.py --stream runs/streams/builtin-200-50 \
        --records tests/fixtures/paraphrase_builtin.jsonl --offdomain tests/fixtures/offdomain.jsonl \
        --records tests/fixtures/paraphrase_builtin_holdout.jsonl --offdomain tests/fixtures/offdomain_holdout.jsonl

The i-th --records set is paired with the i-th --offdomain set. Per pair and score it prints the area under
the ROC curve (in-domain above off-domain: how well the score separates them whatever the threshold) and
what the score's own threshold keeps and refuses: the detector's quantile of its training requests'
leave-one-out scores (how well template training requests calibrate it). ~1 minute on 2 CPU cores.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from skillbank.data.records import iter_jsonl, read_records
from skillbank.data.stream import Stream
from skillbank.experiments.scope import detector_for_stream


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

    det = detector_for_stream(stream, outliers=None)  # words and the sentence embedding, both

    def kept_scores(per_family: dict) -> np.ndarray:
        values = np.concatenate([per_family[k] for k in det.classes_])
        return values[~np.isnan(values)]  # a family's only request has no leave-one-out embedding score

    scores = {"words alone": (lambda reqs: det.word_scores(reqs).max(axis=1), kept_scores(det.train_scores_)),
              "sentence embedding alone": (lambda reqs: det.embedding_scores(reqs).max(axis=1),
                                           kept_scores(det.train_embedding_scores_)),
              "both (the detector's default)": (lambda reqs: det.score(reqs).max(axis=1), None)}
    print(f"| pair | score | ROC AUC | kept at its {det.quantile:.0%} training quantile | refused |")
    print("|---|---|---|---|---|")
    for inside, outside, name in pairs:
        for label, (score, train_scores) in scores.items():
            s_in, s_out = score(inside), score(outside)
            threshold = det.threshold_ if train_scores is None else np.quantile(train_scores, det.quantile)
            # a request with no words scores -inf: the lowest possible rank, which is what AUC needs
            both = np.nan_to_num(np.r_[s_in, s_out].astype(np.float64), neginf=-1e300)
            auc = roc_auc_score(np.r_[np.ones(len(s_in)), np.zeros(len(s_out))], both)
            print(f"| {name} | {label} | {auc:.3f} | {np.mean(s_in >= threshold):.1%} | {np.mean(s_out < threshold):.1%} |")


if __name__ == "__main__":
    main()
