"""The skill prior: each shard's skill statistics weigh the executor's choice among skill names, and nothing else.

The row arithmetic is checked on a hand-made vocabulary; then that a strong prior moves a tiny model's choice in
both engines while weight 0 leaves every token as it was; then the statistics' life in a bank (written beside the
shard under its digests, read back, a damaged file named, shards without them planned as before, carried by
export/import)."""
import json
import math
import shutil

import numpy as np
import pytest

from skillbank.errors import BankError
from skillbank.memory.skill_address import SKILL_ADDRESS_DIR, fit_skill_address
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.model.constrain import SkillPrior, SkillSpec, build_grammar, grammar_cache
from skillbank.model.generate import generate
from skillbank.model.prompts import render_prompt
from skillbank.model.serialization import decode_output

SKILLS = ["F::send_sms", "F::send_email", "F::set_alarm"]
PIECES = {0: "send_", 1: "set_alarm{", 2: "sms{", 3: "email{", 4: "0", 5: '"x":"y"}', 6: "\n",
          7: '{"task_nodes":[{"task":"', 8: "F::send_", 9: 'sms"', 10: "F::set_alarm\""}


class AnyToken:
    """A grammar that allows everything: the prior's arithmetic alone is under test."""
    error = ""

    def consume(self, token):
        return True

    def allows(self, token):
        return True

    def fill(self, bitmask, row):
        pass

    def forced(self):
        return []


def prior_row(fmt: str, weight: float = 1.0):
    grammar = build_grammar([SkillSpec(s) for s in SKILLS], fmt, "F::")
    logp = {"F::send_sms": math.log(0.7), "F::send_email": math.log(0.2), "F::set_alarm": math.log(0.1)}
    return SkillPrior(logp, weight).row(AnyToken(), grammar, lambda ids: "".join(PIECES[i] for i in ids).encode())


def test_the_prior_weighs_only_the_choice_among_skill_names():
    row = prior_row("compact")
    assert row.active()
    # "send_" leads to sms or email (0.9 of the mass), "set_alarm{" to the alarm, "0" (a links line) to no name
    assert np.allclose(row.bias(np.array([0, 1, 4])), [math.log(0.9), math.log(0.1), 0.0])
    row.consume(0)
    assert np.allclose(row.bias(np.array([2, 3])), [math.log(0.7 / 0.9), math.log(0.2 / 0.9)])
    row.consume(2)
    assert not row.active()  # inside the node's arguments: nothing to weigh
    row.consume(5)
    row.consume(6)
    # the next node: sms is written already, so the mass left is email's and the alarm's
    assert row.active()
    assert np.allclose(row.bias(np.array([0, 1])), [math.log(0.2 / 0.3), math.log(0.1 / 0.3)])
    assert not prior_row("compact", weight=0.0).active()


def test_the_prior_reads_json_plans_too():
    row = prior_row("json")
    row.consume(7)
    assert row.active()
    assert np.allclose(row.bias(np.array([8, 10])), [math.log(0.9), math.log(0.1)])
    row.consume(8)
    assert np.allclose(row.bias(np.array([9])), [math.log(0.7 / 0.9)])
    row.consume(9)
    assert not row.active()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


