"""llama.cpp's encodings chosen by timing them on this machine: cached with the CPU, llama.cpp's version and the
thread count; a failed timing falls back to Q8_0 and says so once; a forced encoding is honoured with a warning
where this CPU measured another clearly faster."""
from __future__ import annotations

import json

import pytest

from skillbank.errors import ModelError
from skillbank.model import encoding_choice as ec


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache root, no choice remembered by this process, nothing said yet, no forced encoding."""
    monkeypatch.setenv("SKILLBANK_CACHE", str(tmp_path))
    monkeypatch.delenv(ec.ENV, raising=False)
    monkeypatch.setattr(ec, "_memo", {})
    monkeypatch.setattr(ec, "_said", set())
    ec.warn_if_slower.cache_clear()
    timings = []

    def fake_measure(gguf, threads, **kw):
        timings.append(threads)
        return ec.EncodingChoice(threads=threads, chosen={1: "q8_0", 2: "q8_0", 4: "bf16", 16: "bf16"},
                                 tokens_per_s={"q8_0": {1: 90.0, 2: 150.0, 4: 200.0, 16: 300.0},
                                               "bf16": {1: 70.0, 2: 149.0, 4: 260.0, 16: 510.0}},
                                 cpu=ec.cpu_identity(), llama_cpp=ec.llama_cpp_version())

    monkeypatch.setattr(ec, "measure", fake_measure)
    yield timings
    ec.warn_if_slower.cache_clear()


def test_a_choice_is_measured_once_per_cpu_version_and_threads(fresh, monkeypatch, capsys):
    choice = ec.measured_choice(2)
    assert [choice.for_rows(r) for r in (1, 2, 3, 4, 8, 16, 64)] == ["q8_0", "q8_0", "q8_0", "bf16", "bf16", "bf16",
                                                                     "bf16"]
    assert "timing llama.cpp's encodings" in capsys.readouterr().err
    monkeypatch.setattr(ec, "_memo", {})  # a new process: read from the cache, not timed again
    assert ec.measured_choice(2).chosen == choice.chosen and fresh == [2]
    ec.measured_choice(1)  # another thread count is its own measurement, kept beside the first
    assert fresh == [2, 1]
    saved = json.loads(ec.cache_path().read_text())
    assert set(saved["by_threads"]) == {"1", "2"} and saved["cpu"] == ec.cpu_identity()
    # measured on another CPU (or another llama.cpp): ignored and remade
    saved["cpu"] = "some other CPU [x86_64: avx512f]"
    ec.cache_path().write_text(json.dumps(saved))
    monkeypatch.setattr(ec, "_memo", {})
    ec.measured_choice(2)
    assert fresh == [2, 1, 2]
    assert json.loads(ec.cache_path().read_text())["cpu"] == ec.cpu_identity()
    monkeypatch.setattr(ec, "llama_cpp_version", lambda: "0.0.0-other")
    monkeypatch.setattr(ec, "_memo", {})
    ec.measured_choice(2)
    assert fresh == [2, 1, 2, 2]
    ec.cache_path().write_text("{not json")  # a damaged cache file: measured again, not an error
    monkeypatch.setattr(ec, "_memo", {})
    ec.measured_choice(2)
    assert len(fresh) == 5


def test_a_failed_timing_falls_back_to_q8_0_and_says_so_once(fresh, monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("llama_decode returned -3")

    monkeypatch.setattr(ec, "measure", broken)
    choice = ec.measured_choice(2)
    assert {choice.for_rows(r) for r in (1, 2, 16)} == {"q8_0"} and "llama_decode returned -3" in choice.failed
    monkeypatch.setattr(ec, "_memo", {})
    assert ec.measured_choice(2).failed  # cached: not timed and not said again
    err = capsys.readouterr().err
    assert err.count("Q8_0 at every width: timing the encodings failed") == 1

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ec, "measure", interrupted)
    monkeypatch.setattr(ec, "_memo", {})
    choice = ec.measured_choice(3)
    assert choice.failed == "interrupted" and choice.for_rows(16) == "q8_0"
    assert "3" not in json.loads(ec.cache_path().read_text())["by_threads"]  # the next process times again


def test_a_forced_encoding_is_honoured_with_a_warning_naming_the_faster_one(fresh, monkeypatch, capsys):
    from skillbank.model.llamacpp import encoding_for

    monkeypatch.setenv(ec.ENV, "q8_0")
    assert [encoding_for(r, 2) for r in (1, 16)] == ["q8_0", "q8_0"]
    err = capsys.readouterr().err
    assert "SKILLBANK_LLAMACPP_ENCODING=q8_0 is honoured, but on this CPU bf16 decoded 1.30x" in err
    monkeypatch.setenv(ec.ENV, "bf16")
    assert encoding_for(1, 2) == "bf16"
    assert "q8_0 decoded 1.29x as fast at 1 row(s)" in capsys.readouterr().err
    monkeypatch.setenv(ec.ENV, "auto")
    assert [encoding_for(r, 2) for r in (1, 16)] == ["q8_0", "bf16"]
    monkeypatch.setenv(ec.ENV, "int4")
    with pytest.raises(ModelError, match=r"SKILLBANK_LLAMACPP_ENCODING='int4': expected auto or one of"):
        encoding_for(1, 2)


def test_the_choice_keeps_q8_0_unless_another_is_clearly_faster():
    choice = ec.EncodingChoice(threads=2, chosen={1: "q8_0", 16: "bf16"},
                               tokens_per_s={"q8_0": {1: 90.0, 16: 300.0}, "bf16": {1: 70.0, 16: 510.0}})
    assert "16 row(s) a pass: bf16 (bf16 510, q8_0 300 tokens/s)" in choice.why()
    back = ec.EncodingChoice.from_json(json.loads(json.dumps(choice.to_json())))
    assert back == choice


@pytest.mark.real_model
def test_timing_the_encodings_of_the_embedded_base(tmp_path):
    """The real timing on the shipped GGUF, shortened: every width gets an encoding llama.cpp decoded, each
    encoding's rate is measured at each width, and a batch of 16 rows decodes more tokens/s than one row."""
    pytest.importorskip("llama_cpp")
    from skillbank.model.embedded import embedded_gguf_path
    from skillbank.model.llamacpp import ENCODINGS

    choice = ec.measure(embedded_gguf_path(), 1, widths=(1, 16), passes=2, rounds=1)
    assert set(choice.chosen) == {1, 16} and set(choice.chosen.values()) <= set(ENCODINGS)
    assert set(choice.tokens_per_s) == set(ENCODINGS)
    for rates in choice.tokens_per_s.values():
        assert rates[16] > rates[1] > 0
    assert choice.cpu == ec.cpu_identity() and not choice.failed


