"""Shared fixtures: a tiny random Llama (seconds) with the real SmolLM2 tokenizer, and a small stream."""
from pathlib import Path

import pytest

SHARED_TASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "taskbench"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from skillbank.model.tiny import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def small_stream():
    from skillbank.data.builtin import build_builtin_stream
    return build_builtin_stream(seed=0, train_per_family=6, test_per_family=3)
