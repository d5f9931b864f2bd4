"""Checkpoints inside one training (skillbank.train.checkpoint): a training killed halfway and rerun with the
same checkpoint ends with exactly the weights, loss curve and totals of an uninterrupted one."""
from __future__ import annotations

import pytest
import torch

from skillbank.train.checkpoint import FitCheckpoint
from skillbank.train.executor import TrainConfig, add_lora, build_examples
from skillbank.train.loop import LossTerm, adapter_parameters, fit
from test_train import P, records, tiny  # noqa: F401 - tiny: a fresh tiny base per test (a fixture)

# dropout on, so the restored torch random state matters too; 3 epochs x 3 steps
CFG = TrainConfig(epochs=3, batch_size=4, lr=2e-2, warmup_ratio=0.2, dropout=0.1, target_format="compact")


class Killed(Exception):
    pass


class L2Term(LossTerm):
    """A loss term with a running sum in the FitResult (term_means must survive the resume as well)."""
    name = "l2"

    def __call__(self, ctx):
        return 1e-3 * sum(p.float().pow(2).sum() for p in ctx.trainable.values())


def train(base, *, checkpoint=None, kill_at=None, seed=3):
    examples, _ = build_examples(base, records(12), CFG, P)
    if "ckpt" not in base.adapter_names:
        add_lora(base, "ckpt", CFG, seed=7)

    def on_step(step):
        if step == kill_at:
            raise Killed

    result = fit(base, examples, CFG, adapter="ckpt", terms=[L2Term()], seed=seed, progress=False,
                 checkpoint=checkpoint, on_step=on_step if kill_at else None)
    return result, {n: p.detach().clone() for n, p in adapter_parameters(base.peft, "ckpt").items()}


@pytest.mark.parametrize("kill_at", [2, 3, 5])  # inside the first epoch, at its end, inside the second
def test_a_killed_training_continues_to_the_uninterrupted_result(tiny, tmp_path, kill_at):
    want, want_weights = train(tiny)
    tiny.remove_adapter("ckpt")

    path = tmp_path / "fit.pt"
    with pytest.raises(Killed):
        train(tiny, checkpoint=FitCheckpoint(path, every_seconds=0), kill_at=kill_at)
    assert path.is_file()
    saved = torch.load(path, weights_only=True)
    assert saved["step"] == kill_at  # written after every step, before the kill
    tiny.remove_adapter("ckpt")  # a new process: a fresh adapter, initialised as before

    got, got_weights = train(tiny, checkpoint=FitCheckpoint(path, every_seconds=0))
    assert not path.exists()  # removed once the training finished
    assert got.steps == want.steps == 9
    assert got.loss_curve == want.loss_curve
    assert got.term_means == want.term_means
    assert (got.total_tokens, got.target_tokens, got.padded_tokens) == (want.total_tokens, want.target_tokens,
                                                                        want.padded_tokens)
    assert got_weights.keys() == want_weights.keys()
    assert all(torch.equal(got_weights[n], want_weights[n]) for n in want_weights)


def test_a_checkpoint_of_another_training_is_replaced_not_loaded(tiny, tmp_path, capsys):
    path = tmp_path / "fit.pt"
    with pytest.raises(Killed):
        train(tiny, checkpoint=FitCheckpoint(path, every_seconds=0), kill_at=4, seed=3)
    tiny.remove_adapter("ckpt")
    want, want_weights = train(tiny, seed=4)
    tiny.remove_adapter("ckpt")

    # another seed is another batch order: the saved state must not leak into it
    got, got_weights = train(tiny, checkpoint=FitCheckpoint(path, every_seconds=0), seed=4)
    assert "belongs to another training" in capsys.readouterr().err
    assert got.loss_curve == want.loss_curve
    assert all(torch.equal(got_weights[n], want_weights[n]) for n in want_weights)


def test_a_torn_checkpoint_is_reported_and_the_training_starts_over(tiny, tmp_path, capsys):
    path = tmp_path / "fit.pt"
    path.write_bytes(b"not a torch file")
    want, _ = train(tiny)
    tiny.remove_adapter("ckpt")
    got, _ = train(tiny, checkpoint=FitCheckpoint(path, every_seconds=3600))
    assert f"fit checkpoint {path} is unreadable" in capsys.readouterr().err
    assert got.loss_curve == want.loss_curve and not path.exists()


def test_a_kept_final_checkpoint_makes_the_rerun_train_no_step(tiny, tmp_path, capsys):
    """``keep_final``: the finished training's state stays until its owner removes it, so a process killed
    after the training but before its result was stored (EWC's Fisher, a stage's saved state) loses nothing."""
    want, want_weights = train(tiny)
    tiny.remove_adapter("ckpt")
    path = tmp_path / "fit.pt"
    first, _ = train(tiny, checkpoint=FitCheckpoint(path, every_seconds=3600, keep_final=True))
    saved = torch.load(path, weights_only=True)
    assert saved["finished"] and saved["step"] == 9
    tiny.remove_adapter("ckpt")

    steps = []
    examples, _ = build_examples(tiny, records(12), CFG, P)
    add_lora(tiny, "ckpt", CFG, seed=7)
    got = fit(tiny, examples, CFG, adapter="ckpt", terms=[L2Term()], seed=3, progress=False,
              checkpoint=FitCheckpoint(path, every_seconds=3600, keep_final=True), on_step=steps.append)
    assert f"fit checkpoint {path}: this training had finished (step 9)" in capsys.readouterr().err
    assert steps == []  # no optimizer step ran
    got_weights = adapter_parameters(tiny.peft, "ckpt")
    assert all(torch.equal(got_weights[n], want_weights[n]) for n in want_weights)
    assert (got.steps, got.loss_curve, got.term_means, got.final_loss) == (want.steps, want.loss_curve,
                                                                          want.term_means, want.final_loss)
    assert first.loss_curve == want.loss_curve
    assert path.is_file()  # still its owner's to remove
