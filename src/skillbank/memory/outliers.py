"""Outlier exposure for the scope gate: a linear discriminant between the requests a bank has learned and a
corpus of requests no skill serves.

The gate's other experts only describe what the learned families look like (their words, their mean
sentence embedding), so anything close enough to them passes, including a request that names a family's
objects but asks for something else. Teaching the gate what lies outside as well (outlier exposure, Hendrycks
et al., 2019) gives it a direction in embedding space that separates the two. The outside is a corpus of
hand-written requests shipped with skillbank (``resources/outliers/requests.jsonl``: general questions,
chit-chat, advice, code and maths, talk about the assistant itself, other languages, and other services'
tool requests), written without sight of the evaluation sets.

The discriminant is Fisher's (LDA with two classes and shrinkage), fitted from sufficient statistics: each
family's embedding count, sum and sum of squares (its own scatter is kept diagonal; see ScopeDetector), and the
corpus's embeddings. A family's statistics are sums over its own requests, so learning adds them, ``forget``
subtracts them exactly, and no request is kept.
The solve is a few lines of numpy on (d, d) matrices: scikit-learn's LinearDiscriminantAnalysis needs the
samples themselves, which a replay-free memory does not keep.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np

from skillbank.errors import ScopeError

#: The shipped corpus.
OUTLIER_CORPUS = "builtin"
#: Folds over the corpus: each corpus request is scored by a discriminant that did not see it, so the
#: threshold can be set on how often requests like those are refused (see :func:`out_of_fold_scores`).
FOLDS = 5
#: Embeddings of fixed texts kept in the cache's outliers/ folder (the corpus: 1.5 MB; a family's negatives:
#: ~0.1 MB); the least recently used go first.
EMBEDDINGS_KEPT = 512


def corpus_path(name: str = OUTLIER_CORPUS) -> Path:
    """The corpus file: the shipped one, or a JSONL file of ``{"request": ...}`` lines."""
    if name == OUTLIER_CORPUS:
        return Path(str(resources.files("skillbank") / "resources" / "outliers" / "requests.jsonl"))
    return Path(name)


def read_corpus(name: str = OUTLIER_CORPUS) -> tuple[list[str], list[str]]:
    """The corpus's requests and their categories ("" where a line has none); a line that is not a JSON object
    with a non-empty "request" (and, if present, a string "category") is an error naming the file and line."""
    path = corpus_path(name)
    if not path.is_file():
        raise ScopeError(f"outlier corpus {path} not found")
    requests, categories = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScopeError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("request"), str) or not row["request"].strip():
            raise ScopeError(f"{path}:{n}: expected an object with a non-empty \"request\"")
        if not isinstance(row.get("category", ""), str):
            raise ScopeError(f"{path}:{n}: \"category\" must be a string")
        requests.append(row["request"])
        categories.append(row.get("category", "").strip())
    if len(requests) < 2 * FOLDS:
        raise ScopeError(f"{path}: {len(requests)} requests; the outlier corpus needs at least {2 * FOLDS}")
    return requests, categories


def load_corpus(name: str = OUTLIER_CORPUS) -> list[str]:
    """The corpus's requests (:func:`read_corpus` without the categories)."""
    return read_corpus(name)[0]


def cached_embeddings(texts: list[str], encoder_digest: str, embed: Callable[[list[str]], np.ndarray]
                      ) -> np.ndarray:
    """``embed(texts)`` as float32, kept in the skillbank cache under the encoder's and the texts' digests:
    every new bank embeds the same corpus, and a few seconds of it per bank add up (in tests above all)."""
    from skillbank.cache import cache_root, keep_newest, used, written_aside
    key = hashlib.sha256((encoder_digest + "\n" + "\n".join(texts)).encode("utf-8")).hexdigest()[:24]
    path = cache_root() / "outliers" / f"{key}.npy"
    if path.is_file():
        try:
            cached = np.load(path)
            if cached.shape[0] == len(texts):
                used(path)
                return cached
        except (OSError, ValueError):
            pass  # a damaged cache file is recomputed and replaced
    embeddings = np.asarray(embed(texts), dtype=np.float32)
    with written_aside(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, embeddings)
    # the corpus once per encoder, and each family's negatives once per version of them
    keep_newest(path.parent, "?" * 24 + ".npy", EMBEDDINGS_KEPT)
    return embeddings


@dataclass
class Moments:
    """Count, sum and second moment of a set of embeddings: what the discriminant needs of them."""
    count: float
    total: np.ndarray  # (d,)
    moment: np.ndarray  # (d, d)

    @classmethod
    def of(cls, X: np.ndarray) -> "Moments":
        X = np.asarray(X, dtype=np.float64)
        return cls(float(len(X)), X.sum(axis=0), X.T @ X)

    def __add__(self, other: "Moments") -> "Moments":
        return Moments(self.count + other.count, self.total + other.total, self.moment + other.moment)

    def __sub__(self, other: "Moments") -> "Moments":
        return Moments(self.count - other.count, self.total - other.total, self.moment - other.moment)

    def mean(self) -> np.ndarray:
        return self.total / self.count

    def scatter(self) -> np.ndarray:
        """Sum of (x - mean)(x - mean)^T."""
        return self.moment - np.outer(self.total, self.total) / self.count


