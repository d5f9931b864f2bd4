"""Shared fixtures: a tiny random Llama (seconds) with the real SmolLM2 tokenizer, and a small stream."""
import os
from contextlib import contextmanager
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers (pytest-xdist) on this project's 2-core machines: one torch thread each,
    # or the two processes' thread pools fight over the cores and both run several times slower. Set before
    # torch is imported, and inherited by the CLI and learner processes the tests start.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

# The suite runs on the CPU also where a GPU is present: its exactness tests state float32 rounding bounds of the
# CPU kernels, and its inputs are built where CI builds them. On an H200 with CUDA visible, 10 tests failed only
# because `device="auto"` put the tiny model on the GPU (docs/decoding.md, "On a GPU"); the GPU's own figures
# come from `bench/latency.py --device cuda`. Set before torch is imported.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# A small sample of Microsoft TaskBench (MIT, licence beside it): the catalogs and a few gold records, in the
# repository so that the tests that meet real records run from a clone alone.
TASKBENCH_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "taskbench"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from skillbank.model.tiny import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def small_stream():
    from skillbank.data.builtin import build_builtin_stream
    return build_builtin_stream(seed=0, train_per_family=6, test_per_family=3)


@contextmanager
def killed_after_checkpoint(step: int, in_dir: str | None = None):
    """Inside the block a training is killed (KeyboardInterrupt) right after it writes its checkpoint at
    optimizer step ``step`` - only a checkpoint in a folder named ``in_dir``, when given."""
    from skillbank.train.checkpoint import FitCheckpoint
    real_save = FitCheckpoint.save

    def dying_save(self, state):
        real_save(self, state)
        if state["step"] == step and (in_dir is None or self.path.parent.name == in_dir):
            raise KeyboardInterrupt(f"killed after the checkpoint of step {step}")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(FitCheckpoint, "save", dying_save)
        yield
