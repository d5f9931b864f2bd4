"""TaskBench stream: catalog and partition, normalisation of real (messy) records, split, persistence.

Runs against the real TaskBench sample in ``tests/fixtures/taskbench`` (``conftest.TASKBENCH_FIXTURE``).
"""
from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from skillbank.data import taskbench as tb
from skillbank.data.stream import Stream
from skillbank.errors import CatalogError, StreamError
from skillbank.graph import TaskGraph

from conftest import TASKBENCH_FIXTURE as SHARED

SIZES = {"t1_daily_life": 40, "t2_language_speech": 11, "t3_retrieval_understanding": 21,
         "t4_vision_document": 9, "t5_generation_editing": 19}
T1, T2, T3, T4, T5 = (f"TaskBench::{k}::" for k in SIZES)


@pytest.fixture(scope="module")
def stream() -> Stream:
    return tb.load_taskbench(SHARED)


def _descs() -> dict[str, list[dict]]:
    return {d: tb.read_tool_desc(SHARED / d / "tool_desc.json") for d in tb.DOMAINS}


def _sample_lines(domain: str) -> list[str]:
    return [line for line in (SHARED / "sample" / f"{domain}.jsonl").read_text().splitlines() if line.strip()]


def _record(stream: Stream, rid: str):
    found = [r for recs in (*stream.train.values(), *stream.test.values()) for r in recs if r.id == rid]
    assert len(found) == 1, f"{rid} not loaded"
    return found[0]


def _graph(nodes, links) -> TaskGraph:
    return TaskGraph.from_dict({
        "task_nodes": [{"task": t, "arguments": [{"name": n, "value": v} for n, v in args.items()]} for t, args in nodes],
        "task_links": [{"source": s, "target": t} for s, t in links],
    }).canonical()


# -- catalog ---------------------------------------------------------------------------------------
def test_catalog_has_100_skills_partitioned_40_11_21_9_19(stream):
    cat = stream.catalog
    assert len(cat) == 100
    assert cat.family_keys == list(SIZES)
    assert {f.key: len(f.skills) for f in cat.families} == SIZES
    assert [f.title for f in cat.families] == ["Daily Life", "Language/Speech", "Retrieval/Understanding",
                                               "Vision/Document", "Generation/Editing"]
    assert all(sid.startswith(f"TaskBench::{s.family}::") for sid, s in cat.skills.items())


def test_partition_file_covers_exactly_the_canonical_tools():
    families = tb.family_partition()
    listed = [name for f in families for name in f["tools"]]
    assert len(listed) == len(set(listed)) == 100
    descs = _descs()
    daily = {t["id"] for t in descs["dailylifeapis"]}
    media = {t["id"] for t in descs["huggingface"]} | {t["id"] for t in descs["multimedia"]}
    assert len(daily) == 40 and len(media) == 60  # 23 + 40 with Text-to-Image, Text-to-Video, Image-to-Text shared
    assert {t["id"] for t in descs["huggingface"]} & {t["id"] for t in descs["multimedia"]} == {
        "Text-to-Image", "Text-to-Video", "Image-to-Text"}
    assert set(families[0]["tools"]) == daily
    assert set(listed) - daily == media
    assert [len(f["tools"]) for f in families] == list(SIZES.values())


def test_argument_names_follow_declared_parameters_and_input_types(stream):
    skills = stream.catalog.skills
    assert skills[T1 + "get_weather"].argument_names == ("location", "date")
    assert skills[T5 + "image_stitcher"].argument_names == ("image", "image_2")
    assert skills[T3 + "question_answering"].argument_names == ("text", "text_2")
    assert skills[T4 + "visual_question_answering"].argument_names == ("image", "text")
    assert skills[T5 + "video_synchronization"].argument_names == ("video", "audio")
    assert skills[T3 + "image_search_by_image"].name == "Image Search (by Image)"


def test_a_bad_partition_is_refused():
    families = tb.family_partition()
    families[1]["tools"].append("Image Stitcher")  # now in T2 and T5
    with pytest.raises(CatalogError, match="Image Stitcher"):
        tb.build_catalog(_descs(), families)
    families = tb.family_partition()
    families[4]["tools"].remove("Video Voiceover")
    with pytest.raises(CatalogError, match="belong to no family"):
        tb.build_catalog(_descs(), families)


