"""Checkpoints inside one training, so a stage killed halfway continues where it stopped.

A stage of the method comparison trains for 30-70 minutes on a CPU, and a comparison runs over many sittings
of a few hours: every process killed at the end of a sitting used to lose the stage it was in. :func:`fit`
now writes, every few minutes after an optimizer step, everything the rest of the training depends on:

* the trained adapter's weights, AdamW's moments and step counts, the learning-rate schedule's position;
* where the loop is: the epoch, the index of the next micro-batch in that epoch's batch order, and the
  state of the seeded generator that drew that order (so the same order is drawn again);
* torch's random state (dropout), and the totals the :class:`~skillbank.train.loop.FitResult` reports
  (loss curve, token counts, loss-term sums, training seconds so far).

A fit given the same checkpoint path loads it when its *fingerprint* matches: a digest of what the
training reads (adapter and active adapters, the recipe, seed, the tokenized examples, the adapter's
starting weights, the loss terms' names, the process count). Then the continued training is the same
computation as an uninterrupted one, bit for bit on a CPU (``tests/test_fit_checkpoint.py``). A checkpoint
with another fingerprint belongs to another training: it is reported and replaced, never loaded.

Writes are atomic (temporary file, then rename), so a kill while writing leaves the previous checkpoint.
The file is removed when the training finishes, unless it was made with ``keep_final=True``: then the
finished training's state is written instead, and its owner removes the file once it has stored what came
of the training. The continual runner does so, because a stage's work does not end with its training (EWC
estimates a Fisher, every method saves its state): a kill in between used to lose the whole training; now
the rerun loads the finished weights and runs no optimizer step. (Hand-written: accelerate's ``save_state`` stores model,
optimizer and RNG but not where a hand-rolled loop is in its epoch, and it writes the whole model rather than
the adapter.)
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from skillbank.model.base import tensors_digest
from skillbank.model.prompts import hash_examples

FORMAT = "skillbank-fit-checkpoint/1"


def fit_fingerprint(*, adapter: str, active: Sequence[str], train_config: dict, seed: int, world: int,
                    examples: Sequence, start_weights: dict[str, torch.Tensor], terms: Sequence[str]) -> str:
    """A digest of everything a training reads; two trainings with one fingerprint are the same computation."""
    h = hashlib.sha256()
    h.update(json.dumps({"adapter": adapter, "active": list(active), "train": train_config, "seed": seed,
                         "world": world, "terms": list(terms)}, sort_keys=True, default=str).encode())
    h.update(tensors_digest(sorted(start_weights.items())).encode())
    hash_examples(h, examples)
    return h.hexdigest()[:32]


class FitCheckpoint:
    """The checkpoint file of one training. ``every_seconds``: the least time between two writes (0: after
    every optimizer step, for tests)."""

    def __init__(self, path: str | Path, every_seconds: float = 600.0, keep_final: bool = False):
        self.path = Path(path)
        self.every_seconds = float(every_seconds)
        self.keep_final = keep_final
        self._last_write = time.monotonic()
        self.resumed_step: int | None = None  # the step a loaded checkpoint had reached (None: none loaded)

    def load(self, fingerprint: str) -> dict | None:
        """The saved state of this training, or None when there is none (or it is another training's)."""
        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a torn or foreign file: the training starts over, and says why
            print(f"fit checkpoint {self.path} is unreadable ({exc.__class__.__name__}: {exc}); training this "
                  "stage from its start", file=sys.stderr)
            return None
        if state.get("format") != FORMAT or state.get("fingerprint") != fingerprint:
            print(f"fit checkpoint {self.path} belongs to another training (its inputs differ); training this "
                  "stage from its start and replacing it", file=sys.stderr)
            return None
        if state.get("finished"):
            print(f"fit checkpoint {self.path}: this training had finished (step {state['step']}); loading its "
                  "weights without training", file=sys.stderr)
        else:
            print(f"fit checkpoint {self.path}: continuing this training after step {state['step']}", file=sys.stderr)
        self.resumed_step = int(state["step"])
        return state

    def due(self) -> bool:
        return time.monotonic() - self._last_write >= self.every_seconds

    def save(self, state: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        torch.save({"format": FORMAT, **state}, tmp)
        os.replace(tmp, self.path)
        self._last_write = time.monotonic()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def python_rng_state(rng: random.Random) -> list:
    """``random.Random.getstate()`` as lists and ints (what ``torch.load(weights_only=True)`` accepts)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_python_rng_state(rng: random.Random, state: list) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
