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
    """Word statistics alone unless ``encoder`` is given (the hand computations below are of words)."""
    det = ScopeDetector(**{"encoder": None, "reader": "raw", **kw})
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


@pytest.mark.parametrize("encoder", [None, "minilm"])
def test_add_family_equals_learning_it(encoder):
    """A family added from exported statistics scores and thresholds exactly as if it had been learned here."""
    det = ScopeDetector(quantile=0.3, encoder=encoder, reader="raw").partial_fit(MUSIC, "music")
    before = det.threshold_
    ref = fitted(quantile=0.3, encoder=encoder)
    det.add_family(ref.family_detector("maps"), "maps")
    probe = MUSIC + MAPS + ["what is the capital of France?"]
    np.testing.assert_allclose(det.score(probe), ref.score(probe))
    assert det.threshold_ == pytest.approx(ref.threshold_) and det.threshold_ != before
    with pytest.raises(SelectorError, match="already has a family 'maps'"):
        det.add_family(ref, "maps")
    with pytest.raises(SelectorError, match="other settings"):
        ScopeDetector(quantile=0.3, encoder=None if encoder else "minilm", reader="raw").add_family(ref, "maps")


def test_bad_parameters_and_state():
    with pytest.raises(SelectorError, match="lam"):
        ScopeDetector(lam=1.0)
    with pytest.raises(SelectorError, match="quantile"):
        ScopeDetector(quantile=0.7)
    with pytest.raises(SelectorError, match="not learned"):
        ScopeDetector(reader="raw").score(["x"])
    with pytest.raises(SelectorError, match="no family"):
        fitted().forget("nope")
    with pytest.raises(SelectorError, match="encoder must be"):
        ScopeDetector(encoder="  ")
    with pytest.raises(SelectorError, match="no encoder"):
        fitted().embedding_scores(["x"])


# -- with the sentence encoder (the default) -------------------------------------------------------
def embed(texts):
    from skillbank.memory.selectors.embedding import get_encoder
    return get_encoder("minilm").encode(texts).astype(float)


def test_encoder_score_is_the_mean_of_both_standardised_experts():
    det = fitted(encoder="minilm")
    assert ScopeDetector().encoder == "minilm"  # the default
    # leave-one-out cosine of a training request: against its family's mean without it
    E = embed(MUSIC)
    rest = E.sum(axis=0) - E[2]
    np.testing.assert_allclose(det.train_embedding_scores_["music"][2], E[2] @ rest / np.linalg.norm(rest))
    words = np.concatenate([det.train_scores_[k] for k in det.classes_])
    cosines = np.concatenate([det.train_embedding_scores_[k] for k in det.classes_])

    def standardise(x, ref):
        return (x - np.median(ref)) / (np.median(ref) - np.quantile(ref, 0.05))

    probe = ["play something by Nina Simone", "who wrote Hamlet", "route me home avoiding tolls"]
    means = np.stack([embed(MUSIC).sum(axis=0), embed(MAPS).sum(axis=0)])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    want = 0.5 * standardise(det.word_scores(probe), words) + 0.5 * standardise(embed(probe) @ means.T, cosines)
    np.testing.assert_allclose(det.score(probe), want, rtol=1e-6)
    kept = 0.5 * standardise(words, words) + 0.5 * standardise(cosines, cosines)
    assert det.threshold_ == pytest.approx(np.quantile(kept, det.quantile))
    assert det.predict(["skip to the next song"]).all() and not det.predict(["who wrote Hamlet"]).any()


def test_encoder_statistics_forget_exactly_and_round_trip(tmp_path):
    both, music = fitted(encoder="minilm"), ScopeDetector(encoder="minilm", reader="raw").partial_fit(MUSIC, "music")
    both.forget("maps")
    probe = MUSIC + MAPS + ["hello"]
    np.testing.assert_allclose(both.score(probe), music.score(probe))
    assert both.threshold_ == pytest.approx(music.threshold_)
    det = fitted(encoder="minilm")
    det.save(tmp_path / "s")
    back = ScopeDetector.load(tmp_path / "s")
    assert back.get_params() == det.get_params()
    np.testing.assert_allclose(back.score(probe), det.score(probe))
    assert back.threshold_ == det.threshold_