def test_a_strong_prior_moves_the_skill_choice_and_weight_zero_changes_nothing(tiny, small_stream):
    from skillbank.train.executor import common_prefix
    family = small_stream.family_keys[0]
    ids = small_stream.catalog.family(family).skills
    prefix = common_prefix(sorted(ids))
    grammar = build_grammar([SkillSpec(s, small_stream.catalog.skills[s].argument_names) for s in ids],
                            "compact", prefix)
    prompts = [render_prompt(tiny.tokenizer, r.request) for r in small_stream.test[family]]
    plain = generate(tiny.model, tiny.tokenizer, prompts, batch_size=3, max_new_tokens=30, grammars=[grammar] * 3)
    zero = generate(tiny.model, tiny.tokenizer, prompts, batch_size=3, max_new_tokens=30, grammars=[grammar] * 3,
                    priors=[SkillPrior({s: 0.0 for s in ids}, 0.0)] * 3)
    assert [o.text for o in zero] == [o.text for o in plain]
    firsts = {o.text.split("{", 1)[0] for o in plain}
    target = next(s for s in ids if s[len(prefix):] not in firsts)  # a skill the random model did not pick
    strong = SkillPrior({s: (0.0 if s == target else -50.0) for s in ids}, 1.0)
    moved = generate(tiny.model, tiny.tokenizer, prompts, batch_size=3, max_new_tokens=30, grammars=[grammar] * 3,
                     priors=[strong] * 3)
    for o in moved:
        assert o.text.split("{", 1)[0] == target[len(prefix):], o.text
        if o.stopped:
            assert decode_output(o.text, "compact", prefix, stopped=True).valid
    with pytest.raises(Exception, match="skill priors"):
        generate(tiny.model, tiny.tokenizer, prompts, grammars=[grammar] * 3, priors=[strong])


def test_a_family_with_one_skill_has_no_statistics(small_stream):
    family = small_stream.family_keys[0]
    one = [r for r in small_stream.train[family] if len(set(r.graph.tasks)) == 1][:1]
    assert fit_skill_address(one, [], "hashing-nb", {}) is None