# -- every sample record is accounted for ------------------------------------------------------------
def test_every_sample_record_loads_or_is_reported(stream):
    loaded_ids = {r.id for recs in (*stream.train.values(), *stream.test.values()) for r in recs}
    total_loaded = 0
    for domain in tb.DOMAINS:
        rep = stream.report["domains"][domain]
        lines = _sample_lines(domain)
        assert rep["records"] == len(lines)
        assert rep["records"] == rep["loaded"] + sum(rep["dropped"].values())
        assert set(rep["dropped"]) <= set(tb.REASONS)
        for reason, examples in rep["examples"].items():
            assert 1 <= len(examples) <= tb.EXAMPLES_PER_REASON and all(e["id"] and e["detail"] for e in examples)
        dropped = {e["id"] for ex in rep["examples"].values() for e in ex}
        assert not {f"{domain}-{i}" for i in dropped} & loaded_ids
        total_loaded += rep["loaded"]
    assert total_loaded == len(loaded_ids)


def test_drop_reasons_on_the_sample(stream):
    rep = stream.report["domains"]
    assert rep["dailylifeapis"]["dropped"] == {"unknown_argument_name": 4, "unknown_tool": 4}
    assert rep["huggingface"]["dropped"] == {"bad_argument": 4, "cross_family": 38, "unknown_tool": 12}
    assert rep["multimedia"]["dropped"] == {"bad_argument": 3, "cross_family": 33, "invalid_graph": 1, "unknown_tool": 6}
    assert [rep[d]["loaded"] for d in tb.DOMAINS] == [59, 65, 79]
    assert {k: v["records"] for k, v in stream.report["families"].items()} == {
        "t1_daily_life": 59, "t2_language_speech": 28, "t3_retrieval_understanding": 50,
        "t4_vision_document": 24, "t5_generation_editing": 42}


def _examples(stream, domain, reason):
    return {e["id"]: e["detail"] for e in stream.report["domains"][domain]["examples"].get(reason, [])}


def test_specific_drops_carry_their_reason(stream):
    # daily life: a parameter name the catalog does not declare ('bill_type' for 'bill')
    assert "bill_type" in _examples(stream, "dailylifeapis", "unknown_argument_name")["13364607"]
    # tools outside the catalog
    assert "arrange_online_meeting" in _examples(stream, "dailylifeapis", "unknown_tool")["14488416"]
    # 1-based / cyclic references that no reading of the declared links can explain
    assert "14862397" in _examples(stream, "multimedia", "invalid_graph")
    # skills from two families
    assert "t4_vision_document" in _examples(stream, "huggingface", "cross_family")["13708813"]


def _normalise_one(domain: str, rid: str):
    """Normalise one real sample record on its own; returns (Record or drop reason, fixes)."""
    from collections import Counter
    raw = next(json.loads(line) for line in _sample_lines(domain) if json.loads(line)["id"] == rid)
    catalog, spaces = tb._build(_descs(), tb.family_partition())
    fixes = Counter()
    try:
        return tb._normalise(raw, domain, spaces[tb._NAMESPACE[domain]], catalog, fixes), fixes
    except tb._Drop as d:
        return d.reason, fixes


# -- messy real records, normalised exactly ---------------------------------------------------------
def test_output_from_tool_placeholders_and_repeated_input_types(stream):
    rec = _record(stream, "multimedia-45760948")  # '<output-from-Video-to-Audio>', Image Stitcher(image, image)
    assert rec.family == "t5_generation_editing" and rec.structure == "chain"
    assert rec.graph == _graph(
        [(T5 + "video_to_audio", {"video": "example.mp4"}),
         (T5 + "audio_to_image", {"audio": "<node-0>"}),
         (T5 + "image_stitcher", {"image": "<node-1>", "image_2": "example.jpg"})],
        [(T5 + "video_to_audio", T5 + "audio_to_image"), (T5 + "audio_to_image", T5 + "image_stitcher")])


def test_output_of_tool_placeholders_typed_by_the_producer(stream):
    rec = _record(stream, "multimedia-14262994")  # '<output_of_Topic_Generator>', '<output_of_URL_Extractor>'
    assert rec.graph == _graph(
        [(T3 + "topic_generator", {"text": "Online marketing strategies for small businesses"}),
         (T3 + "url_extractor", {"text": "<node-0>"}),
         (T3 + "text_downloader", {"url": "<node-1>"})],
        [(T3 + "topic_generator", T3 + "url_extractor"), (T3 + "url_extractor", T3 + "text_downloader")])


