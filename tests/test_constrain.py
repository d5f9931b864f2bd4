"""Structured decoding: each shard's grammar accepts every gold graph of its family and nothing off-catalog;
constrained rows of different shards share a batch; failures are invalid plans with the reason."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from skillbank.data.builtin import build_builtin_stream
from skillbank.errors import BankError
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.model.constrain import (SkillSpec, allowed_tokens, build_grammar, grammar_cache,
                                       specs_from_skills_json)
from skillbank.model.decode import RowBatch
from skillbank.model.generate import generate, generate_for_requests
from skillbank.model.prompts import render_prompt
from skillbank.model.serialization import decode_output, encode
from skillbank.train.executor import common_prefix

from conftest import TASKBENCH_FIXTURE


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


@pytest.fixture(scope="module")
def stream():
    return build_builtin_stream(seed=0, train_per_family=40, test_per_family=10)


def family_grammar(catalog, family, fmt, **kw):
    ids = catalog.family(family).skills
    specs = [SkillSpec(s, catalog.skills[s].argument_names) for s in ids]
    return build_grammar(specs, fmt, common_prefix(sorted(ids)), **kw), common_prefix(sorted(ids))


def accepts(tiny, grammar, text: str) -> bool:
    """Whether the grammar lets a row write ``text`` (in the tokenizer's own tokenization) and then stop."""
    cache = grammar_cache(tiny.model, tiny.tokenizer)
    matcher = cache.matcher(grammar)
    ids = tiny.tokenizer(text, add_special_tokens=False)["input_ids"] + [cache.stops[0]]
    return all(matcher.consume(t) for t in ids)


@pytest.mark.parametrize("fmt", ["compact", "json"])
def test_every_gold_graph_of_a_family_is_in_its_grammar(tiny, stream, fmt):
    for family in stream.family_keys:
        grammar, prefix = family_grammar(stream.catalog, family, fmt)
        for r in stream.train[family] + stream.test[family]:
            assert accepts(tiny, grammar, encode(r.graph, fmt, prefix)), (family, r.id)


def test_taskbench_gold_graphs_are_in_their_family_grammars(tiny):
    from skillbank.data.taskbench import load_taskbench
    tb = load_taskbench(TASKBENCH_FIXTURE, train_per_family=1000, test_per_family=0)
    n = backward = 0
    for family in tb.family_keys:
        for fmt in ("compact", "json"):
            grammar, prefix = family_grammar(tb.catalog, family, fmt)
            for r in tb.train[family]:
                # Nodes are listed in execution order, so a link goes from an earlier node to a later one; a
                # few TaskBench daily-life graphs list a link against their own node order.
                first = {t: i for i, t in reversed(list(enumerate(r.graph.tasks)))}
                forward = all(first[link.source] < first[link.target] for link in r.graph.canonical_links())
                assert accepts(tiny, grammar, encode(r.graph, fmt, prefix)) == forward, (family, r.id, fmt)
                n += 1
                backward += not forward
    assert n > 300 and backward == 2 * 10  # 10 of the 203 sample graphs, in both formats


def test_grammar_refuses_what_the_shard_does_not_know(tiny, stream):
    family = stream.family_keys[0]  # daily life: compact names like set_alarm{"time":...}
    grammar, prefix = family_grammar(stream.catalog, family, "compact")
    assert accepts(tiny, grammar, 'set_alarm{"time":"07:00"}')
    assert accepts(tiny, grammar, 'set_alarm{}')
    for bad in ['book_table{"time":"07:00"}',                    # a skill no shard has
                'set_alarm{"hour":"07:00"}',                     # an undeclared argument
                'set_alarm{"time":"07:00","time":"08:00"}',      # an argument twice
                'set_alarm{"time":"<node-0>"}',                  # a reference with no earlier node
                'set_alarm{"time":"07:00"}\nset_alarm{"time":"<node-1>"}',  # a self reference
                'set_alarm{"time":"07:00"}\nget_news{"topic":"x"}\n0>0',  # a self-loop
                'set_alarm{"time":"07:00"}\nget_news{"topic":"x"}\n1>0',  # a link against the node order
                'set_alarm{"time":"07:00"}\nset_alarm{"time":"08:00"}',  # a skill twice
                'set_alarm{"time":"07:00"}\nget_news{"topic":"x"}\n0>2',  # a link to a node that is not there
                'set_alarm{"time":"07:00"} thanks!',             # text after the graph
                'Sure! set_alarm{"time":"07:00"}',               # text before it
                '']:
        assert not accepts(tiny, grammar, bad), bad
    assert accepts(tiny, grammar, 'set_alarm{"time":"07:00"}\nget_news{"topic":"x"}\n0>1')


def test_json_grammar_is_the_canonical_contract(tiny, stream):
    family = stream.family_keys[1]
    grammar, _ = family_grammar(stream.catalog, family, "json")
    skill = stream.catalog.family(family).skills[0]
    arg = stream.catalog.skills[skill].argument_names[0]
    node = {"task": skill, "arguments": [{"name": arg, "value": "x"}]}
    good = json.dumps({"task_nodes": [node], "task_links": []}, separators=(",", ":"))
    assert accepts(tiny, grammar, good)
    assert not accepts(tiny, grammar, good.replace(skill, skill + "_v2"))
    assert not accepts(tiny, grammar, json.dumps({"task_nodes": [node], "task_links": []}))  # not compact JSON
    assert not accepts(tiny, grammar, good.replace(f'"name":"{arg}"', '"name":"nope"'))
    other = stream.catalog.family(family).skills[1]
    linked = {"task_nodes": [node, {"task": other, "arguments": []}],
              "task_links": [{"source": skill, "target": other}]}
    assert accepts(tiny, grammar, json.dumps(linked, separators=(",", ":")))
    for links in ([{"source": other, "target": skill}],                       # against the node order
                  [{"source": skill, "target": stream.catalog.family(family).skills[2]}]):  # not a node
        bad = json.dumps({**linked, "task_links": links}, separators=(",", ":"))
        assert not accepts(tiny, grammar, bad), links


def test_copy_constrained_values_must_come_from_the_request(tiny, stream):
    family = stream.family_keys[0]
    request = 'wake me at 07:15 and say "rise & shine"'
    grammar, _ = family_grammar(stream.catalog, family, "compact", copy_from=request)
    assert accepts(tiny, grammar, 'set_alarm{"time":"07:15"}')
    assert not accepts(tiny, grammar, 'set_alarm{"time":"07:51"}')
    assert not accepts(tiny, grammar, 'set_alarm{"time":"7:15 AM"}')


def test_specs_missing_fall_back_to_ids_and_malformed_is_an_error():
    specs, complete = specs_from_skills_json({"skills": ["A::f::x"], "specs": []}, "s.json")
    assert specs == [SkillSpec("A::f::x", None)] and not complete
    specs, complete = specs_from_skills_json(
        {"skills": ["A::f::x"], "specs": [{"id": "A::f::x", "arguments": [{"name": "q"}]}]}, "s.json")
    assert specs == [SkillSpec("A::f::x", ("q",))] and complete
    with pytest.raises(Exception, match="s.json: malformed skills.json"):
        specs_from_skills_json({"skills": "x"}, "s.json")


def test_a_grammar_for_the_whole_catalog_compiles(tiny, stream):
    """100 skills in one grammar (every family together): compiles and accepts a graph of any family."""
    ids = sorted(stream.catalog.skills)
    grammar = build_grammar([SkillSpec(s, stream.catalog.skills[s].argument_names) for s in ids], "compact",
                            common_prefix(ids))
    r = stream.test[stream.family_keys[-1]][0]
    assert len(ids) == 100 and accepts(tiny, grammar, encode(r.graph, "compact", common_prefix(ids)))


def test_constrained_generation_writes_only_its_own_grammar_in_a_mixed_batch(tiny, stream):
    """Rows of two grammars share one batch; each writes only its own family's skills, stops only where
    the graph ends (or reports the cap), and a row's output does not depend on its batch-mates."""
    fams = stream.family_keys[:2]
    grammars = {k: family_grammar(stream.catalog, k, "compact") for k in fams}
    reqs = [(k, r.request) for k in fams for r in stream.test[k][:3]]
    prompts = [render_prompt(tiny.tokenizer, q) for _, q in reqs]
    rules = [grammars[k][0] for k, _ in reqs]
    mixed = generate(tiny.model, tiny.tokenizer, prompts, batch_size=6, max_new_tokens=40, grammars=rules)
    alone = [generate(tiny.model, tiny.tokenizer, [p], batch_size=1, max_new_tokens=40, grammars=[g])[0]
             for p, g in zip(prompts, rules)]
    assert [o.text for o in mixed] == [o.text for o in alone]
    for (k, _), o in zip(reqs, mixed):
        prefix = grammars[k][1]
        parsed = decode_output(o.text, "compact", prefix, stopped=o.stopped, reason=o.reason)
        if o.stopped:
            assert parsed.valid and set(parsed.graph.tasks) <= set(stream.catalog.family(k).skills)
        else:
            assert not parsed.valid and "token cap" in parsed.error and o.n_tokens == 40
        # every prefix the row wrote is inside its grammar: the first line names one of its own skills
        first = o.text.split("{", 1)[0]
        assert any(s.endswith("::" + first) for s in stream.catalog.family(k).skills), o.text


def test_confidence_is_the_models_own_log_probability(tiny, stream):
    """mean_logprob of a constrained row is read from the unconstrained distribution (not renormalised over
    the allowed tokens): teacher-forcing the generated tokens reproduces it."""
    grammar, _ = family_grammar(stream.catalog, stream.family_keys[0], "compact")
    prompt = render_prompt(tiny.tokenizer, stream.test[stream.family_keys[0]][0].request)
    out = generate(tiny.model, tiny.tokenizer, [prompt], max_new_tokens=12, grammars=[grammar])[0]
    p_ids = tiny.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    g_ids = tiny.tokenizer(out.text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p_ids + g_ids])
    with torch.no_grad():
        logp = torch.log_softmax(tiny.model(ids).logits.float(), -1)[0]
    forced = [logp[len(p_ids) - 1 + i, t].item() for i, t in enumerate(g_ids)]
    if len(g_ids) == out.n_tokens:  # the decoded text re-tokenizes to the generated tokens
        assert abs(sum(forced) / len(forced) - out.mean_logprob) < 1e-3
    assert out.mean_logprob < 0


