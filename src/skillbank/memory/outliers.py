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


def corpus_path(name: str = OUTLIER_CORPUS) -> Path:
    """The corpus file: the shipped one, or a JSONL file of ``{"request": ...}`` lines."""
    if name == OUTLIER_CORPUS:
        return Path(str(resources.files("skillbank") / "resources" / "outliers" / "requests.jsonl"))
    return Path(name)


def load_corpus(name: str = OUTLIER_CORPUS) -> list[str]:
    """The corpus's requests; a line that is not a JSON object with a non-empty "request" is an error naming
    the file and line."""
    path = corpus_path(name)
    if not path.is_file():
        raise ScopeError(f"outlier corpus {path} not found")
    requests = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScopeError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("request"), str) or not row["request"].strip():
            raise ScopeError(f"{path}:{n}: expected an object with a non-empty \"request\"")
        requests.append(row["request"])
    if len(requests) < 2 * FOLDS:
        raise ScopeError(f"{path}: {len(requests)} requests; the outlier corpus needs at least {2 * FOLDS}")
    return requests


def cached_embeddings(texts: list[str], encoder_digest: str, embed: Callable[[list[str]], np.ndarray]
                      ) -> np.ndarray:
    """``embed(texts)`` as float32, kept in the skillbank cache under the encoder's and the texts' digests:
    every new bank embeds the same corpus, and a few seconds of it per bank add up (in tests above all)."""
    from skillbank.cache import cache_root, written_aside
    key = hashlib.sha256((encoder_digest + "\n" + "\n".join(texts)).encode("utf-8")).hexdigest()[:24]
    path = cache_root() / "outliers" / f"{key}.npy"
    if path.is_file():
        try:
            cached = np.load(path)
            if cached.shape[0] == len(texts):
                return cached
        except (OSError, ValueError):
            pass  # a damaged cache file is recomputed and replaced
    embeddings = np.asarray(embed(texts), dtype=np.float32)
    with written_aside(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, embeddings)
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


def folds(n: int) -> np.ndarray:
    """Fold of each corpus request (fixed: round robin, so a refit gives the same folds)."""
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
