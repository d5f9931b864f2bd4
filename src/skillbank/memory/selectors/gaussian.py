"""Incremental Gaussian class statistics: per-class count and mean, one pooled within-class scatter.

The shared state of every "class statistics" router here (EPI over frozen-base hidden states, the
embedding router over MiniLM sentence embeddings). Features arrive one stage at a time and are dropped
after the update: what is kept is, per class, the number of requests and the mean feature vector, and
one (d, d) within-class scatter matrix shared by all classes - never a request or a feature row.

The scatter is merged with Chan et al.'s pairwise rule rather than accumulated as raw second moments
(sum of x x^T minus n mu mu^T), because hidden states of a language model have large means and the
raw-moment difference loses most of its digits to cancellation. The rule is exact: any chunking of the
same data gives the same statistics up to float rounding (tests check it).

With ``per_class=True`` each class's own within-class scatter is kept too (float32, (d, d) per class) and the
pooled one is their sum: then one class can be removed exactly (:meth:`forget`) or copied out with its
statistics alone (:meth:`family`), which the pooled matrix alone cannot do. EPI's hidden states are too wide
for that (d = 576 to 4,096); the sentence-embedding router (d = 384, ~0.6 MB a family) keeps them.

Scoring is the linear/Gaussian discriminant with that shared covariance (Mahalanobis distance to each
class mean). The covariance is shrunk toward a scaled identity by ``prior_strength`` pseudo-observations,
a conjugate-prior (inverse-Wishart-like) estimate ``(S + nu0 * s2 * I) / (n - C + nu0)`` with
``s2 = trace(S) / ((n - C) d)``: it stays invertible when a stage has fewer requests than dimensions
(the first stage always), and its pull fades as data accumulates, with no request kept to re-estimate it.
"""
from __future__ import annotations

import numpy as np

from skillbank.errors import SelectorError