def _random_walk(cache, grammar, rng, structural, snippets, max_tokens: int):
    """Tokens a row following ``grammar`` could write: at each step a random allowed token, drawn half the time
    from ``structural`` (a boolean mask over the vocabulary: quotes, brackets, separators, digits) so that
    strings close and nodes and links appear; now and then one of ``snippets`` (token lists: references,
    links) written for as long as the grammar allows it; a stop token once allowed, more often as the text
    grows. Returns (tokens, stopped)."""
    import numpy as np

    bitmask = cache.bitmask(1)
    stop_mask = np.zeros(cache.vocab_size, dtype=bool)
    stop_mask[cache.stops] = True
    matcher, tokens = cache.matcher(grammar), []

    def allowed_now():
        bitmask.fill_(-1)
        matcher.fill(bitmask, 0)
        allowed = np.zeros(cache.vocab_size, dtype=bool)
        allowed[allowed_tokens(bitmask[0], cache.vocab_size)] = True
        return allowed

    def write(token):
        assert matcher.consume(token), "the matcher refused a token its own mask allowed"
        tokens.append(token)

    while len(tokens) < max_tokens:
        allowed = allowed_now()
        if not allowed.any():
            return tokens, False  # a dead end: generation reports it (test above)
        if (allowed & stop_mask).any() and rng.random() < 0.2 + len(tokens) / max_tokens:
            return tokens, True
        writable = allowed & ~stop_mask
        if not writable.any():
            return tokens, True
        if rng.random() < 0.15:
            for i, token in enumerate(rng.choice(snippets)):
                if not (allowed if i == 0 else allowed_now())[token]:
                    break
                write(token)
            continue
        marks = writable & structural
        pool = np.flatnonzero(marks if marks.any() and rng.random() < 0.5 else writable)
        write(int(pool[rng.randrange(len(pool))]))
    return tokens, False


