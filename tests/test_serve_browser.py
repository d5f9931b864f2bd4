"""The playground page end to end in headless Chromium (Debian's chromium + chromium-driver, via Selenium).
Nothing is fetched from the network: the page is self-contained.

The tiny random model cannot write a valid graph, so its output is read as a fixed three-node chain over the
routed shard's own skills; routing, the scope check, generation, learning, HTTP, the page and its drawing
are real.
"""
import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("selenium")

from serve_helpers import MAX_NEW, TOKEN, build_bank, fresh_base, live_server  # noqa: E402

from skillbank.graph import parse_graph  # noqa: E402
from skillbank.serve import engine as engine_mod  # noqa: E402
from skillbank.serve.app import create_app  # noqa: E402
from skillbank.serve.config import ServeConfig  # noqa: E402

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def chain_graph(skills: list[str]) -> str:
    a, b, c = skills[:3]
    return json.dumps({"task_nodes": [
        {"task": a, "arguments": [{"name": "city", "value": "Lisbon"}]},
        {"task": b, "arguments": [{"name": "input", "value": "<node-0>"}, {"name": "when", "value": "Friday"}]},
        {"task": c, "arguments": [{"name": "input", "value": "<node-1>"}]}],
        "task_links": [{"source": a, "target": b}, {"source": b, "target": c}]})