class GaussianClassStats:
    """Sufficient statistics of a shared-covariance Gaussian classifier, updated chunk by chunk.

    Attributes (learned, float64): ``classes_`` (list of labels), ``count_`` (n_classes,),
    ``mean_`` (n_classes, d), ``scatter_`` (d, d): the pooled within-class sum of squared deviations.
    """

    def __init__(self, prior_strength: float = 10.0, per_class: bool = False):
        if not prior_strength >= 0:
            raise SelectorError(f"prior_strength must be >= 0, got {prior_strength!r}")
        self.prior_strength = float(prior_strength)
        self.per_class = bool(per_class)
        self.reset()

    def reset(self) -> None:
        self.classes_: list[str] = []
        self.count_ = np.zeros(0)
        self.mean_ = np.zeros((0, 0))
        self.scatter_ = np.zeros((0, 0))
        # per_class: (n_classes, d, d) float32; scatter_ is then their sum in class order, so a state after
        # forgetting a class is the same, bit for bit, as one that never learned it
        self.class_scatter_ = np.zeros((0, 0, 0), dtype=np.float32)
        self._precision = None  # cached inverse covariance; cleared by every update
        self._mean_terms = None  # (P @ means^T, m^T P m per class), derived from _precision

    @property
    def dim(self) -> int:
        return self.mean_.shape[1] if self.mean_.ndim == 2 else 0

    def partial_fit(self, X: np.ndarray, labels: list[str]) -> "GaussianClassStats":
        """Merge feature rows ``X`` (n, d) with their ``labels`` into the statistics."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or len(X) != len(labels) or len(X) == 0:
            raise SelectorError(f"expected a non-empty (n, d) feature array with n labels, got shape {X.shape} "
                                f"and {len(labels)} labels")
        if self.classes_ and X.shape[1] != self.dim:
            raise SelectorError(f"features have {X.shape[1]} dimensions, the statistics {self.dim}")
        if not self.classes_:
            self.mean_ = np.zeros((0, X.shape[1]))
            self.scatter_ = np.zeros((X.shape[1], X.shape[1]))
            self.class_scatter_ = np.zeros((0, X.shape[1], X.shape[1]), dtype=np.float32)
        labels = np.asarray(labels)
        for c in dict.fromkeys(labels.tolist()):
            Xc = X[labels == c]
            n_b, mu_b = len(Xc), Xc.mean(axis=0)
            dev = Xc - mu_b
            if c not in self.classes_:
                self.classes_.append(c)
                self.count_ = np.append(self.count_, 0.0)
                self.mean_ = np.vstack([self.mean_, np.zeros(X.shape[1])])
                if self.per_class:
                    self.class_scatter_ = np.concatenate(
                        [self.class_scatter_, np.zeros((1, X.shape[1], X.shape[1]), dtype=np.float32)])
            i = self.classes_.index(c)
            n_a, mu_a = self.count_[i], self.mean_[i]
            n = n_a + n_b
            delta = mu_b - mu_a
            # Chan's merge: within-chunk scatter plus the between-chunk term of the two means.
            added = dev.T @ dev + (n_a * n_b / n) * np.outer(delta, delta)
            if self.per_class:
                if not self.class_scatter_.flags.writeable:  # memory-mapped as loaded: updated in memory
                    self.class_scatter_ = np.array(self.class_scatter_)
                self.class_scatter_[i] = (self.class_scatter_[i].astype(np.float64) + added).astype(np.float32)
            else:
                self.scatter_ += added
            self.mean_[i] = mu_a + delta * (n_b / n)
            self.count_[i] = n
        if self.per_class:
            self._pool()
        self._precision = None
        return self

    def _pool(self) -> None:
        d = self.mean_.shape[1] if self.mean_.ndim == 2 else 0
        self.scatter_ = np.zeros((d, d))
        for s in self.class_scatter_:  # in class order: the same sum whatever was learned and forgotten before
            self.scatter_ += s

    def _need_per_class(self, what: str) -> None:
        if not self.per_class:
            raise SelectorError(f"these class statistics pool their scatter over classes; one class's cannot be {what}")

    def forget(self, label: str) -> "GaussianClassStats":
        """Remove one class's statistics exactly (``per_class`` only)."""
        self._need_per_class("removed exactly")
        i = self.classes_.index(label)
        self.classes_.pop(i)
        self.count_ = np.delete(self.count_, i)
        self.mean_ = np.delete(self.mean_, i, axis=0)
        self.class_scatter_ = np.delete(self.class_scatter_, i, axis=0)
        self._pool()
        self._precision = None
        return self

    def family(self, label: str) -> "GaussianClassStats":
        """The statistics of one class alone (``per_class`` only)."""
        self._need_per_class("taken out")
        i = self.classes_.index(label)
        one = GaussianClassStats(self.prior_strength, per_class=True)
        one.classes_, one.count_, one.mean_ = [label], self.count_[[i]], self.mean_[[i]]
        one.class_scatter_ = self.class_scatter_[[i]]
        one._pool()
        return one

    def add(self, other: "GaussianClassStats", source: str, label: str) -> "GaussianClassStats":
        """Append class ``source`` of ``other`` as ``label``: the same as having learned it here."""
        self._need_per_class("added to")
        other._need_per_class("taken out")
        if label in self.classes_:
            raise SelectorError(f"class {label!r} is already learned")
        j = other.classes_.index(source)
        if self.classes_ and other.dim != self.dim:
            raise SelectorError(f"features have {other.dim} dimensions, the statistics {self.dim}")
        if not self.classes_:
            self.mean_ = np.zeros((0, other.dim))
            self.class_scatter_ = np.zeros((0, other.dim, other.dim), dtype=np.float32)
        self.classes_.append(label)
        self.count_ = np.append(self.count_, other.count_[j])
        self.mean_ = np.vstack([self.mean_, other.mean_[[j]]])
        self.class_scatter_ = np.concatenate([self.class_scatter_, other.class_scatter_[[j]]])
        self._pool()
        self._precision = None
        return self

    def covariance(self) -> np.ndarray:
        """The shrunk shared covariance, (d, d)."""
        d = self.dim
        dof = self.count_.sum() - len(self.classes_)  # degrees of freedom of the pooled scatter
        trace = float(np.trace(self.scatter_))
        s2 = trace / (dof * d) if dof > 0 and trace > 0 else 1.0
        denom = dof + self.prior_strength
        if denom <= 0:
            # One request per class and no prior: no spread is measurable; fall back to the identity.
            return np.eye(d)
        return (self.scatter_ + self.prior_strength * s2 * np.eye(d)) / denom

    def precision(self) -> np.ndarray:
        if self._precision is None:
            # With prior_strength=0 and fewer requests than dimensions the covariance is singular, and the
            # pseudo-inverse gives the Mahalanobis distance within the observed span; with a prior it is
            # positive definite and a plain inverse is 2-3x cheaper (~6 ms at d = 384: a cold plan pays it).
            cov = self.covariance()
            self._precision = (np.linalg.inv(cov) if self.prior_strength > 0
                               else np.linalg.pinv(cov, hermitian=True))
            self._mean_terms = None
        return self._precision

    def log_scores(self, X: np.ndarray) -> np.ndarray:
        """``-0.5 * Mahalanobis^2`` to every class mean, (n, n_classes): the Gaussian discriminant with
        a shared covariance and uniform prior (constants dropped)."""
        if not self.classes_:
            raise SelectorError("no class statistics yet; call partial_fit first")
        X = np.asarray(X, dtype=np.float64)
        P = self.precision()
        if self._mean_terms is None:
            # per state, not per request: P m for every class mean and m^T P m (O(C d^2), ~10 ms at C = 50)
            PM = P @ self.mean_.T
            self._mean_terms = (PM, np.einsum("dc,cd->c", PM, self.mean_))
        PM, mm = self._mean_terms
        # (x - m)^T P (x - m) = x^T P x - 2 x^T P m + m^T P m, without an (n, C, d) temporary.
        xx = np.einsum("nd,nd->n", X @ P, X)
        d2 = xx[:, None] - 2 * X @ PM + mm[None, :]
        return -0.5 * np.maximum(d2, 0.0)

    # -- persistence (arrays only; the owner stores classes and hyperparameters) ------------------
    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        if self.per_class:
            # the pooled scatter too: it is their sum in class order, and reading it back spares a loader the
            # per-class matrices (memory-mapped; read only to learn, forget or export a class)
            return {f"{prefix}count": self.count_, f"{prefix}mean": self.mean_, f"{prefix}scatter": self.scatter_,
                    f"{prefix}class_scatter": self.class_scatter_}
        return {f"{prefix}count": self.count_, f"{prefix}mean": self.mean_, f"{prefix}scatter": self.scatter_}

    def set_arrays(self, classes: list[str], arrays: dict[str, np.ndarray], prefix: str = "") -> None:
        self.reset()
        self.classes_ = list(classes)
        if not self.classes_:
            return
        try:
            self.count_ = np.asarray(arrays[f"{prefix}count"], dtype=np.float64)
            self.mean_ = np.asarray(arrays[f"{prefix}mean"], dtype=np.float64)
            if self.per_class:
                self.class_scatter_ = np.asarray(arrays[f"{prefix}class_scatter"], dtype=np.float32)
                if self.class_scatter_.ndim != 3 or self.class_scatter_.shape[0] != len(self.classes_):
                    raise SelectorError(f"saved class statistics are inconsistent: {len(self.classes_)} classes, "
                                        f"per-class scatter {self.class_scatter_.shape}")
                if f"{prefix}scatter" in arrays:  # saved with it since 2026-12-06: the same sum, not recomputed
                    self.scatter_ = np.asarray(arrays[f"{prefix}scatter"], dtype=np.float64)
                else:
                    self._pool()
            else:
                self.scatter_ = np.asarray(arrays[f"{prefix}scatter"], dtype=np.float64)
        except KeyError as exc:
            raise SelectorError(f"saved class statistics lack the array {exc}") from None
        n, d = len(self.classes_), self.mean_.shape[1] if self.mean_.ndim == 2 else -1
        if self.count_.shape != (n,) or self.mean_.shape[0] != n or self.scatter_.shape != (d, d):
            raise SelectorError(f"saved class statistics are inconsistent: {n} classes, counts {self.count_.shape}, "
                                f"means {self.mean_.shape}, scatter {self.scatter_.shape}")