@pytest.mark.parametrize("fmt", ["compact", "json"])
def test_anything_a_constrained_row_can_write_is_decoded_scored_and_reread(tiny, stream, fmt):
    """A model under its grammar can write outputs no training target looks like (a reference inside a longer
    value, a link the plan did not need, one node of a chain...). The random walk stands in for such a model:
    whatever it writes must decode (or be reported invalid), score against any gold graph, and survive the
    report's re-reading (the stored graph read back scores the same; a failure kind is found): the comparison
    once crashed in scoring on such an output after hours of training."""
    import random

    import numpy as np

    from skillbank.graph import TaskGraph
    from skillbank.metrics import failure_kind, score_example

    rng = random.Random(0)
    cache = grammar_cache(tiny.model, tiny.tokenizer)
    skills = sorted(stream.catalog.skills)  # one model for every family: the sequential methods' grammar
    prefix = common_prefix(skills)
    grammar = build_grammar([SkillSpec(s, stream.catalog.skills[s].argument_names) for s in skills], fmt, prefix)
    structural = np.zeros(cache.vocab_size, dtype=bool)  # tokens of only quotes, brackets, separators, digits
    for t in range(len(tiny.tokenizer)):
        piece = tiny.tokenizer.decode([t])
        structural[t] = bool(piece) and all(c in '"{}[],:<>-\n 0123456789' for c in piece)
    # references to earlier, later and missing nodes, whole or inside a longer value, and links
    snippets = [tiny.tokenizer(text, add_special_tokens=False)["input_ids"]
                for text in ("<node-0>", "<node-1>", "<node-4>", "see <node-2> here", "<node-0>.png", "0>1", "\n1>0")]
    golds = [r for k in stream.family_keys for r in stream.test[k]]
    families = stream.catalog.family_map
    graphs = invalid = 0
    for i in range(40):
        tokens, stopped = _random_walk(cache, grammar, rng, structural, snippets, max_tokens=120)
        text = tiny.tokenizer.decode(tokens, skip_special_tokens=True)
        parsed = decode_output(text, fmt, prefix, stopped=stopped, reason=None if stopped else "cap")
        gold = golds[i % len(golds)].graph
        score = score_example(gold, parsed.graph)
        kind = failure_kind(gold, parsed.graph, newest_family=stream.family_keys[-1], families=families)
        if parsed.graph is None:
            invalid += 1
            assert parsed.error and not score.graph_em
            continue
        graphs += 1
        stored = json.loads(json.dumps(parsed.graph.canonical().to_dict()))  # as predictions.jsonl keeps it
        reread = TaskGraph.from_dict(stored)
        assert score_example(gold, reread) == score, text
        assert failure_kind(gold, reread, newest_family=stream.family_keys[-1], families=families) == kind
        assert reread.canonical_dag() == parsed.graph.canonical_dag()
    assert graphs >= 15, f"only {graphs} of 40 walks stopped on a whole graph ({invalid} invalid)"


