"""Context sentences: what a request asks for, told from the scene around it."""
import numpy as np
import pytest

from skillbank.errors import SelectorError
from skillbank.memory.context import directive, scene_sentences, sentences, split_context
from skillbank.memory.selector import load_selector, make_selector


def test_sentences_keep_quotes_abbreviations_and_lines():
    q = 'Dr. Okafor wrote "Take one. Then rest!" to me. Can you read it out?\n- slowly\n- twice'
    assert sentences(q) == ['Dr. Okafor wrote "Take one. Then rest!" to me.', "Can you read it out?", "- slowly",
                            "- twice"]
    assert sentences("  ") == []


@pytest.mark.parametrize("request_, ask, scene", [
    ("I'm editing some footage for my channel. When you get a chance, print contract_8.docx.",
     "When you get a chance, print contract_8.docx.", "I'm editing some footage for my channel."),
    ("My daughter wants to sign up for Intro to Astronomy. Can you do the registration for her?",
     "Can you do the registration for her?", "My daughter wants to sign up for Intro to Astronomy."),
    ("So my neighbour is Japanese. I'd like to thank her: turn 'you are kind' into Japanese.",
     "I'd like to thank her: turn 'you are kind' into Japanese.", "So my neighbour is Japanese."),
])
def test_scene_is_split_from_the_request(request_, ask, scene):
    assert split_context(request_) == (ask, scene)
    assert scene_sentences(request_) == [scene]
    assert directive(ask) == ask  # idempotent: what asks is read whole


@pytest.mark.parametrize("request_", [
    "set an alarm for 6:15",                                       # one sentence
    "Translate 'I am late. Sorry!' into French. Then read it out.",  # every sentence asks
    "The printer is broken. My boss is angry.",                     # none does: not dropped on a guess
    'Post this: "I think we did it. We really did."',               # "I", "we" only inside the quote
])
def test_requests_read_whole_when_nothing_or_everything_asks(request_):
    assert split_context(request_) == (request_, "") and scene_sentences(request_) == []


def test_router_reads_what_is_asked(small_stream):
    keys = small_stream.family_keys[:2]
    sel = make_selector("embed-lda-nb", payload_min_words=6, drop_context=True)
    whole = make_selector("embed-lda-nb", payload_min_words=6)
    for k in keys:
        reqs = [r.request for r in small_stream.train[k]]
        sel.partial_fit(reqs, k)
        whole.partial_fit(reqs, k)
    asked = small_stream.test[keys[0]][0].request
    scene = "The image on my screen keeps freezing and my phone is almost out of battery."
    # a declarative opening sentence changes nothing for the router that drops it, and something for the other
    np.testing.assert_allclose(sel.decision_function([f"{scene} {asked}"]), sel.decision_function([asked]), rtol=1e-9)
    assert np.abs(whole.decision_function([f"{scene} {asked}"]) - whole.decision_function([asked])).max() > 1e-3
    assert sel.get_params()["drop_context"] is True and "drop_context" not in whole.get_params()
    with pytest.raises(SelectorError, match="drop_context"):
        make_selector("embed-lda-nb", drop_context="yes")


def test_router_option_saved_and_absent_in_older_states(tmp_path, small_stream):
    key = small_stream.family_keys[0]
    sel = make_selector("embed-lda-nb", drop_context=True)
    sel.partial_fit([r.request for r in small_stream.train[key]], key)
    sel.save(tmp_path / "new")
    assert load_selector(tmp_path / "new").drop_context is True
    old = make_selector("embed-lda-nb")  # what a state saved before the option holds: no such parameter
    old.partial_fit([r.request for r in small_stream.train[key]], key)
    old.save(tmp_path / "old")
    assert load_selector(tmp_path / "old").drop_context is False
