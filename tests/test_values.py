"""Argument values in requests (skillbank.memory.values) and the scope detector's value reader."""
from __future__ import annotations

import json

import numpy as np
import pytest

from skillbank.memory.scope import ScopeDetector
from skillbank.memory.values import ValueVocabulary, mask, mask_payloads, mask_record


@pytest.mark.parametrize("request_, kinds, intent", [
    ("colorize ~/Pictures/IMG_2231.HEIC pls", ["image"], "colorize pls"),
    ("email anna@x.com the link https://foo.com/a?b=1 at 5pm on March 3rd",
     ["email", "url", "time", "date"], "email the link at"),
    ("Translate this into German: The meeting moved to Thursday because the room is booked.",
     ["name", "text"], "Translate this into : ."),
    ("call +1 415 555 0193 tomorrow", ["phone", "date"], "call"),
    ("play \"Dancing Queen\"", ["text"], "play"),
    ("transcribe podcast_12.mp3 and meeting.wav", ["audio", "audio"], "transcribe and"),
    ("It's Bob's birthday, send him 'happy birthday!'", ["name", "text"], "It's birthday, send him"),
])
def test_values_are_found_from_the_request_alone(request_, kinds, intent):
    m = mask(request_)
    assert [k for k, _ in m.values] == kinds
    assert " ".join(m.intent.split()) == intent
    # what the encoder reads keeps the sentence readable; the word statistics see typed placeholders
    assert "xtext" not in m.prose and all(t not in m.intent for t in ("xtext", "ximage", "xurl"))


def test_a_payload_after_an_introducing_colon_or_line_is_one_value():
    m = mask("summarize\n\nThe quarterly report shows revenue grew by 12% over the last year.\n\nthanks")
    assert m.values == [("text", "The quarterly report shows revenue grew by 12% over the last year")]
    # a colon that introduces instructions, not a value, masks nothing
    assert mask("two things: set an alarm and check the weather").values == []


def test_gold_values_are_masked_exactly_and_learned_as_value_words():
    records = [(f"sell my {item} on eBay", [item, "eBay"]) for item in ("sofa", "sofa", "sofa", "bike")]
    masked = [mask_record(r, v) for r, v in records]
    assert masked[0].intent.split() == ["sell", "my", "on"]
    vocab = ValueVocabulary().partial_fit(masked, "shop")
    assert vocab.is_value_word("sofa") and not vocab.is_value_word("bike")  # seen once: not enough
    assert not vocab.is_value_word("sell") and vocab.is_intent_word("sell")
    # learned value words are masked at plan time too
    assert mask("sell the sofa", vocab).intent.split() == ["sell", "the"]


def test_a_payload_does_not_count_against_its_family():
    tr = ["translate 'hello there' into French", "translate 'good morning' into Spanish",
          "please translate 'where is the station' into German", "translate 'thank you very much' to Italian"]
    values = [["hello there", "French"], ["good morning", "Spanish"], ["where is the station", "German"],
              ["thank you very much", "Italian"]]
    raw = ScopeDetector(encoder=None, reader="raw").partial_fit(tr, "lang")
    read = ScopeDetector(encoder=None).partial_fit(tr, "lang", values=values)
    short = "translate 'cat' into Dutch"
    long_ = ("translate 'the quarterly revenue of the cooperative grew despite supply chain disruption in the "
             "northern provinces' into Dutch")
    # whole requests: the long payload's unseen words sink the score; read for intent, both score alike
    assert raw.score([long_])[0, 0] < raw.score([short])[0, 0] - 5
    assert read.score([long_])[0, 0] == pytest.approx(read.score([short])[0, 0])


def test_value_reader_forgets_exactly_round_trips_and_old_state_reads_whole(tmp_path):
    music = ["play 'Dancing Queen' by ABBA", "play the song 'Yesterday'", "skip this song", "shuffle my playlist"]
    maps = ["route me to 12 Main Street", "how far is Lyon by car", "navigate home avoiding tolls"]
    both = ScopeDetector(encoder=None).partial_fit(music, "music").partial_fit(maps, "maps")
    alone = ScopeDetector(encoder=None).partial_fit(music, "music")
    both.forget("maps")
    probe = music + maps + ["thanks"]
    np.testing.assert_allclose(both.score(probe), alone.score(probe))
    assert both.vocabulary_.classes_ == ["music"]
    both.save(tmp_path / "s")
    back = ScopeDetector.load(tmp_path / "s")
    assert back.reader == "values"
    np.testing.assert_allclose(back.score(probe), both.score(probe))
    # statistics saved before the value reader existed name no reader: they read requests whole
    meta = json.loads((tmp_path / "s" / "scope.json").read_text())
    del meta["params"]["reader"]
    (tmp_path / "s" / "scope.json").write_text(json.dumps(meta))
    assert ScopeDetector.load(tmp_path / "s").reader == "raw"
    # a value vocabulary that is missing is named
    meta["params"]["reader"] = "values"
    (tmp_path / "s" / "scope.json").write_text(json.dumps(meta))
    (tmp_path / "s" / "scope-values.json").unlink()
    with pytest.raises(Exception, match="scope-values.json"):
        ScopeDetector.load(tmp_path / "s")


