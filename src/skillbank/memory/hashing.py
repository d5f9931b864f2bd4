"""Requests as hashed word n-gram counts: the features the Address Memory and the scope statistics count.

Written by hand, and feature for feature equal to scikit-learn's ``HashingVectorizer(alternate_sign=False,
norm=None)`` with its default word analyzer (``tests/test_hashing.py`` checks it on every fixture request):
importing scikit-learn costs 1.2-1.4 s on this project's machines (it pulls in scipy.stats), which was half of
a cold ``skillbank plan`` that the gate refuses. Banks saved before this module keep working unchanged: the
feature indices are the same. The hash is MurmurHash3 (x86, 32-bit, seed 0) of the UTF-8 n-gram, from the
``mmh3`` package, as scikit-learn computes it.
"""
from __future__ import annotations

import re
from typing import Sequence

import mmh3
import numpy as np
import scipy.sparse as sp

TOKEN = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn's default token_pattern: words of two or more characters
_INT32_MIN = -2147483648


class WordHasher:
    """``transform(texts) -> csr_matrix (n, n_features)`` of n-gram counts, hashed."""

    def __init__(self, n_features: int = 2 ** 20, ngram_range: tuple[int, int] = (1, 1), lowercase: bool = True):
        self.n_features = int(n_features)
        self.ngram_range = (int(ngram_range[0]), int(ngram_range[1]))
        self.lowercase = bool(lowercase)

    def ngrams(self, text: str) -> list[str]:
        words = TOKEN.findall(text.lower() if self.lowercase else text)
        lo, hi = self.ngram_range
        if hi == 1:
            return words
        out = list(words) if lo == 1 else []
        for n in range(max(lo, 2), hi + 1):
            out.extend(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
        return out

    def index(self, gram: str) -> int:
        h = mmh3.hash(gram.encode("utf-8"), 0, signed=True)
        # abs(INT32_MIN) overflows in C; scikit-learn defines it so that it equals abs(-2**31) % n_features
        return (2147483647 - (self.n_features - 1)) % self.n_features if h == _INT32_MIN else abs(h) % self.n_features

    def transform(self, texts: Sequence[str]) -> sp.csr_matrix:
        indptr, indices = [0], []
        for text in texts:
            indices.extend(self.index(g) for g in self.ngrams(text))
            indptr.append(len(indices))
        X = sp.csr_matrix((np.ones(len(indices), dtype=np.float64), np.asarray(indices, dtype=np.int32),
                           np.asarray(indptr, dtype=np.int32)), shape=(len(texts), self.n_features))
        X.sum_duplicates()
        return X