def test_node_without_arguments_and_tool_name_variant(stream):
    rec = _record(stream, "huggingface-10790521")  # {"task": "AudioNoiseReduction", "input_file": "example.wav"}
    assert rec.family == "t2_language_speech" and rec.structure == "single"
    assert rec.graph == _graph([(T2 + "audio_noise_reduction", {"audio": "example.wav"})], [])


def test_arguments_as_a_plain_string(stream):
    rec = _record(stream, "multimedia-17177733")
    assert rec.graph.nodes[0].task == T3 + "text_simplifier"
    assert [a.name for a in rec.graph.nodes[0].arguments] == ["text"]
    assert rec.graph.nodes[0].arguments[0].value.startswith("Notwithstanding the myriad")


def test_numeric_value_and_typed_slots(stream):
    rec = _record(stream, "multimedia-24732754")  # ["example.mp4", 2]
    assert rec.graph == _graph([(T5 + "video_speed_changer", {"video": "example.mp4", "text": "2"})], [])
    rec = _record(stream, "huggingface-27766469")  # VQA ["example.jpg", question]
    assert rec.graph == _graph([(T4 + "visual_question_answering",
                                 {"image": "example.jpg", "text": "What is the predominant color in the image?"})], [])


def test_one_based_references_are_renumbered(stream):
    rec = _record(stream, "huggingface-23464706")  # Depth Estimation ['<node-1>'] meaning node 0
    assert rec.graph == _graph(
        [(T4 + "image_segmentation", {"image": "example.jpg"}), (T4 + "depth_estimation", {"image": "<node-0>"})],
        [(T4 + "image_segmentation", T4 + "depth_estimation")])
    assert _normalise_one("huggingface", "23464706")[1]["references_one_based"] == 1


def test_nodes_out_of_dependency_order_are_reordered(stream):
    rec = _record(stream, "huggingface-25775436")  # QA ['<node-1>', q] listed before Summarization
    q = "What does the article attribute as the chief factor of climate change?"
    assert rec.graph == _graph(
        [(T3 + "summarization", {"text": "example.txt"}), (T3 + "question_answering", {"text": "<node-0>", "text_2": q})],
        [(T3 + "summarization", T3 + "question_answering")])
    assert _normalise_one("huggingface", "25775436")[1]["nodes_reordered"] == 1


def test_node_digit_placeholder_is_rewritten_before_the_family_check():
    # '<node0>' etc. are references; the record then spans T4 (Image-to-Text) and T3 -> cross_family
    assert _normalise_one("multimedia", "31107902") == ("cross_family", {"placeholder_rewritten": 3})


def test_daily_life_dag_keeps_named_arguments_and_links(stream):
    rec = _record(stream, "dailylifeapis-19562041")
    assert rec.family == "t1_daily_life" and rec.structure == "dag"
    content = ("Dear John, I have successfully enrolled you in the 'Introduction to AI' course at Example University "
               "and listed your laptop for sale on Amazon. Best regards, [Your Name]")
    assert rec.graph == _graph(
        [(T1 + "enroll_in_course", {"course": "Introduction to AI", "university": "Example University"}),
         (T1 + "sell_item_online", {"item": "Laptop", "store": "Amazon"}),
         (T1 + "send_email", {"email_address": "johndoe@example.com", "content": content})],
        [(T1 + "enroll_in_course", T1 + "send_email"), (T1 + "sell_item_online", T1 + "send_email")])


def test_stored_graphs_are_canonical_and_valid(stream):
    for recs in (*stream.train.values(), *stream.test.values()):
        for rec in recs:
            assert rec.graph == rec.graph.canonical()
            assert {stream.catalog.family_of(t) for t in rec.graph.tasks} == {rec.family}
            for node in rec.graph.nodes:
                assert {a.name for a in node.arguments} <= set(stream.catalog.skills[node.task].argument_names)


