"""A shard's grammar makes a plan give every required argument of a skill (a JSON Schema's ``required``) and
leaves the others optional."""
import itertools
import json

import pytest

from skillbank.errors import ModelError
from skillbank.model.base import BaseModelConfig, load_base
from skillbank.model.constrain import SkillSpec, build_grammar, grammar_cache, specs_from_skills_json

ARGS = ("a", "b", "c")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_base(BaseModelConfig(name=str(tiny_model_dir)), progress=False)


def accepts(tiny, grammar, text: str) -> bool:
    cache = grammar_cache(tiny.model, tiny.tokenizer)
    matcher = cache.matcher(grammar)
    ids = tiny.tokenizer(text, add_special_tokens=False)["input_ids"] + [cache.stops[0]]
    return all(matcher.consume(t) for t in ids)


def node(fmt, skill, names):
    if fmt == "compact":
        return skill.split("::")[-1] + json.dumps({n: "x" for n in names}, separators=(",", ":"))
    return json.dumps({"task": skill, "arguments": [{"name": n, "value": "x"} for n in names]}, separators=(",", ":"))


def plan(fmt, nodes):
    if fmt == "compact":
        return "\n".join(nodes)
    return '{"task_nodes":[' + ",".join(nodes) + '],"task_links":[]}'


@pytest.mark.parametrize("fmt", ["compact", "json"])
@pytest.mark.parametrize("required", [(), ("a",), ("b",), ("c",), ("a", "c"), ARGS])
def test_every_required_argument_must_be_given_and_the_others_may_be(tiny, fmt, required):
    skill, other = "S::f::do_it", "S::f::other"
    grammar = build_grammar([SkillSpec(skill, ARGS, required), SkillSpec(other, ("q",))], fmt, "S::f::")
    for k in range(len(ARGS) + 1):
        for names in itertools.combinations(ARGS, k):
            want = set(required) <= set(names)
            assert accepts(tiny, grammar, plan(fmt, [node(fmt, skill, names)])) == want, (names, required)
            # the second node of a plan as well (its own rules), and the prefix grammar the decoder switches to
            two = plan(fmt, [node(fmt, other, ()), node(fmt, skill, names)])
            assert accepts(tiny, grammar, two) == want, (names, required)
            assert accepts(tiny, grammar.variant((other,)), two) == want, (names, required)
    # still in the canonical order, each once
    if len(required) < 2:
        assert not accepts(tiny, grammar, plan(fmt, [node(fmt, skill, ("c", "b", "a"))]))


def test_required_arguments_are_read_from_skills_json():
    specs, complete = specs_from_skills_json({"skills": ["A::f::x"], "specs": [{"id": "A::f::x", "arguments": [
        {"name": "q", "required": True}, {"name": "lang"}]}]}, "s.json")
    assert complete and specs == [SkillSpec("A::f::x", ("q", "lang"), ("q",))]
    # the harness's grammars come from the catalog: the same spec from a catalog skill
    from skillbank.data.catalog import ArgSpec, Skill
    skill = Skill("A::f::x", "f", "x", arguments=(ArgSpec("q", required=True), ArgSpec("lang")))
    assert SkillSpec.of(skill) == specs[0]
    with pytest.raises(ModelError, match=r"required argument\(s\) \['z'\] are not among its arguments"):
        SkillSpec("A::f::x", ("q",), ("z",))
