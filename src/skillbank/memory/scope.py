"""Scope: does any learned family cover this request at all? Part of the Address Memory.

A router always picks *some* shard: "what is the capital of France?" goes to whichever family shares the
most words with it, and the executor, constrained to that family's skills, writes a confident plan for a
request no skill covers. The scope detector answers the question the router cannot: is the request
better explained by a learned family than by ordinary English?

Score (per family ``c``, summed over the request's words ``w``)::

    s_c(x) = sum_w log( lam * p(w | c) / p_bg(w) + (1 - lam) )

``p(w | c)`` is the family's word distribution (hashed unigram counts of its training requests, plus the
words of its catalog: skill names, descriptions, argument names), ``p_bg(w)`` is the word's frequency in
general English (the ``wordfreq`` package), and the mixture with ``1 - lam`` is Jelinek-Mercer smoothing.
A word that ordinary English explains as well as the family adds ~0 ("please", "the", "could you"); a
word the family never uses costs ``log(1 - lam)``; a word far more frequent in the family than in
English ("transcribe", "thermostat") adds a lot. It is a likelihood ratio against a background model,
the usual open-set test of speaker verification and out-of-domain text detection. The request's score is
``max_c s_c(x)``; below the threshold it is out of scope.

The threshold is chosen on the training requests themselves: each request's leave-one-out score (its
own counts removed from its family, exact for counts) is kept, and the threshold is their
``quantile`` (1% by default: the fraction of training requests the detector would refuse). The kept
scores are numbers, not requests, and every statistic is additive per family, so a family is forgotten
exactly by dropping its row and its scores.

Limits (measured in the README section "Requests no skill covers"): bag-of-words evidence cannot tell
"check me in for my flight" (no such skill) from "book me a flight" (a skill); hand-written requests in
styles far from the training requests score lower than template ones.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import HashingVectorizer

from skillbank.errors import SelectorError
from skillbank.jsonfile import read_json

SCOPE_FORMAT = 1
SCOPE_FILE = "scope.json"
SCOPE_ARRAYS = "scope.npz"
# Words missing from the background list (file names, codes, misspellings) are rarer than anything in it.
BACKGROUND_FLOOR = 1e-9


@lru_cache(maxsize=4)
def background(n_features: int, language: str = "en") -> np.ndarray:
    """General-language word probabilities hashed into ``n_features`` buckets (wordfreq's "large" list)."""
    import wordfreq
    words = wordfreq.get_frequency_dict(language, wordlist="large")
    vec = _vectorizer(n_features)
    X = vec.transform(list(words))
    mass = np.asarray(X.T @ np.fromiter(words.values(), dtype=float, count=len(words))).ravel()
    mass /= mass.sum()
    return np.maximum(mass, BACKGROUND_FLOOR)


def _vectorizer(n_features: int) -> HashingVectorizer:
    # Unigrams only: the background list has no n-grams. Same tokenizer as the router (words of 2+ chars).
    return HashingVectorizer(n_features=n_features, alternate_sign=False, norm=None, ngram_range=(1, 1))


def catalog_text(specs: Sequence[dict]) -> list[str]:
    """The words a family's catalog says about its skills (name, description, argument names and
    descriptions), one pseudo-document per skill. A catalog is not a request, so learning from it keeps
    the Address Memory replay-free."""
    docs = []
    for s in specs:
        parts = [str(s.get("name") or s.get("id", "")).replace("_", " "), str(s.get("description", ""))]
        for a in s.get("arguments", ()):
            parts += [str(a.get("name", "")).replace("_", " "), str(a.get("description", ""))]
        docs.append(" ".join(p for p in parts if p))
    return [d for d in docs if d.strip()]


class ScopeDetector:
    """Out-of-scope detection from per-family word statistics (scikit-learn style, state in ``*_``).

    Parameters
    ----------
    lam : weight of the family model against general English in the mixture (0 < lam < 1).
    quantile : fraction of training requests (leave-one-out) the threshold refuses.
    n_features : hashing space of the word counts.
    language : wordfreq language of the background model.
    """

    def __init__(self, lam: float = 0.5, quantile: float = 0.01, n_features: int = 2**18, language: str = "en"):
        if not 0 < lam < 1:
            raise SelectorError(f"scope lam must be in (0, 1), got {lam!r}")
        if not 0 <= quantile < 0.5:
            raise SelectorError(f"scope quantile must be in [0, 0.5), got {quantile!r}")
        self.lam, self.quantile, self.n_features, self.language = float(lam), float(quantile), int(n_features), language
        self._vec = _vectorizer(self.n_features)
        self.classes_: list[str] = []
        self.counts_ = sp.csr_matrix((0, self.n_features))
        self.train_scores_: dict[str, np.ndarray] = {}
        # The background is saved with the state: scores must not move when wordfreq's lists are updated,
        # and hashing its 300k words costs seconds that a server's first request should not pay.
        self.background_: np.ndarray | None = None
        # Derived once per state and reset by every update (partial_fit, forget, add_family): scoring a request
        # must not redo work that grows with the number of families K.
        self._weights = None  # (n_features, n_classes) sparse log1p weights
        self._threshold = None  # quantile of every family's kept scores (K x requests values)

    def get_params(self) -> dict:
        return {"lam": self.lam, "quantile": self.quantile, "n_features": self.n_features, "language": self.language}

    # -- learning ----------------------------------------------------------------------------
    def partial_fit(self, requests: Sequence[str], label: str, catalog_docs: Sequence[str] = ()) -> "ScopeDetector":
        """Add one family's requests (and its catalog text). Their leave-one-out scores are kept for the
        threshold; the requests are not."""
        requests = list(requests)
        if not requests:
            raise SelectorError("scope partial_fit needs at least one request")
        if self.background_ is None:
            self.background_ = background(self.n_features, self.language).astype(np.float32)
        self._weights = self._threshold = None
        X = self._vec.transform(requests + list(catalog_docs)).tocsr()
        row = sp.csr_matrix(X.sum(axis=0))
        if label in self.classes_:
            i = self.classes_.index(label)
            self.counts_ = sp.vstack([self.counts_[:i], self.counts_[i] + row, self.counts_[i + 1:]]).tocsr()
        else:
            self.classes_.append(label)
            self.counts_ = sp.vstack([self.counts_, row]).tocsr()
        loo = self._family_scores(X[:len(requests)], self.classes_.index(label), leave_one_out=True)
        self.train_scores_[label] = np.concatenate([self.train_scores_.get(label, np.zeros(0)), loo])
        return self

    def forget(self, label: str) -> "ScopeDetector":
        """Remove a family exactly (its counts row and its training scores)."""
        if label not in self.classes_:
            raise SelectorError(f"scope detector has no family {label!r}")
        i = self.classes_.index(label)
        self.counts_ = sp.vstack([self.counts_[:i], self.counts_[i + 1:]]).tocsr()
        self.classes_.pop(i)
        self._weights = self._threshold = None
        self.train_scores_.pop(label, None)
        return self

    def add_family(self, label: str, counts: sp.spmatrix, train_scores: np.ndarray) -> "ScopeDetector":
        """Add a family from statistics made elsewhere (an exported family): its counts row and kept scores."""
        if label in self.classes_:
            raise SelectorError(f"scope detector already has a family {label!r}")
        self.classes_.append(label)
        self.counts_ = sp.vstack([self.counts_, sp.csr_matrix(counts)]).tocsr()
        self.train_scores_[label] = np.asarray(train_scores)
        self._weights = self._threshold = None
        return self

    # -- reading -----------------------------------------------------------------------------
    @property
    def threshold_(self) -> float:
        if not self.train_scores_:
            raise SelectorError("scope detector has not learned any family yet")
        if self._threshold is None:
            self._threshold = float(np.quantile(np.concatenate(list(self.train_scores_.values())), self.quantile))
        return self._threshold

    def _family_scores(self, X: sp.csr_matrix, c: int, leave_one_out: bool = False) -> np.ndarray:
        bg = self.background_.astype(float)
        fam = self.counts_[c].toarray().ravel()
        total = fam.sum()
        out = np.full(X.shape[0], -np.inf)  # a request with no words is explained by nothing
        for i in range(X.shape[0]):
            idx, cnt = X.indices[X.indptr[i]:X.indptr[i + 1]], X.data[X.indptr[i]:X.indptr[i + 1]]
            if not len(idx):
                continue
            own, tot = fam[idx], total
            if leave_one_out:
                own, tot = own - cnt, total - cnt.sum()
            p_fam = own / tot if tot > 0 else np.zeros_like(own)
            out[i] = float(cnt @ np.log(self.lam * p_fam / bg[idx] + (1 - self.lam)))
        return out

    def score(self, requests: Sequence[str]) -> np.ndarray:
        """Per request and family, shape (n_requests, n_classes), columns in ``classes_`` order."""
        if not self.classes_:
            raise SelectorError("scope detector has not learned any family yet")
        X = self._vec.transform(list(requests)).tocsr()
        if self._weights is None:
            # log(lam p/bg + 1 - lam) = log(1 - lam) + log1p(lam p / ((1 - lam) bg)): the log1p part is zero
            # wherever the family never saw the word, so one sparse product scores every family at once.
            bg = self.background_.astype(float)
            counts = self.counts_.tocsr().astype(float)
            totals = np.asarray(counts.sum(axis=1)).ravel()
            weights = counts.multiply(1.0 / np.maximum(totals, 1e-300)[:, None]).tocsr()
            weights.data = np.log1p(self.lam * weights.data / ((1 - self.lam) * bg[weights.indices]))
            self._weights = weights.T.tocsr()
        n_words = np.asarray(X.sum(axis=1)).ravel()
        scores = np.asarray((X @ self._weights).todense()) + np.log(1 - self.lam) * n_words[:, None]
        scores[n_words == 0] = -np.inf  # a request with no words is explained by nothing
        return scores

    def decision_function(self, requests: Sequence[str]) -> np.ndarray:
        """The request's best family score minus the threshold: negative means out of scope."""
        return self.score(requests).max(axis=1) - self.threshold_

    def predict(self, requests: Sequence[str]) -> np.ndarray:
        """True where some learned family covers the request."""
        return self.decision_function(requests) >= 0

    # -- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        c = self.counts_.tocsr()
        arrays = {"data": c.data, "indices": c.indices, "indptr": c.indptr}
        arrays.update({f"loo_{i}": self.train_scores_[k] for i, k in enumerate(self.classes_)})
        if self.background_ is not None:
            arrays["background"] = self.background_
        np.savez(directory / SCOPE_ARRAYS, **arrays)  # uncompressed, as the router's: see Selector.save
        meta = {"format": SCOPE_FORMAT, "params": self.get_params(), "classes": self.classes_}
        (directory / SCOPE_FILE).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> "ScopeDetector":
        directory = Path(directory)
        meta = read_json(directory / SCOPE_FILE, SelectorError, expect_format=SCOPE_FORMAT, what="scope detector")
        det = cls(**meta.get("params", {}))
        det.classes_ = list(meta.get("classes", []))
        try:
            with np.load(directory / SCOPE_ARRAYS) as z:
                det.counts_ = sp.csr_matrix((z["data"], z["indices"], z["indptr"]),
                                            shape=(len(det.classes_), det.n_features))
                det.train_scores_ = {k: z[f"loo_{i}"] for i, k in enumerate(det.classes_)}
                det.background_ = z["background"]
        except (OSError, KeyError, ValueError) as exc:
            raise SelectorError(f"{directory / SCOPE_ARRAYS}: unreadable scope statistics ({exc})") from None
        return det

    @staticmethod
    def exists(directory: str | Path) -> bool:
        return (Path(directory) / SCOPE_FILE).is_file()