def test_doctor_shows_the_cpu_threads_and_the_measured_choice(fresh, monkeypatch):
    import json as json_

    from typer.testing import CliRunner

    from skillbank.cli import app
    from skillbank.model import llamacpp

    monkeypatch.setattr(llamacpp, "available", lambda: None)
    monkeypatch.setattr(llamacpp, "cpu_features", lambda: "AVX2 = 1 | FMA = 1 |")
    r = CliRunner().invoke(app, ["doctor", "--threads", "3", "--json"])
    assert r.exit_code == 0, r.output
    report = json_.loads(r.stdout)  # the timing notice goes to stderr
    assert report["threads"] == 3 and report["threads_why"] == "3 (--threads)" and report["cpu"] == ec.cpu_identity()
    assert report["encodings"]["chosen"] == {"1": "q8_0", "2": "q8_0", "4": "bf16", "16": "bf16"} and fresh == [3]
    text = CliRunner().invoke(app, ["doctor", "--threads", "3"]).output
    assert "16 row(s) a pass: bf16 (bf16 510, q8_0 300 tokens/s)" in text and fresh == [3]  # cached: not timed again
    monkeypatch.setattr(llamacpp, "available", lambda: "llama-cpp-python is not installed")
    assert "plans use the torch engine" in CliRunner().invoke(app, ["doctor"]).output
