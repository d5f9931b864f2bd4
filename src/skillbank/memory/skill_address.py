"""Which of a family's skills a request asks for: per-skill routing statistics kept beside each shard.

The Address Memory picks a family; inside it the executor picks skills. On requests written unlike its
training templates the executor's weak point is that second choice ("note: buy oat milk" planned as
``buy_insurance``, "strip the hiss out of interview_14.m4a" as ``splice_audio``: most of its misses on the
hand-written development sets name a wrong skill of the right family). A selector of the bank's own router kind,
fitted with skills as its classes - each training request counted for every skill its gold graph uses, each
skill's catalog text as that skill's catalog document - reads the request as the family router does (sentence
embeddings past payloads and scene sentences, word counts) and gives ``log p(skill | request)``. While the
executor writes a skill name, that prior is added to its choice among the names the grammar still allows
(:class:`~skillbank.model.constrain.SkillPrior`), so a product of the two experts picks the skill; nothing else
of the plan is touched.

Replay-free like the Address Memory: sums per skill, no request. Saved in the shard's directory
(``skill_address/``, under the shard's digests), so it travels with ``export``/``import``, goes with ``forget``
and is replaced by ``relearn``. Shards written before it have none and decode as before.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

SKILL_ADDRESS_DIR = "skill_address"
#: the prior's weight against the executor's own log-probabilities of a name's tokens, and the floor under the
#: prior's log-probability (the router's probabilities are sharp: without a floor one stray word can veto the
#: executor). Chosen on the hand-written development sets with the template held-out requests as a check
#: (``bench/skill_prior.py``); 0 switches the prior off.
PRIOR_WEIGHT = 0.5
PRIOR_FLOOR = -5.0


def fit_skill_address(records, specs: Sequence[dict], kind: str, params: dict):
    """A selector of ``kind`` over the family's skills: each request of ``records`` counted for every skill its
    graph uses, each skill's catalog text (``specs``, as ``skills.json`` keeps them) for that skill. None when
    the family has fewer than two skills (there is nothing to choose)."""
    from skillbank.memory.scope import catalog_text
    from skillbank.memory.selector import make_selector

    requests, labels = [], []
    for r in records:
        for skill in dict.fromkeys(r.graph.tasks):  # each skill of the graph once
            requests.append(r.request)
            labels.append(skill)
    if len(set(labels)) < 2:
        return None
    selector = make_selector(kind, **params)
    selector.partial_fit(requests, labels)
    by_id = {str(s.get("id") or s.get("name")): s for s in specs}
    for skill in sorted(set(labels)):
        if skill in by_id:
            docs = catalog_text([by_id[skill]])
            if docs:
                selector.partial_fit_catalog(docs, skill)
    return selector


def save_skill_address(selector, shard_dir: str | Path) -> None:
    if selector is not None:
        selector.save(Path(shard_dir) / SKILL_ADDRESS_DIR)


def load_skill_address(shard_dir: str | Path):
    """The shard's skill statistics, or None for a shard written without them."""
    from skillbank.memory.selector import load_selector

    directory = Path(shard_dir) / SKILL_ADDRESS_DIR
    if not (directory / "selector.json").is_file():
        return None
    return load_selector(directory)


def skill_log_priors(selector, requests: Sequence[str], floor: float = PRIOR_FLOOR) -> list[dict[str, float]]:
    """Per request ``{skill id: max(log p(skill | request), floor)}``."""
    proba = np.asarray(selector.predict_proba(list(requests)), dtype=np.float64)
    logp = np.maximum(np.log(np.clip(proba, 1e-300, 1.0)), floor)
    classes = [str(c) for c in selector.classes_]
    return [dict(zip(classes, row.tolist())) for row in logp]
