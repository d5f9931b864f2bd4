"""The hand-written hasher (skillbank.memory.hashing) gives scikit-learn's HashingVectorizer features exactly, so
Address Memory and scope statistics saved with either read the same."""
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.feature_extraction.text import HashingVectorizer

from skillbank.memory.hashing import WordHasher

FIXTURES = Path(__file__).parent / "fixtures"


def texts() -> list[str]:
    out = ["", "a", "Book a table at Nopa, then text Ana", "東京の天気 tomorrow?", "e-mail: ANA@example.com 3pm",
           "naïve café déjà-vu", "x" * 300, "the the the the", "tab\tand\nnewline", "über ÜBER Über"]
    for path in sorted(FIXTURES.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("request"), str):
                out.append(rec["request"])
    return out


@pytest.mark.parametrize("n_features,ngram_range,lowercase", [(2 ** 20, (1, 1), True), (2 ** 18, (1, 2), True),
                                                              (2 ** 16, (1, 3), False), (97, (2, 2), True)])
def test_equal_to_scikit_learn(n_features, ngram_range, lowercase):
    data = texts()
    assert len(data) > 300
    ours = WordHasher(n_features, ngram_range, lowercase).transform(data)
    theirs = HashingVectorizer(n_features=n_features, alternate_sign=False, norm=None, ngram_range=ngram_range,
                               lowercase=lowercase).transform(data)
    assert ours.shape == theirs.shape
    assert (ours != theirs).nnz == 0
    np.testing.assert_array_equal(ours.toarray()[:5], theirs.toarray()[:5])

