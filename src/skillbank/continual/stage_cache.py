"""Trained stages shared between runs whose training is the same computation.

Sequential SFT, Replay, LwF and EWC train their first stage identically: the same freshly seeded adapter,
the same examples, the same recipe and no extra loss term (Replay's buffer, LwF's teacher and EWC's Fisher
only act from the second stage on). So do Stacked-LoRA, Progressive-LoRA and O-LoRA at the recipe's adapter
(no earlier adapter to stack on or be orthogonal to; O-LoRA's lambda_2, when set, is a term from stage 1 and
keeps it apart): their ``stage-1`` adapter starts from the same seed as the sequential methods' one adapter.
A sweep that screens 24 settings of these methods on two screens would train that stage 48 times; a
comparison trains it once per method and order. A stage is trained once and the others load its adapter.

The key is a digest of everything the training reads: the base model's identity, the adapter's starting
weights (under the stored adapter name, so the name a method gives its adapter does not matter), the
tokenized examples in order, the recipe (``TrainConfig``, seed included) and the device. Any
difference is another key, so a hit is the same computation, not a similar one; on CPU it gives the same
bits (``tests/test_stage_cache.py`` checks the digests). A training with an extra loss term or a per-step
callback is never shared.

On disk: ``<root>/<key>/`` holds the adapter directory, ``fit.json`` (the training's own totals: a run
that loads the stage reports the time the training took and says where it came from) and ``COMPLETE``.
Processes that train the same key at once both train; the first to finish stores it.

The methods' outputs are keyed by the adapter's weights, not the method's name, and the runner gives them
``<root>/outputs.jsonl`` as a shared output cache, so the shared stage is also evaluated once.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from skillbank.model.prompts import hash_examples

COMPLETE = "COMPLETE"
#: The name a stored stage's adapter directory and starting-weight digest use: the sequential methods' adapter
#: name, which every key was computed under before other methods shared stages (so those keys still match).
STORED_ADAPTER = "seq"


def under_stored_name(named: dict, adapter: str) -> dict:
    """Parameters of ``adapter`` (PEFT names end in ``.<adapter>.weight``) renamed as if the adapter were
    :data:`STORED_ADAPTER`, for the key's starting-weight digest."""
    pattern = re.compile(rf"\.{re.escape(adapter)}(\.|$)")
    return {pattern.sub(rf".{STORED_ADAPTER}\1", n, count=1): p for n, p in named.items()}


class StageCache:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    @staticmethod
    def key(*, base_identity: dict, start_digest: str, examples: Sequence, train_config: dict, seed: int,
            device: str) -> str:
        h = hashlib.sha256()
        h.update(json.dumps({"base": base_identity, "start": start_digest, "train": train_config, "seed": seed,
                             "device": device}, sort_keys=True, default=str).encode())
        hash_examples(h, examples)
        return h.hexdigest()[:24]

    def lookup(self, key: str) -> Path | None:
        d = self.root / key
        return d if (d / COMPLETE).is_file() else None

    def fit_result(self, key: str) -> dict:
        return json.loads((self.root / key / "fit.json").read_text())

    def store(self, key: str, save: Callable[[Path], None], fit_result) -> Path:
        """Write a stage: ``save(directory)`` writes the adapter; ``fit_result`` is the FitResult."""
        final = self.root / key
        if self.lookup(key):
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save(tmp)
        (tmp / "fit.json").write_text(json.dumps(asdict(fit_result) if not isinstance(fit_result, dict) else fit_result)
                                      + "\n")
        (tmp / COMPLETE).write_text("")
        try:
            os.replace(tmp, final)
        except OSError:  # another process stored the same stage first: same computation, keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        return final
