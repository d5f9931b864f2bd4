"""Selectors beyond the Address Memory (which stays in :mod:`skillbank.memory.address`).

Every kind is named in the registry of :mod:`skillbank.memory.selector` (``SELECTOR_KINDS``), which
``make_selector`` and ``load_selector`` resolve on first use:

========================  ==================================================================  ==========
kind                      what it reads                                                       keeps
========================  ==================================================================  ==========
``hashing-nb``            hashed n-grams, incremental NB (FSM's Address Memory)               statistics
``tfidf-logreg``          TF-IDF + logistic regression refitted on all requests (offline)     requests
``embed-lda-nb``          MiniLM embeddings (LDA, shared covariance) + hashing NB (ours)      statistics
``epi``                   frozen-base hidden states, Mahalanobis (EPI)                        statistics
``adaptercl``             request perplexity under each adapter (AdapterCL)                   shard list
``self-route``            every executor generates; highest mean token log-prob               shard list
``oracle``                the gold family (execution-only reference)                          shard list
========================  ==================================================================  ==========
"""
from skillbank.memory.selectors.embedding import EmbeddingLDANBAddress, SentenceEncoder, get_encoder
from skillbank.memory.selectors.gaussian import GaussianClassStats
from skillbank.memory.selectors.model_based import (AdapterCLSelector, AdapterRequestNLL, BaseHiddenStates,
                                                    EPISelector, OracleSelector, SelfRouteSelector)

#: kinds that read only the request text (need no bank)
TEXT_KINDS = ("hashing-nb", "tfidf-logreg", "embed-lda-nb")
#: kinds that need the bank's models, and the oracle
MODEL_KINDS = ("epi", "adaptercl", "self-route", "oracle")

__all__ = ["AdapterCLSelector", "AdapterRequestNLL", "BaseHiddenStates", "EPISelector", "EmbeddingLDANBAddress",
           "GaussianClassStats", "OracleSelector", "SelfRouteSelector", "SentenceEncoder", "get_encoder",
           "TEXT_KINDS", "MODEL_KINDS"]