def test_state_saved_before_the_encoder_loads_as_word_statistics(tmp_path):
    import json
    det = fitted()
    det.save(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "scope.json").read_text())
    del meta["params"]["encoder"]  # what a bank written before the encoder existed holds
    (tmp_path / "s" / "scope.json").write_text(json.dumps(meta))
    back = ScopeDetector.load(tmp_path / "s")
    assert back.encoder is None
    np.testing.assert_allclose(back.score(MUSIC), det.score(MUSIC))


def test_a_family_of_one_request_has_no_leave_one_out_embedding_score():
    det = ScopeDetector(reader="raw").partial_fit(["skip this song"], "music").partial_fit(MAPS, "maps")
    assert np.isnan(det.train_embedding_scores_["music"]).all()
    assert np.isfinite(det.threshold_) and np.isfinite(det.training_scores()).all()
    assert np.isfinite(det.score(["skip this song"])).all()
    # no family with two requests: the words alone set the threshold, which stays a number
    lone = ScopeDetector(reader="raw").partial_fit(["skip this song"], "music").partial_fit(["route me home"], "maps")
    assert np.isfinite(lone.threshold_)


def test_scope_evidence_script_prints_every_pair_and_score(tmp_path, small_stream, capsys, monkeypatch):
    import json
    import sys
    from pathlib import Path

    from skillbank.experiments import scope_evidence

    small_stream.save(tmp_path / "stream")
    fixtures = Path(__file__).resolve().parent / "fixtures"
    off = tmp_path / "off.jsonl"
    off.write_text("".join(json.dumps({"request": r, "category": "misc"}) + "\n"
                           for r in ["what is the capital of France?", "hello there", "🙂"]))
    monkeypatch.setattr(sys, "argv", ["scope_evidence.py", "--stream", str(tmp_path / "stream"),
                                      "--records", str(fixtures / "paraphrase_builtin_holdout.jsonl"),
                                      "--offdomain", str(off)])
    scope_evidence.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if "paraphrase_builtin_holdout vs off" in line]
    assert [r.split(" | ")[1] for r in rows] == ["words alone", "sentence embedding alone", "both (the detector's default)"]
    for row in rows:
        auc = float(row.split(" | ")[2])
        assert 0.0 <= auc <= 1.0


def test_statistics_from_other_encoder_weights_are_refused(tmp_path):
    det = fitted(encoder="minilm")
    assert det.encoder_digest_.startswith("sha256:")
    det.save(tmp_path / "s")
    back = ScopeDetector.load(tmp_path / "s")
    assert back.encoder_digest_ == det.encoder_digest_
    back.encoder_digest_ = "sha256:" + "0" * 64  # as if made with another version of the encoder
    with pytest.raises(SelectorError, match="another version"):
        back.score(["skip this song"])
    with pytest.raises(SelectorError, match="other encoder weights"):
        ScopeDetector(encoder="minilm", reader="raw").partial_fit(MAPS, "maps").add_family(back, "music")


def test_scope_report_names_the_refused_in_domain_and_accepted_off_domain_requests():
    from skillbank.experiments.scope import evaluate_scope
    from skillbank.report.scope import render_markdown

    det = fitted()
    inside = ["skip to the next song", "who wrote Hamlet", "how long is the drive to Bern"]
    outside = [("asdf", "general_question"), ("play some jazz", "missing_tool")]
    result = evaluate_scope(det, {"hand": inside}, {"off": outside}, source="test")
    s_in, s_out = det.score(inside).max(axis=1), det.score([r for r, _ in outside]).max(axis=1)
    refused = [r for r, v in sorted(zip(inside, s_in), key=lambda t: t[1]) if v < det.threshold_]
    accepted = [r for (r, _), v in sorted(zip(outside, s_out), key=lambda t: -t[1]) if v >= det.threshold_]
    assert refused == ["who wrote Hamlet"] and accepted[0] == "play some jazz"  # highest first
    assert result["in_domain"]["hand"]["refused_examples"] == refused
    assert result["off_domain"]["off"]["accepted_examples"] == accepted
    md = render_markdown(result)
    assert "In-domain requests of hand refused" in md and "- who wrote Hamlet" in md
    assert "Off-domain requests of off still accepted" in md and "- play some jazz" in md