# -- split -----------------------------------------------------------------------------------------
def test_default_split_puts_the_whole_sample_in_training(stream):
    assert {k: (v["train"], v["test"]) for k, v in stream.report["families"].items()} == {
        "t1_daily_life": (59, 0), "t2_language_speech": (28, 0), "t3_retrieval_understanding": (50, 0),
        "t4_vision_document": (24, 0), "t5_generation_editing": (42, 0)}


def test_default_split_warns_that_no_family_has_held_out_records(stream):
    warnings = stream.report["warnings"]
    assert len(warnings) == 5
    assert warnings[0] == ("family t1_daily_life: no held-out records: all 59 go to training "
                           "(train_per_family=1000); lower --train-per-family below 59")
    assert tb.load_taskbench(SHARED, train_per_family=20).report["warnings"] == []
    assert tb.split_warnings({"a": {"records": 0, "train": 0, "test": 0},
                              "b": {"records": 5, "train": 2, "test": 0},
                              "c": {"records": 5, "train": 2, "test": 3}}, 2) == [
        "family a: no records loaded, so nothing to train on or hold out",
        "family b: no held-out records (5 records, 2 in training; test_per_family is 0)"]


def test_stream_build_prints_the_warning_and_the_drop_reasons(tmp_path):
    from typer.testing import CliRunner

    from skillbank.cli import app
    args = ["exp", "stream", "build", "--source", "taskbench", "--taskbench-root", str(SHARED)]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "all")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "warning: family t5_generation_editing: no held-out records: all 42 go to training" in r.output
    assert r.output.count("warning: family") == 5
    assert "huggingface: dropped 54 of 119 records: bad_argument x4, cross_family x38, unknown_tool x12" in r.output
    assert "  unknown_argument_name: 13364607: " in r.output and "bill_type" in r.output
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "split"), "--train-per-family", "20"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "warning:" not in r.output and "dropped 8 of 67 records" in r.output


def test_domain_of_a_record_id():
    assert tb.domain_of("multimedia-45760948") == "multimedia"
    assert tb.domain_of("dailylifeapis-1") == "dailylifeapis"
    assert tb.domain_of("t1-0001") is None and tb.domain_of("huggingface") is None


def _ids(s: Stream) -> dict:
    return {k: ([r.id for r in s.train[k]], [r.id for r in s.test[k]]) for k in s.family_keys}


def test_split_is_deterministic_seeded_and_disjoint():
    a = tb.load_taskbench(SHARED, seed=1, train_per_family=10)
    b = tb.load_taskbench(SHARED, seed=1, train_per_family=10)
    c = tb.load_taskbench(SHARED, seed=2, train_per_family=10)
    assert _ids(a) == _ids(b)
    assert _ids(a) != _ids(c)
    for key in a.family_keys:
        train, test = a.train[key], a.test[key]
        assert len(train) == 10 and len(test) == a.report["families"][key]["records"] - 10
        assert not {r.id for r in train} & {r.id for r in test}
        assert not {r.request for r in train} & {r.request for r in test}
        assert {r.id for r in train} | {r.id for r in test} == {r.id for r in c.train[key]} | {r.id for r in c.test[key]}
    capped = tb.load_taskbench(SHARED, seed=1, train_per_family=10, test_per_family=5)
    assert all(len(capped.test[k]) == 5 for k in capped.family_keys)
    assert _ids(capped)["t1_daily_life"][0] == _ids(a)["t1_daily_life"][0]
    with pytest.raises(StreamError):
        tb.load_taskbench(SHARED, train_per_family=-1)


def test_stream_saves_and_loads_back_equal(stream, tmp_path):
    small = tb.load_taskbench(SHARED, seed=3, train_per_family=7, test_per_family=4)
    small.save(tmp_path / "s")
    back = Stream.load(tmp_path / "s")
    assert back.train == small.train and back.test == small.test
    assert back.catalog.to_dict() == small.catalog.to_dict()
    assert back.report == json.loads(json.dumps(small.report))
    assert (back.name, back.seed, back.source) == (small.name, small.seed, small.source)