def families_moments(counts, totals, squares) -> Moments:
    """The moments of several families' embeddings together, from each family's count, sum and sum of squares
    alone: the spread between the family means is exact (sum of t t' / n), each family's own scatter is cut to
    its diagonal (squares - t^2 / n), so a family keeps d numbers instead of a (d, d) second moment."""
    totals = [np.asarray(t, dtype=np.float64) for t in totals]
    d = len(totals[0])
    moment = np.zeros((d, d))
    for n, t, sq in zip(counts, totals, squares):
        moment += np.outer(t, t) / n
        moment[np.diag_indices(d)] += np.asarray(sq, dtype=np.float64) - t * t / n
    return Moments(float(sum(counts)), np.sum(totals, axis=0), moment)


def discriminant(inside: Moments, outside: Moments, shrinkage: float) -> tuple[np.ndarray, float]:
    """(w, b): ``X @ w + b`` is the log-odds that a request is inside, under two Gaussians with one shared
    covariance (pooled within-class, shrunk towards a multiple of the identity) and equal priors."""
    if inside.count < 2 or outside.count < 2:
        raise ScopeError("the outlier discriminant needs at least two requests on each side")
    d = len(inside.total)
    cov = (inside.scatter() + outside.scatter()) / (inside.count + outside.count - 2)
    cov = (1 - shrinkage) * cov + shrinkage * np.trace(cov) / d * np.eye(d)
    mu_in, mu_out = inside.mean(), outside.mean()
    w = np.linalg.solve(cov, mu_in - mu_out)
    return w, float(-0.5 * (mu_in + mu_out) @ w)


def corpus_groups(categories: list[str] | None, n: int) -> list[tuple[str, np.ndarray]]:
    """The corpus's parts that get a discriminant each, as (name, indices into the corpus): one per category of
    at least ``2 * FOLDS`` requests, the smaller categories pooled (named together; joining the largest part if
    still smaller); the whole corpus, named "", when it has no categories. The outside is several clusters
    (questions, chit-chat, other services' tool requests, prompt injections ...): one Gaussian over all of them
    sits between them, where nothing is."""
    if not categories or len(set(categories)) < 2:
        return [("", np.arange(n))]
    cats = np.asarray(categories)
    names, sizes = np.unique(cats, return_counts=True)
    groups = [(str(c), np.flatnonzero(cats == c)) for c, size in zip(names, sizes) if size >= 2 * FOLDS]
    few = names[sizes < 2 * FOLDS]
    small = np.flatnonzero(np.isin(cats, few))
    if len(small) >= 2 * FOLDS or (len(small) and not groups):
        groups.append(("+".join(str(c) or "(none)" for c in few), small))
    elif len(small):
        big = int(np.argmax([len(idx) for _, idx in groups]))
        groups[big] = (groups[big][0], np.sort(np.concatenate([groups[big][1], small])))
    return groups


def folds(n: int) -> np.ndarray:
    """Fold of each request of a corpus part (fixed: round robin, so a refit gives the same folds)."""
    return np.arange(n) % FOLDS


def out_of_fold_scores(inside: Moments, corpus: np.ndarray, shrinkage: float) -> np.ndarray:
    """Each corpus request's log-odds under a discriminant fitted without its fold."""
    fold = folds(len(corpus))
    everything = Moments.of(corpus)
    out = np.empty(len(corpus))
    for k in range(FOLDS):
        held = fold == k
        w, b = discriminant(inside, everything - Moments.of(corpus[held]), shrinkage)
        out[held] = corpus[held] @ w + b
    return out


def group_discriminants(inside: Moments, corpus: np.ndarray, groups: list[tuple[str, np.ndarray]], shrinkage: float
                        ) -> tuple[list[tuple[np.ndarray, float, float]], np.ndarray]:
    """One discriminant per corpus part, each as (w, b, half) with ``(X @ w + b) / half`` at +1 for the
    families' mean and -1 for the part's; and every corpus request's score, the least over the parts (how much
    it looks like the closest part), each request read by its own part's discriminant out of fold (the others
    never saw it)."""
    discs, per_part = [], np.empty((len(corpus), len(groups)))
    for j, (_, idx) in enumerate(groups):
        part = corpus[idx]
        w, b = discriminant(inside, Moments.of(part), shrinkage)
        half = 0.5 * float((inside.mean() - part.mean(axis=0)) @ w)
        discs.append((w, b, half))
        per_part[:, j] = (corpus @ w + b) / half
        per_part[idx, j] = out_of_fold_scores(inside, part, shrinkage) / half
    return discs, per_part.min(axis=1)
