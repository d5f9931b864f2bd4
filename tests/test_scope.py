"""The scope detector on its own: scores by hand, leave-one-out threshold, exact forget, save/load; and the
script that compares its evidence with a sentence encoder's."""
import numpy as np
import pytest

from skillbank.errors import SelectorError
from skillbank.memory.scope import ScopeDetector, background, catalog_text

MUSIC = ["play some jazz on the kitchen speaker", "skip this song", "play the next album by Miles Davis",
         "turn the music up", "queue three songs by Nina Simone"]
MAPS = ["how long is the drive to Lyon", "route me to the nearest pharmacy", "avoid tolls on the drive to Bern",
        "show traffic on the way home", "how far is the airport by car"]


def fitted(**kw):
    det = ScopeDetector(**kw)
    det.partial_fit(MUSIC, "music")
    det.partial_fit(MAPS, "maps")
    return det


def test_score_matches_a_hand_computation():
    det = fitted()
    req = "play jazz please"
    bg = det.background_.astype(float)
    np.testing.assert_allclose(bg, background(det.n_features), rtol=1e-6)  # wordfreq's list, kept as float32
    idx = det._vec.transform([req]).indices
    want = []
    for c in range(2):
        row = det.counts_[c].toarray().ravel()
        want.append(sum(np.log(0.5 * row[i] / row.sum() / bg[i] + 0.5) for i in idx))
    np.testing.assert_allclose(det.score([req])[0], want)
    assert det.score([req])[0, 0] > det.score([req])[0, 1]  # "play", "jazz" are music words


def test_out_of_domain_requests_are_refused_and_in_domain_kept():
    det = fitted()
    inside = det.score(["skip to the next song", "how long is the drive to Bern"]).max(axis=1)
    outside = det.score(["what is the capital of France?", "asdf", "😀😀", "who wrote Hamlet"]).max(axis=1)
    # general English explains the off-domain requests better than either family (score < 0)
    assert (inside > 10).all() and (outside < 0).all()
    assert det.predict(["skip to the next song"]).all()
    # no words at all is -inf, never in scope
    assert det.score(["😀"])[0].max() == -np.inf


def test_threshold_is_the_leave_one_out_quantile():
    det = fitted(quantile=0.2)
    loo = np.concatenate([det.train_scores_["music"], det.train_scores_["maps"]])
    assert det.threshold_ == pytest.approx(np.quantile(loo, 0.2))
    # leave-one-out: a request's score without its own counts is below its score with them
    with_own = det.score(MUSIC)[:, 0]
    assert (det.train_scores_["music"] < with_own).all()


def fresh_threshold(det):
    return np.quantile(np.concatenate(list(det.train_scores_.values())), det.quantile)


def test_forget_is_exact_and_state_round_trips(tmp_path):
    det = fitted(quantile=0.3)
    assert det.threshold_ == pytest.approx(fresh_threshold(det))  # now cached: every update must reset it
    det.partial_fit(["add milk to the shopping list"], "lists", catalog_text([{"name": "add_item", "description":
                    "Add an item to a shopping list", "arguments": [{"name": "item", "description": "what"}]}]))
    assert det.threshold_ == pytest.approx(fresh_threshold(det))
    det.forget("lists")
    assert det.threshold_ == pytest.approx(fresh_threshold(det))
    ref = fitted(quantile=0.3)
    probe = MUSIC + MAPS + ["add eggs to my list"]
    np.testing.assert_allclose(det.score(probe), ref.score(probe))
    assert det.threshold_ == pytest.approx(ref.threshold_)
    det.save(tmp_path / "s")
    back = ScopeDetector.load(tmp_path / "s")
    np.testing.assert_allclose(back.score(probe), det.score(probe))
    assert back.threshold_ == det.threshold_ and back.get_params() == det.get_params()


def test_add_family_equals_learning_it():
    """A family added from exported statistics scores and thresholds exactly as if it had been learned here."""
    det = ScopeDetector(quantile=0.3).partial_fit(MUSIC, "music")
    before = det.threshold_
    ref = fitted(quantile=0.3)
    det.add_family("maps", ref.counts_[[1]], ref.train_scores_["maps"])
    probe = MUSIC + MAPS + ["what is the capital of France?"]
    np.testing.assert_allclose(det.score(probe), ref.score(probe))
    assert det.threshold_ == pytest.approx(ref.threshold_) and det.threshold_ != before
    with pytest.raises(SelectorError, match="already has a family 'maps'"):
        det.add_family("maps", ref.counts_[[1]], ref.train_scores_["maps"])


def test_bad_parameters_and_state():
    with pytest.raises(SelectorError, match="lam"):
        ScopeDetector(lam=1.0)
    with pytest.raises(SelectorError, match="quantile"):
        ScopeDetector(quantile=0.7)
    with pytest.raises(SelectorError, match="not learned"):
        ScopeDetector().score(["x"])
    with pytest.raises(SelectorError, match="no family"):
        fitted().forget("nope")


def test_scope_evidence_script_prints_every_pair_and_score(tmp_path, small_stream, capsys, monkeypatch):
    import json
    import runpy
    import sys
    from pathlib import Path

    small_stream.save(tmp_path / "stream")
    fixtures = Path(__file__).resolve().parent / "fixtures"
    off = tmp_path / "off.jsonl"
    off.write_text("".join(json.dumps({"request": r, "category": "misc"}) + "\n"
                           for r in ["what is the capital of France?", "hello there", "🙂"]))
    script = Path(__file__).resolve().parents[1] / "scripts" / "scope_evidence.py"
    monkeypatch.setattr(sys, "argv", ["scope_evidence.py", "--stream", str(tmp_path / "stream"),
                                      "--records", str(fixtures / "paraphrase_builtin_holdout.jsonl"),
                                      "--offdomain", str(off)])
    runpy.run_path(str(script), run_name="__main__")
    rows = [line for line in capsys.readouterr().out.splitlines() if "paraphrase_builtin_holdout vs off" in line]
    assert [r.split(" | ")[1] for r in rows] == ["words (the scope detector)", "MiniLM cosine to family mean"]
    for row in rows:
        auc = float(row.split(" | ")[2])
        assert 0.0 <= auc <= 1.0