# -- the official layout (data_<domain>/data.json) --------------------------------------------------
def _official_layout(root: Path) -> Path:
    """A tiny TaskBench folder in the official layout, built from a few real lines plus messy variants."""
    picks = {"dailylifeapis": ["77532649", "19562041", "13364607"],
             "huggingface": ["33446682", "17990278", "27766469"],
             "multimedia": ["45760948", "14262994", "28923786"]}
    for domain, ids in picks.items():
        (root / f"data_{domain}").mkdir(parents=True)
        shutil.copy(SHARED / domain / "tool_desc.json", root / f"data_{domain}" / "tool_desc.json")
        rows = {json.loads(line)["id"]: json.loads(line) for line in _sample_lines(domain)}
        lines = [json.dumps(rows[i]) for i in ids]
        if domain == "multimedia":
            lines.append("{not json")
            dup = dict(rows["28923786"], id="1", instruction="  " + rows["28923786"]["instruction"] + " ")
            lines.append(json.dumps(dup))  # same request up to white space
            lines.append(json.dumps({  # links by node index, '<GENERATED>-0' placeholder, n_tools wrong
                "id": "2", "n_tools": 1, "type": "chain", "instruction": "Stabilise example.mp4, then play it at 2x.",
                "task_nodes": [{"task": "Video Stabilizer", "arguments": ["example.mp4"]},
                               {"task": "Video Speed Changer", "arguments": ["2x", "<GENERATED>-0"]}],
                "task_links": [{"source": 0, "target": 1}]}))
        (root / f"data_{domain}" / "data.json").write_text("\n".join(lines) + "\n")
    return root


def test_official_layout(tmp_path):
    s = tb.load_taskbench(_official_layout(tmp_path / "taskbench"), seed=0, train_per_family=1)
    rep = s.report["domains"]
    assert rep["dailylifeapis"]["source"].endswith("data_dailylifeapis/data.json")
    assert (rep["dailylifeapis"]["loaded"], rep["dailylifeapis"]["dropped"]) == (2, {"unknown_argument_name": 1})
    assert (rep["huggingface"]["loaded"], rep["huggingface"]["dropped"]) == (3, {})
    mm = rep["multimedia"]
    assert (mm["records"], mm["loaded"], mm["dropped"]) == (6, 4, {"duplicate_request": 1, "malformed": 1})
    assert mm["examples"]["malformed"][0]["id"] == "line 4"
    assert mm["examples"]["duplicate_request"][0] == {"id": "1", "detail": "same request as multimedia-28923786"}
    assert mm["fixes"]["link_by_index"] == 2 and mm["fixes"]["placeholder_rewritten"] >= 1
    rec = _record(s, "multimedia-2")
    assert rec.family == "t5_generation_editing" and rec.structure == "chain"
    assert rec.graph == _graph(  # '<node-0>' has the stabiliser's output type (video), so it fills 'video'
        [(T5 + "video_stabilizer", {"video": "example.mp4"}), (T5 + "video_speed_changer", {"video": "<node-0>", "text": "2x"})],
        [(T5 + "video_stabilizer", T5 + "video_speed_changer")])
    assert {k: len(v) for k, v in s.train.items()} == dict.fromkeys(SIZES, 1)


def test_missing_files_are_reported(tmp_path):
    with pytest.raises(StreamError, match="not a directory"):
        tb.load_taskbench(tmp_path / "nowhere")
    (tmp_path / "data_dailylifeapis").mkdir()
    with pytest.raises(StreamError, match="dailylifeapis tool catalog"):
        tb.load_taskbench(tmp_path)


# -- the hub path (datasets faked: no network in tests) ---------------------------------------------
def test_hub_rows_go_through_the_same_normalisation(monkeypatch, stream):
    calls = []

    def load_dataset(repo_id, config, split, revision=None):
        calls.append((repo_id, config, split, revision))
        rows = [json.loads(line) for line in _sample_lines(config)]
        for row in rows[::2]:  # parquet may carry nested columns as JSON text
            row["task_nodes"], row["task_links"] = json.dumps(row["task_nodes"]), json.dumps(row["task_links"])
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    hub = tb.load_taskbench_hub(tools_root=SHARED)
    assert calls == [("microsoft/Taskbench", d, "test", None) for d in tb.DOMAINS]
    assert hub.train == stream.train and hub.test == stream.test
    assert hub.source == "hub:microsoft/Taskbench"
    for d in tb.DOMAINS:
        assert hub.report["domains"][d]["dropped"] == stream.report["domains"][d]["dropped"]


def test_hub_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(StreamError, match=r"pip install 'skillbank\[hub\]'"):
        tb.load_taskbench_hub()
