"""Address Memory: routing a raw request to one executor shard.

Two selectors live here, both speaking the interface of :mod:`skillbank.memory.selector`
(``partial_fit``, ``predict``, ``predict_proba``, ``save``/``load``):

* :class:`HashingNBAddress` - FSM's replay-free default: fixed-size hashed word n-gram counts
  (:mod:`skillbank.memory.hashing`, scikit-learn's ``HashingVectorizer`` features) and an incremental multinomial Naive Bayes. Its state is the
  per-class feature counts and class counts; requests are never kept.
* :class:`TfidfLogRegAddress` - the offline reference: TF-IDF + logistic regression refitted on every
  stage's requests so far. It *keeps the requests* (that is what makes it the non-replay-free
  reference), so its saved state is those requests and it is refitted deterministically on load.

The other selectors (the embedding router, EPI, AdapterCL, Self-route, Oracle) live in
:mod:`skillbank.memory.selectors`; ``make_selector`` / ``load_selector`` find every kind through the
registry of :mod:`skillbank.memory.selector`. Out-of-scope detection is :mod:`skillbank.memory.scope`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp
from skillbank.errors import SelectorError
from skillbank.memory.hashing import WordHasher
from skillbank.memory.selector import Selector, check_requests
from skillbank.memory.selector import load_selector, make_selector

# The Address Memory's callers read the whole selector API from here.
__all__ = ["HashingNBAddress", "TfidfLogRegAddress", "Selector", "check_requests", "load_selector", "make_selector"]


class HashingNBAddress(Selector):
    """Hashed n-gram counts + incremental multinomial Naive Bayes (FSM's Address Memory).

    Parameters
    ----------
    n_features : hashing space size (2**18 by default; the counts are stored sparsely, so the saved
        state grows with the vocabulary seen, not with ``n_features``).
    alpha : additive (Lidstone) smoothing. Large hashing spaces need a small alpha: with 2**20
        features, alpha=1 adds ~10**6 pseudo-counts per class, swamping classes with a few thousand
        real tokens, and routes everything to the family with the most tokens.
    ngram_range : word n-grams hashed.
    prior : "uniform" (every learned shard equally likely a priori) or "empirical" (request counts).

    Why the NB is written here instead of using ``sklearn.naive_bayes.MultinomialNB``: MultinomialNB
    needs every class declared on the first ``partial_fit`` and keeps dense (n_classes, n_features)
    arrays. A continual Address Memory must add a class when its family arrives - never knowing
    future families - and should store only the counts it has seen. The counting rule is the same.
    """

    kind = "hashing-nb"
    replay_free = True
    can_forget = True

    def __init__(self, n_features: int = 2**18, alpha: float = 0.01, ngram_range: tuple[int, int] | list = (1, 2),
                 prior: str = "uniform", lowercase: bool = True):
        if not isinstance(n_features, int) or n_features < 16:
            raise SelectorError(f"n_features must be an integer >= 16, got {n_features!r}")
        if not alpha > 0:
            raise SelectorError(f"alpha must be > 0, got {alpha!r}")
        if prior not in ("uniform", "empirical"):
            raise SelectorError(f"prior must be 'uniform' or 'empirical', got {prior!r}")
        lo, hi = ngram_range
        if not 1 <= lo <= hi:
            raise SelectorError(f"ngram_range must be (lo, hi) with 1 <= lo <= hi, got {ngram_range!r}")
        self.n_features = n_features
        self.alpha = float(alpha)
        self.ngram_range = (int(lo), int(hi))
        self.prior = prior
        self.lowercase = lowercase
        # alternate_sign=False: signed hashing produces negative "counts", which a multinomial NB
        # cannot take; norm=None keeps raw counts.
        self._vectorizer = WordHasher(n_features, self.ngram_range, lowercase)
        self.reset()

    def reset(self) -> None:
        self.classes_ = []
        self.class_count_ = np.zeros(0)
        self.feature_count_ = sp.csr_matrix((0, self.n_features))

    def get_params(self) -> dict:
        return {"n_features": self.n_features, "alpha": self.alpha, "ngram_range": list(self.ngram_range),
                "prior": self.prior, "lowercase": self.lowercase}

    def transform(self, requests: Sequence[str]) -> sp.csr_matrix:
        return self._vectorizer.transform(check_requests(requests))

    def partial_fit(self, requests, labels) -> "HashingNBAddress":
        reqs = check_requests(requests)
        if not reqs:
            raise SelectorError("partial_fit needs at least one request")
        labs = self._labels(reqs, labels)
        X = self._vectorizer.transform(reqs)
        new = [c for c in dict.fromkeys(labs) if c not in self.classes_]
        if new:
            self.classes_ = self.classes_ + new
            self.class_count_ = np.concatenate([self.class_count_, np.zeros(len(new))])
            self.feature_count_ = sp.vstack([self.feature_count_, sp.csr_matrix((len(new), self.n_features))]).tocsr()
        index = {c: i for i, c in enumerate(self.classes_)}
        rows = np.array([index[c] for c in labs])
        # (n_classes, n_requests) indicator times (n_requests, n_features) counts = per-class counts
        indicator = sp.csr_matrix((np.ones(len(rows)), (rows, np.arange(len(rows)))),
                                  shape=(len(self.classes_), len(rows)))
        self.feature_count_ = (self.feature_count_ + indicator @ X).tocsr()
        self.class_count_ = self.class_count_ + np.bincount(rows, minlength=len(self.classes_))
        return self

    def forget(self, label: str) -> "HashingNBAddress":
        """Drop a class's counts row. Exact: the other classes' likelihoods never read it, and the
        empirical prior's normaliser cancels in ``predict_proba``."""
        self._check_class(label)
        i = self.classes_.index(label)
        keep = [j for j in range(len(self.classes_)) if j != i]
        self.classes_ = [self.classes_[j] for j in keep]
        self.class_count_ = self.class_count_[keep]
        self.feature_count_ = self.feature_count_[keep].tocsr()
        return self

    def family_selector(self, label: str) -> "HashingNBAddress":
        """An Address Memory holding only ``label``'s statistics (its counts row)."""
        self._check_class(label)
        one = HashingNBAddress(**self.get_params())
        i = self.classes_.index(label)
        one.classes_ = [label]
        one.class_count_ = self.class_count_[[i]]
        one.feature_count_ = self.feature_count_[[i]].tocsr()
        return one

    def add_family(self, other: Selector, source: str, label: str) -> "HashingNBAddress":
        """Append class ``source`` of ``other`` as ``label`` (counts are additive: the same as learning it here)."""
        self._check_same_router(other)
        if label in self.classes_:
            raise SelectorError(f"class {label!r} is already learned")
        i = other.classes_.index(source)
        if not self.classes_:
            self.reset()
        self.classes_ = self.classes_ + [label]
        self.class_count_ = np.concatenate([self.class_count_, other.class_count_[[i]]])
        self.feature_count_ = sp.vstack([self.feature_count_, other.feature_count_[[i]]]).tocsr()
        return self

    def joint_log_likelihood(self, requests: Sequence[str]) -> np.ndarray:
        """Unnormalised log p(x, class), shape (n_requests, n_classes)."""
        self._check_fitted()
        X = self.transform(requests)
        weights, norm = self._weights()
        n_tokens = np.asarray(X.sum(axis=1)).ravel()  # (n_requests,)
        jll = np.asarray((X @ weights).todense())
        jll += np.outer(n_tokens, norm)
        if self.prior == "empirical":
            jll += np.log(self.class_count_ / self.class_count_.sum())
        return jll

    def leave_one_out_log_likelihood(self, requests: Sequence[str], labels: Sequence[str]) -> np.ndarray:
        """:meth:`joint_log_likelihood` of training requests already learned, each with its own counts taken
        out of its own class (exact for counts): the scores a new request phrased like it would get. In-sample
        scores overstate how sure the router is, the more so the fewer requests a family has."""
        jll = self.joint_log_likelihood(requests)
        X = self.transform(requests).tocsr()
        fc = self.feature_count_.tocsr()
        totals = np.asarray(fc.sum(axis=1)).ravel()
        a, V = self.alpha, self.n_features
        index = {c: i for i, c in enumerate(self.classes_)}
        for i, label in enumerate(labels):
            c = index[label]
            idx, x = X.indices[X.indptr[i]:X.indptr[i + 1]], X.data[X.indptr[i]:X.indptr[i + 1]]
            own = np.asarray(fc[c, idx].todense()).ravel() - x
            if (own < -1e-9).any():
                raise SelectorError(f"request {i} was not learned as {label!r}: its counts exceed the class's")
            n = x.sum()
            jll[i, c] = float(x @ np.log1p(np.maximum(own, 0) / a)) + n * (np.log(a) - np.log(totals[c] - n + a * V))
            if self.prior == "empirical":  # one request fewer in its class; the shared normaliser cancels
                jll[i, c] += np.log(max(self.class_count_[c] - 1, 1e-12) / self.class_count_[c])
        return jll

    def _weights(self) -> tuple[sp.csr_matrix, np.ndarray]:
        """(features x classes) log1p weights and per-class log normalisers, rebuilt only when the counts
        change: rebuilding them per call costs time linear in every class's vocabulary, which at a thousand
        families is most of a request's routing time."""
        fc = self.feature_count_
        cached = getattr(self, "_cache", None)
        if cached is None or cached[0] is not fc:  # every update assigns a new counts matrix
            a, V = self.alpha, self.n_features
            totals = np.asarray(fc.sum(axis=1)).ravel()  # (n_classes,)
            # log((fc + a) / (total + a V)) = log(a) + log1p(fc / a) - log(total + a V): the log1p term is
            # zero wherever a class never saw a feature, so it stays sparse.
            sparse_part = fc.copy()
            sparse_part.data = np.log1p(sparse_part.data / a)
            self._cache = (fc, sparse_part.T.tocsr(), np.log(a) - np.log(totals + a * V))
        return self._cache[1], self._cache[2]

    def predict_proba(self, requests) -> np.ndarray:
        jll = self.joint_log_likelihood(requests)
        jll -= jll.max(axis=1, keepdims=True)
        p = np.exp(jll)
        return p / p.sum(axis=1, keepdims=True)

    def _state(self):
        fc = self.feature_count_.tocsr()
        state = {"classes": self.classes_, "class_count": self.class_count_.tolist()}
        arrays = {"fc_data": fc.data, "fc_indices": fc.indices, "fc_indptr": fc.indptr}
        return state, arrays

    def _set_state(self, state, arrays):
        self.classes_ = list(state.get("classes", []))
        self.class_count_ = np.asarray(state.get("class_count", []), dtype=float)
        if self.classes_:
            self.feature_count_ = sp.csr_matrix(
                (arrays["fc_data"], arrays["fc_indices"], arrays["fc_indptr"]),
                shape=(len(self.classes_), self.n_features))
        if len(self.class_count_) != len(self.classes_) or self.feature_count_.shape[0] != len(self.classes_):
            raise SelectorError("saved Address Memory state is inconsistent (class counts vs classes)")


class TfidfLogRegAddress(Selector):
    """Offline reference: TF-IDF word n-grams + multinomial logistic regression on all requests so far.

    Not replay-free by construction: ``partial_fit`` appends the stage's requests to the kept pool and
    refits from scratch, so it always sees every earlier stage's requests.

    ``solver="auto"`` fits with L-BFGS while the model has at most :data:`LBFGS_MAX_PARAMS` weights
    (features x families) and with SAGA above. L-BFGS keeps ~25 vectors of that size: at 1,000 synthetic
    families (~100,000 TF-IDF n-grams, 10^8 weights) that is 20 GB, past the 32-bit indices of scipy's
    L-BFGS-B, which then crashes the process with a segfault instead of an error.
    """

    kind = "tfidf-logreg"
    replay_free = False
    #: L-BFGS up to this many weights (its workspace: ~25 x 8 bytes each, i.e. 4 GB here); SAGA above.
    LBFGS_MAX_PARAMS = 20_000_000

    def __init__(self, C: float = 10.0, ngram_range: tuple[int, int] | list = (1, 2), max_iter: int = 2000,
                 sublinear_tf: bool = True, solver: str = "auto"):
        if not C > 0:
            raise SelectorError(f"C must be > 0, got {C!r}")
        if solver not in ("auto", "lbfgs", "saga"):
            raise SelectorError(f"solver must be 'auto', 'lbfgs' or 'saga', got {solver!r}")
        self.C = float(C)
        self.ngram_range = (int(ngram_range[0]), int(ngram_range[1]))
        self.max_iter = int(max_iter)
        self.sublinear_tf = sublinear_tf
        self.solver = solver
        self.reset()

    def reset(self) -> None:
        self.classes_ = []
        self.requests_: list[str] = []
        self.labels_: list[str] = []
        self._vectorizer = None
        self._model = None

    def get_params(self) -> dict:
        return {"C": self.C, "ngram_range": list(self.ngram_range), "max_iter": self.max_iter,
                "sublinear_tf": self.sublinear_tf, "solver": self.solver}

    def partial_fit(self, requests, labels) -> "TfidfLogRegAddress":
        reqs = check_requests(requests)
        if not reqs:
            raise SelectorError("partial_fit needs at least one request")
        labs = self._labels(reqs, labels)
        self.requests_ += reqs
        self.labels_ += labs
        self._refit()
        return self

    def _refit(self) -> None:
        self.classes_ = list(dict.fromkeys(self.labels_))
        # scikit-learn is imported here, not at the top: the plan path (hashing NB) does not need it
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        self._vectorizer = TfidfVectorizer(ngram_range=self.ngram_range, sublinear_tf=self.sublinear_tf)
        X = self._vectorizer.fit_transform(self.requests_)
        if len(self.classes_) == 1:
            self._model = None  # one shard: nothing to choose
            return
        self.solver_ = self.solver
        if self.solver == "auto":
            self.solver_ = "lbfgs" if X.shape[1] * len(self.classes_) <= self.LBFGS_MAX_PARAMS else "saga"
        self._model = LogisticRegression(C=self.C, max_iter=self.max_iter, solver=self.solver_)
        self._model.fit(X, self.labels_)

    def predict_proba(self, requests) -> np.ndarray:
        self._check_fitted()
        reqs = check_requests(requests)
        if self._model is None:
            return np.ones((len(reqs), 1))
        proba = self._model.predict_proba(self._vectorizer.transform(reqs))
        order = [list(self._model.classes_).index(c) for c in self.classes_]
        return proba[:, order]

    def _state(self):
        return {"requests": self.requests_, "labels": self.labels_}, {}

    def _set_state(self, state, arrays):
        self.requests_ = list(state.get("requests", []))
        self.labels_ = list(state.get("labels", []))
        if self.requests_:
            self._refit()