def test_word_evidence_names_the_words_that_counted():
    det = ScopeDetector(encoder=None).partial_fit(["set an alarm for 7am", "set my alarm for 6:30",
                                                   "wake me up with an alarm at 9"], "clock")
    evidence = dict(det.word_evidence("please set an alarm at 5am", "clock"))
    assert max(evidence, key=evidence.get) == "alarm" and "5am" not in evidence
    assert det.unseen_words("please cancel the alarm at 5am", "clock") == ["please", "cancel", "the"]
    with pytest.raises(Exception, match="no family"):
        det.word_evidence("x", "nope")


def test_requests_that_are_all_payload_or_empty_score_as_explained_by_nothing():
    det = ScopeDetector(encoder=None).partial_fit(["set an alarm for 7am", "set my alarm for 6:30"], "clock")
    scores = det.score(["\"just a quote\"", "https://example.com/x", "😀", "x" * 20000])
    assert not np.isfinite(scores[:3]).any()
    assert not det.predict(["\"just a quote\"", "https://example.com/x"]).any()


def test_skill_prototypes_forget_exactly_round_trip_and_travel_with_a_family(tmp_path):
    music = ["play 'Dancing Queen' by ABBA", "play the song 'Yesterday'", "skip this song", "skip to the next track"]
    music_skills = [["play"], ["play"], ["skip"], ["skip"]]
    maps = ["route me to 12 Main Street", "navigate home avoiding tolls", "how long is the drive to Lyon"]
    maps_skills = [["route"], ["route"], ["eta"]]
    both = (ScopeDetector(quantile=0.3).partial_fit(music, "music", skills=music_skills)
            .partial_fit(maps, "maps", skills=maps_skills))
    assert both.skill_names_ == {"music": ["play", "skip"], "maps": ["route", "eta"]}
    # a request is compared with each skill's mean and the family keeps the best
    e = both._embed(["skip the next song"])[0]
    protos = both.skill_sums_["music"] / np.linalg.norm(both.skill_sums_["music"], axis=1, keepdims=True)
    assert both.embedding_scores(["skip the next song"])[0, 0] == pytest.approx(float((protos @ e).max()), abs=1e-6)
    alone = ScopeDetector(quantile=0.3).partial_fit(music, "music", skills=music_skills)
    probe = music + maps + ["thanks"]
    forgot = ScopeDetector.load(_saved(both, tmp_path / "a")).forget("maps")
    np.testing.assert_allclose(forgot.score(probe), alone.score(probe))
    assert forgot.threshold_ == pytest.approx(alone.threshold_)
    moved = ScopeDetector(quantile=0.3).partial_fit(music, "music", skills=music_skills).add_family(
        both.family_detector("maps"), "maps")
    np.testing.assert_allclose(moved.score(probe), both.score(probe))


def _saved(det, path):
    det.save(path)
    return path


def test_forgetting_an_earlier_family_leaves_a_later_one_as_if_learned_alone():
    # a family's statistics must not read what was learned before it (its values are masked with its own
    # vocabulary, its training scores count its own words), or forget would not be exact
    maps = ["route me to Main Street", "navigate home avoiding tolls", "how long is the drive to Lyon",
            "directions to Main Street", "route to Lyon please"]
    music = ["play the song 'Yesterday'", "skip this song", "play some Lyon jazz", "play Main Street blues"]
    skills = [["play"], ["skip"], ["play"], ["play"]]
    values = [["Yesterday"], [], ["Lyon jazz"], ["Main Street blues"]]
    later = (ScopeDetector(quantile=0.3).partial_fit(maps, "maps", values=[["Main Street"], [], ["Lyon"],
                                                                           ["Main Street"], ["Lyon"]])
             .partial_fit(music, "music", values=values, skills=skills)).forget("maps")
    alone = ScopeDetector(quantile=0.3).partial_fit(music, "music", values=values, skills=skills)
    probe = maps + music + ["what is the capital of France"]
    np.testing.assert_allclose(later.score(probe), alone.score(probe))
    assert later.threshold_ == alone.threshold_


def test_a_router_reads_past_long_payloads_only():
    long = "Translate to Spanish for the taxi driver: 'Please take me to the hotel, and call my wife if there is a problem'"
    assert mask_payloads(long, 6) == "Translate to Spanish for the taxi driver: xtext"
    assert mask_payloads("summarize this:\nThe industrial revolution changed how goods were made and how people lived", 6) \
        == "summarize this:\n xtext"
    # short values stay: they say which family serves the request
    for kept in ("add reverb to song.wav", "say 'hi there' to Bob", "weather in Lyon tomorrow", ""):
        assert mask_payloads(kept, 6) == kept
    assert mask_payloads("say 'hi there' to Bob", 1) == "say xtext to Bob"


def test_sentence_starts_are_read_as_the_anchored_pattern_read_them():
    """The backwards reading replaced a pattern anchored at the end of the prefix (quadratic in a long request);
    it must decide exactly as that pattern did, at every position of strings made of the characters it reads."""
    import random
    import re

    from skillbank.memory.values import _starts_sentence
    spec = re.compile(r"(?:^|[.!?:;\n]\s*|[\"“(\[]\s*)$")
    rng = random.Random(0)
    alphabet = list("ab .!?:;\n\t\"“([)x,")
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        for pos in range(len(text) + 1):
            assert _starts_sentence(text, pos) == bool(spec.search(text[:pos])), (text, pos)