def test_a_dead_end_is_reported_not_guessed(tiny):
    """A grammar whose only continuation is a token the vocabulary cannot complete ends the row invalid."""

    class Stuck:
        error = ""

        def fill(self, bitmask, row):
            bitmask[row] = 0  # nothing allowed

        def consume(self, token):
            raise AssertionError("a dead row must not consume")

    batch = RowBatch(tiny.model, tiny.tokenizer, tiny)
    batch.add([render_prompt(tiny.tokenizer, "x")], ["k"], [None], [8], [Stuck()])
    [(row, decoded)] = batch.step()
    assert not decoded.stopped and decoded.reason.startswith("grammar dead end")
    assert not decode_output(decoded.text, "compact", stopped=False, reason=decoded.reason).valid


def test_bank_plans_are_constrained_by_default(tmp_path, tiny_model_dir, small_stream, capsys):
    from serve_helpers import build_bank

    from skillbank.memory.bank import SkillBank
    k1, k2 = small_stream.family_keys[:2]
    root = build_bank(tmp_path / "bank", tiny_model_dir, small_stream, [k1, k2])
    bank = SkillBank.open(root, base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    reqs = [r.request for k in (k1, k2) for r in small_stream.test[k]]
    plans = bank.plan(reqs, max_new_tokens=24, scope=False)  # six training requests a family: too few to gate
    for p in plans:
        assert p.constrained
        owned = set(bank.manifest.shards[bank.shard_names.index(p.shard)].skills)
        assert (p.graph is not None and {n["task"] for n in p.graph["task_nodes"]} <= owned) or \
            "token cap" in p.error
    free = bank.plan(reqs, max_new_tokens=24, constrain=False)
    assert not any(p.constrained for p in free)

    # a shard from before catalogs were stored: ids only, with a one-line warning; a broken file is named
    entry = bank.manifest.shards[0]
    skills_json = root / entry.dir / "skills.json"
    data = json.loads(skills_json.read_text())
    bank.execution.register(entry.name, root / entry.dir, entry)  # drop the cached grammar
    skills_json.write_text(json.dumps({"family": data["family"], "skills": data["skills"]}))
    bank.plan(reqs[:1], shard=entry.name, max_new_tokens=8)
    assert "has no argument specs" in capsys.readouterr().err
    bank.execution.register(entry.name, root / entry.dir, entry)
    skills_json.write_text("{not json")
    with pytest.raises(BankError, match=r"skills.json: malformed skills.json"):
        bank.plan(reqs[:1], shard=entry.name, max_new_tokens=8)


def test_runs_saved_before_constrained_decoding_read_as_unconstrained():
    from skillbank.config import RunConfig, packaged_config
    raw = RunConfig.from_toml(packaged_config("demo")).resolved()
    del raw["eval"]["constrain"]
    assert RunConfig.from_run(raw).eval.constrain is False  # what such a run did
    assert RunConfig.from_dict(raw).eval.constrain is True  # the default for new configs


def test_harness_cache_keys_constrained_and_free_outputs_apart(tmp_path, stream):
    from skillbank.continual.methods.base import Query
    from skillbank.continual.runner import OutputCache
    family = stream.family_keys[0]
    skills = stream.catalog.family(family).skills
    q = Query("state", "prompt", "compact", common_prefix(sorted(skills)), skills=tuple(skills))
    constrained = OutputCache(tmp_path / "a.jsonl", 4, 16, catalog=stream.catalog)
    free = OutputCache(tmp_path / "b.jsonl", 4, 16)
    assert constrained.grammar(q) is not None and free.grammar(q) is None
    assert constrained.grammar(q) is constrained.grammar(q)  # built once per skill set
    assert set(constrained.grammar(q).skills) == {SkillSpec(s, stream.catalog.skills[s].argument_names) for s in skills}


def test_decoding_eval_measures_both_modes_on_the_same_requests(tmp_path, tiny_model_dir, small_stream):
    from serve_helpers import build_bank

    from skillbank.memory.bank import SkillBank
    from skillbank.experiments.decoding import evaluate_decoding, write
    k1, k2 = small_stream.family_keys[:2]
    root = build_bank(tmp_path / "bank", tiny_model_dir, small_stream, [k1, k2])
    bank = SkillBank.open(root, base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    records = [r for k in (k1, k2) for r in small_stream.test[k]]
    result = evaluate_decoding(bank, {"held-out": records}, ("free", "constrained"), max_new_tokens=24)
    entry = result["sets"]["held-out"]
    assert entry["n"] == len(records) and entry["copy_coverage"]["records_all_copied"] == len(records)
    constrained = entry["modes"]["constrained"]
    assert constrained["skill_outside_shard"] == constrained["skill_outside_bank"] == 0
    assert constrained["undeclared_argument"] == constrained["unparsed"] == 0
    assert sum(constrained["failure_kinds"].values()) == len(records)
    assert len(result["predictions"]) == 2 * len(records)
    write(result, tmp_path / "out")
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"decoding.json", "decoding.md", "decoding.png",
                                                              "predictions.jsonl", "provenance.json"}


def _as_converted_by_transformers_5_17(path: Path) -> None:
    """Rewrite a byte-level BPE tokenizer.json as transformers 5.17 converts SmolLM2's GGUF tokenizer: byte
    fallback on and a SentencePiece-style decoder sequence (token ids unchanged)."""
    data = json.loads(path.read_text())
    data["model"].update(byte_fallback=True, fuse_unk=True, unk_token="<|endoftext|>")
    data["normalizer"] = {"type": "Sequence", "normalizers": []}
    data["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    path.write_text(json.dumps(data))


def test_a_tokenizer_the_grammar_reads_wrong_is_refused_and_the_embedded_conversion_repaired(tmp_path):
    """Under transformers 5.17 the embedded tokenizer converted from the GGUF encoded as before but llguidance read
    two tokens in three as other bytes, and constrained plans lost half their exact matches with no error (found
    on a GPU machine). Such a tokenizer is now refused by name before any decoding; the embedded conversion gives
    the file back its byte-level form, which the grammar reads right and which encodes the same ids."""
    from transformers import AutoTokenizer

    from skillbank.errors import ModelError
    from skillbank.model.base import embedded_tokenizer_dir
    from skillbank.model.constrain import GrammarCache
    from skillbank.model.embedded import repair_byte_level_bpe

    good_dir = tmp_path / "tok"
    shutil.copytree(embedded_tokenizer_dir(), good_dir)
    good = AutoTokenizer.from_pretrained(str(good_dir))
    assert not repair_byte_level_bpe(good_dir / "tokenizer.json")  # a right file is left alone
    GrammarCache(good, stops=[good.eos_token_id], vocab_size=len(good))

    _as_converted_by_transformers_5_17(good_dir / "tokenizer.json")
    broken = AutoTokenizer.from_pretrained(str(good_dir))
    text = 'Plan: transcribe "meeting.wav", then translate it into German.'
    assert broken(text)["input_ids"] == good(text)["input_ids"]  # nothing wrong to see in the ids
    with pytest.raises(ModelError, match="reads this tokenizer's tokens differently"):
        GrammarCache(broken, stops=[broken.eos_token_id], vocab_size=len(broken))

    assert repair_byte_level_bpe(good_dir / "tokenizer.json")
    repaired = AutoTokenizer.from_pretrained(str(good_dir))
    assert repaired(text)["input_ids"] == good(text)["input_ids"]
    GrammarCache(repaired, stops=[repaired.eos_token_id], vocab_size=len(repaired))

    # a cache converted by such a version before this repair existed is repaired the first time it is opened
    from skillbank.model.embedded import EMBEDDED_TOKENIZER_DIR, TOKENIZER_CHECKED
    cached = tmp_path / "cache" / "models" / EMBEDDED_TOKENIZER_DIR
    shutil.copytree(embedded_tokenizer_dir(), cached, ignore=shutil.ignore_patterns(TOKENIZER_CHECKED))
    _as_converted_by_transformers_5_17(cached / "tokenizer.json")
    assert embedded_tokenizer_dir(tmp_path / "cache") == cached and (cached / TOKENIZER_CHECKED).exists()
    reopened = AutoTokenizer.from_pretrained(str(cached))
    GrammarCache(reopened, stops=[reopened.eos_token_id], vocab_size=len(reopened))


def test_the_token_check_takes_any_librarys_reading_and_names_the_library():
    """The check takes any library's reading of a token: one that differs on most tokens is refused naming the
    library, one that agrees passes."""
    from transformers import AutoTokenizer

    from skillbank.errors import ModelError
    from skillbank.model.base import embedded_tokenizer_dir
    from skillbank.model.constrain import check_token_bytes

    tok = AutoTokenizer.from_pretrained(str(embedded_tokenizer_dir()))
    check_token_bytes(lambda i: tok.decode([i]).encode("utf-8"), tok, library="a library")
    with pytest.raises(ModelError, match="to a library"):
        check_token_bytes(lambda i: tok.decode([i]).encode("utf-8") + b"!", tok, library="a library")


def test_xgrammar_is_checked_too_and_reads_the_embedded_tokenizer_right(tmp_path, monkeypatch):
    """xgrammar (an optional backend) is checked the same way when installed; it reads even the
    transformers-5.17 conversion right (measured with xgrammar 0.2.9), so both files pass."""
    pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer

    from skillbank.model import constrain
    from skillbank.model.base import embedded_tokenizer_dir
    from skillbank.model.constrain import GrammarCache

    checked = []
    real = constrain.check_token_bytes
    monkeypatch.setattr(constrain, "check_token_bytes",
                        lambda *a, **k: (checked.append(k.get("library")), real(*a, **k)))

    shutil.copytree(embedded_tokenizer_dir(), tmp_path / "tok")
    _as_converted_by_transformers_5_17(tmp_path / "tok" / "tokenizer.json")
    for directory in (embedded_tokenizer_dir(), tmp_path / "tok"):
        t = AutoTokenizer.from_pretrained(str(directory))
        GrammarCache(t, stops=[t.eos_token_id], vocab_size=len(t), backend="xgrammar")
    assert checked == ["xgrammar", "xgrammar"]