def test_learn_writes_skill_statistics_beside_the_shard_and_the_bank_checks_them(tmp_path, tiny_model_dir,
                                                                                   small_stream, monkeypatch):
    from serve_helpers import build_bank

    from skillbank.memory.bank import SkillBank
    k1, k2 = small_stream.family_keys[:2]
    root = build_bank(tmp_path / "bank", tiny_model_dir, small_stream, [k1, k2])
    bank = SkillBank.open(root, base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    entry = bank._entry(k1)
    assert {f"{SKILL_ADDRESS_DIR}/selector.json", f"{SKILL_ADDRESS_DIR}/stats.npz"} <= set(entry.digests)
    used = {t for r in small_stream.train[k1] for t in r.graph.tasks}
    assert set(bank.skill_address(k1).classes_) == used
    [prior] = bank.skill_priors([small_stream.test[k1][0].request], [k1])
    assert set(prior.logp) == used and all(v <= 0 for v in prior.logp.values())
    assert bank.skill_priors(["x"], [k1], weight=0) == [None]
    request = small_stream.test[k1][0].request
    with_prior = bank.plan([request], shard=k1, max_new_tokens=24)[0]
    without = bank.plan([request], shard=k1, max_new_tokens=24, skill_prior=0)[0]
    assert with_prior.constrained and without.constrained
    shown = bank.plan([request], shard=k1, max_new_tokens=8, explain=True)[0].to_dict()["explain"]["top_skills"]
    assert len(shown) == min(3, len(used)) and {s["skill"] for s in shown} <= used

    # the statistics kept read are bounded (a process meeting many families stays flat) and read again after
    from cachetools import LRUCache

    from skillbank.memory.bank import SKILL_STATISTICS_KEPT, skill_statistics_kept
    assert bank._skill_addresses.maxsize == SKILL_STATISTICS_KEPT
    bounded = SkillBank.open(root, max_resident=2)
    assert bounded._skill_addresses.maxsize == skill_statistics_kept(2) >= 2
    bounded._skill_addresses = LRUCache(1)
    first = bounded.skill_address(k1)
    bounded.skill_address(k2)
    assert list(bounded._skill_addresses) == [k2]
    assert bounded.skill_address(k1) is not first and set(bounded.skill_address(k1).classes_) == used

    # the router, the skill statistics and the explanation embed a text once per call, not once each
    from skillbank.memory.selectors import embedding
    from skillbank.memory.selectors.embedding import SentenceEncoder
    # a study run in this process (``memoize_encoders``) may have left the process-wide memo on: off here
    monkeypatch.setattr(embedding, "_MEMO", False)
    for loaded in embedding._ENCODERS.values():
        monkeypatch.setattr(loaded, "memo", None)
    embedded: list[str] = []
    encode = SentenceEncoder._encode
    monkeypatch.setattr(SentenceEncoder, "_encode", lambda self, texts: embedded.extend(texts) or encode(self, texts))
    bank.plan([request], max_new_tokens=8, explain=True)
    assert embedded and len(embedded) == len(set(embedded))
    embedded.clear()
    bank.plan([request], max_new_tokens=8)  # nothing kept from the call before
    assert embedded and len(embedded) == len(set(embedded))

    # exported and imported, the statistics travel with the shard
    out = bank.export_family(k1, tmp_path / "k1.export")
    other = SkillBank.create(tmp_path / "other", base=load_base(BaseModelConfig(name=str(tiny_model_dir)),
                                                               progress=False))
    other.import_family(out)
    assert set(other.skill_address(k1).classes_) == used

    # a damaged statistics file is named when read, before anything is generated
    stats = root / entry.dir / SKILL_ADDRESS_DIR / "stats.npz"
    stats.write_bytes(stats.read_bytes()[:-10] + b"0123456789")
    damaged = SkillBank.open(root, base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    with pytest.raises(BankError, match=r"skill_address/stats.npz does not match its digest"):
        damaged.plan([request], shard=k1, max_new_tokens=8)

    # a shard written before skill statistics existed: no prior, planned as before
    shutil.rmtree(root / entry.dir / SKILL_ADDRESS_DIR)
    manifest = json.loads((root / "bank.json").read_text())
    for shard in manifest["shards"]:
        shard["digests"] = {f: d for f, d in shard["digests"].items() if not f.startswith(SKILL_ADDRESS_DIR)}
    (root / "bank.json").write_text(json.dumps(manifest))
    older = SkillBank.open(root, base=load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False))
    assert older.skill_address(k1) is None and older.skill_priors([request], [k1]) == [None]
    assert older.plan([request], shard=k1, max_new_tokens=24, skill_prior=0)[0].raw == without.raw
    assert older.plan([request], shard=k1, max_new_tokens=24)[0].raw == without.raw


@pytest.mark.real_model
def test_both_engines_follow_a_strong_prior_on_the_embedded_base(small_stream, tmp_path):
    """llama.cpp and the torch reference weigh the same names the same way: a prior that all but forbids every
    skill but one makes both write that one, where without it they write another."""
    pytest.importorskip("llama_cpp", reason='llama-cpp-python is not installed (pip install -e ".[fast]")')
    from skillbank.memory.bank import SkillBank
    from skillbank.train.executor import TrainConfig, top_layers

    base = load_base(progress=False)
    key = "t4_vision_document"
    bank = SkillBank.create(tmp_path / "bank", base=base)
    cfg = TrainConfig(epochs=1, batch_size=2, rank=4, dropout=0.0, target_format="compact",
                      layers_to_transform=top_layers(base.num_layers, 2), target_modules=("q_proj", "v_proj"))
    bank.learn(key, small_stream.train[key][:2], cfg, catalog=small_stream.catalog, progress=False)
    request = small_stream.test[key][0].request
    skills = list(bank._entry(key).skills)
    outputs = {}
    for engine in ("llama.cpp", "torch"):
        opened = SkillBank.open(tmp_path / "bank", engine=engine)
        [plain] = opened.engine.generate([request], [key], max_new_tokens=16)
        first = plain.text.split("{", 1)[0]
        target = next(s for s in skills if not s.endswith("::" + first) and s != first)
        strong = SkillPrior({s: (0.0 if s == target else -50.0) for s in skills}, 1.0)
        [moved] = opened.engine.generate([request], [key], max_new_tokens=16, priors=[strong])
        assert target.endswith("::" + moved.text.split("{", 1)[0]), (engine, moved.text)
        outputs[engine] = moved.text
    assert outputs["llama.cpp"].split("{", 1)[0] == outputs["torch"].split("{", 1)[0]