def _keep_screenshot(shot: Path) -> None:
    """Copy a screenshot to $SKILLBANK_SCREENSHOTS when set (to look at the page by eye)."""
    if os.environ.get("SKILLBANK_SCREENSHOTS"):
        Path(os.environ["SKILLBANK_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(os.environ["SKILLBANK_SCREENSHOTS"]) / shot.name)


@pytest.fixture()
def driver():
    browser = find_chromium()
    if browser is None:
        pytest.skip(f"no Chromium found (looked for {', '.join(BROWSERS)}); `apt-get install chromium chromium-driver`")
    driver_path = shutil.which("chromedriver")
    assert driver_path, "Chromium is installed but chromedriver is not: apt-get install chromium-driver"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1200", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    d = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        yield d
    finally:
        d.quit()


def test_playground_plans_and_draws_the_graph(driver, tmp_path, tiny_model_dir, small_stream, monkeypatch):
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    k1, k2 = small_stream.family_keys[:2]
    bank = build_bank(tmp_path / "bank", tiny_model_dir, small_stream, [k1, k2])
    app = create_app(bank, ServeConfig(max_new_tokens=MAX_NEW), base=fresh_base(tiny_model_dir))
    # whatever the tiny model writes, read it as a three-node chain of the routed shard's skills
    monkeypatch.setattr(engine_mod, "parse_output", lambda text, entry, *_: parse_graph(chain_graph(entry.skills)))
    wait = WebDriverWait(driver, 30)
    with live_server(app) as url:
        driver.get(url + "/")
        wait.until(lambda d: "2 shards" in d.find_element(By.ID, "bank-meta").text)
        options = [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#shard option")]
        assert options == ["route by content", k1, k2]
        request = small_stream.test[k2][0].request
        driver.find_element(By.ID, "request").send_keys(request)
        driver.find_element(By.ID, "plan-btn").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#graph g.node")) == 3)
        nodes = driver.find_elements(By.CSS_SELECTOR, "#graph g.node")
        edges = driver.find_elements(By.CSS_SELECTOR, "#graph path.edge")
        bars = driver.find_elements(By.CSS_SELECTOR, "#prob-chart g.bar")
        assert len(edges) == 2 and {e.get_attribute("data-edge") for e in edges} == {"0>1", "1>2"}
        assert sorted(b.get_attribute("data-shard") for b in bars) == sorted([k1, k2])
        assert "Lisbon" in nodes[0].text and "<node-0>" in nodes[1].text and "Friday" in nodes[1].text
        status = driver.find_element(By.ID, "status").text
        assert "(routed)" in status and "shard " in status
        assert driver.find_element(By.ID, "graph-error").text == ""
        assert "routing p" in driver.find_element(By.ID, "confidence").text
        assert not driver.find_element(By.ID, "scope-note").is_displayed()

        # the screenshot shows the graph: boxes in the accent colours inside the graph's area
        shot = tmp_path / "playground.png"
        driver.save_screenshot(str(shot))
        _keep_screenshot(shot)
        graph = driver.find_element(By.ID, "graph")
        x, y = graph.location["x"], graph.location["y"]
        w, h = graph.size["width"], graph.size["height"]
        assert w > 500 and h > 100  # three columns of nodes
        area = Image.open(shot).convert("RGB").crop((x, y, x + w, y + h))
        pixels = list(area.get_flattened_data()) if hasattr(area, "get_flattened_data") else list(area.getdata())
        inked = sum(1 for p in pixels if p != (255, 255, 255))
        node_fill = sum(1 for p in pixels if abs(p[0] - 0xee) < 6 and abs(p[1] - 0xf2) < 6 and abs(p[2] - 0xff) < 6)
        assert inked > 0.1 * len(pixels) and node_fill > 3 * 150 * 30, (inked, node_fill, len(pixels))

        # a request no family covers: the reason, plainly, and no diagram
        box = driver.find_element(By.ID, "request")
        box.clear()
        box.send_keys("what is the capital of France?")
        driver.find_element(By.ID, "plan-btn").click()
        wait.until(lambda d: d.find_element(By.ID, "scope-note").is_displayed())
        note = driver.find_element(By.ID, "scope-note").text
        assert "No skill in this bank covers that request" in note and "no learned skill family covers" in note
        assert driver.find_elements(By.CSS_SELECTOR, "#graph g.node, #graph path.edge") == []
        assert "out of scope" in driver.find_element(By.ID, "status").text
        assert driver.find_element(By.ID, "graph-error").text == "" and driver.find_element(By.ID, "raw").text == ""
        assert len(driver.find_elements(By.CSS_SELECTOR, "#prob-chart g.bar")) == 2  # routing is still shown
        driver.save_screenshot(str(tmp_path / "out_of_scope.png"))
        _keep_screenshot(tmp_path / "out_of_scope.png")

        # the second tab lists the shards and their skills
        driver.find_element(By.ID, "tab-shards").click()
        total = len(small_stream.catalog.family(k1).skills) + len(small_stream.catalog.family(k2).skills)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#shard-list tr.skill")) == total)
        headings = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#shard-list h3")]
        assert headings[0].startswith(f"1. {k1}") and headings[1].startswith(f"2. {k2}")
        driver.save_screenshot(str(tmp_path / "shards.png"))


def test_playground_learn_tab_uploads_and_follows_the_job(driver, tmp_path, tiny_model_dir, small_stream):
    """The Learn tab: a wrong token is refused with the service's message; with the admin token a JSONL upload
    starts a learn job whose progress is shown until it is done, and the new shard becomes selectable."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    k1, k2, k3 = small_stream.family_keys[:3]
    bank = build_bank(tmp_path / "bank", tiny_model_dir, small_stream, [k1, k2])
    records = tmp_path / f"{k3}.jsonl"
    records.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in small_stream.train[k3]))
    app = create_app(bank, ServeConfig(max_new_tokens=MAX_NEW, admin_token=TOKEN), base=fresh_base(tiny_model_dir))
    wait = WebDriverWait(driver, 30)
    with live_server(app) as url:
        driver.get(url + "/")
        wait.until(lambda d: "2 shards" in d.find_element(By.ID, "bank-meta").text)
        driver.find_element(By.ID, "tab-learn").click()
        assert driver.find_element(By.ID, "panel-learn").is_displayed()
        driver.find_element(By.ID, "learn-family").send_keys(k3)
        driver.find_element(By.ID, "learn-epochs").send_keys("1")
        driver.find_element(By.ID, "learn-file").send_keys(str(records))
        driver.find_element(By.ID, "learn-token").send_keys("wrong-token")
        driver.find_element(By.ID, "learn-btn").click()
        wait.until(lambda d: "wrong bearer token" in d.find_element(By.ID, "learn-error").text)
        assert not driver.find_element(By.ID, "learn-job").is_displayed()

        token = driver.find_element(By.ID, "learn-token")
        token.clear()
        token.send_keys(TOKEN)
        driver.find_element(By.ID, "learn-btn").click()
        wait.until(lambda d: d.find_element(By.ID, "learn-job").is_displayed())
        assert driver.find_element(By.ID, "job-family").text == k3
        assert f"{len(small_stream.train[k3])} records" in driver.find_element(By.ID, "job-progress").text
        seen = set()

        def finished(d):
            state = d.find_element(By.ID, "job-state").text
            seen.add(state)
            return state in ("done", "failed", "cancelled")
        WebDriverWait(driver, 600, poll_frequency=0.2).until(finished)
        assert driver.find_element(By.ID, "job-state").text == "done", driver.find_element(By.ID, "job-error").text
        assert len(seen) > 1, seen  # the page followed the job through its states
        assert driver.find_element(By.ID, "job-progress").text.endswith("100%")
        assert driver.find_element(By.ID, "job-bar").get_attribute("style").replace(" ", "") == "width:100%;"
        assert k3 in driver.find_element(By.ID, "job-result").text
        assert not driver.find_element(By.ID, "learn-cancel").is_displayed()
        # the page picked up the new shard
        wait.until(lambda d: "3 shards" in d.find_element(By.ID, "bank-meta").text)
        driver.save_screenshot(str(tmp_path / "learn.png"))
        _keep_screenshot(tmp_path / "learn.png")
        driver.find_element(By.ID, "tab-plan").click()
        assert [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#shard option")] == ["route by content", k1, k2, k3]
