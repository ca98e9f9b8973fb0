"""`substreams ui` against a running workload, in headless chromium (Debian's chromium and
chromium-driver, driven by selenium), plus its JSON and server-sent-event routes."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from substreams.app import Application
from substreams.config import Config
from substreams.streams.publisher import Publisher
from substreams.ui.server import DashboardServer, serve
from tests.conftest import ConfigFactory
from tests.integration.test_acker import FAST, acker, wait_notifications
from tests.integration.test_cli import serving

SCREENSHOT_ENV = "SUBSTREAMS_DASHBOARD_PNG"
"""Set to a path to keep the screenshot (how docs/dashboard.png is made)."""


def chromium() -> webdriver.Chrome:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "needs Debian's chromium and chromium-driver (apt-get install)"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,900"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def rows(browser: webdriver.Chrome, selector: str) -> list[list[str]]:
    """The cell texts of every row matching ``selector``, read in one script run (the page
    re-renders on every update, so element handles go stale between calls)."""
    found: list[list[str]] = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])]"
        ".map(r => [...r.querySelectorAll('td')].map(c => c.textContent));",
        selector,
    )
    return found


@pytest.fixture
def epochs(make_config: ConfigFactory) -> Config:
    return make_config(
        [{"name": "clicks", "partitions": 2}],
        [{"name": "epochs", "stream": "clicks", "kind": "epoch", "field": "ts"}],
        acker=FAST,
    )


@pytest.fixture
def dashboard(epochs: Config) -> Iterator[DashboardServer]:
    server = serve(epochs, port=0)
    try:
        yield server
    finally:
        server.stop()


def publish_epoch(pub: Publisher, substream: str, t: int, *, seal: bool = True) -> None:
    pub.publish({"user": "u", "url": f"/{t}", "ts": t})
    if seal:
        pub.seal(substream, t)
    pub.flush()


def test_a_new_epoch_appears_in_the_browser(
    epochs: Config, dashboard: DashboardServer, tmp_path: Path
) -> None:
    stream, sub = epochs.streams[0].name, epochs.substreams[0].name
    card = f'section.substream[data-substream="{sub}"]'
    with acker(epochs), Application(epochs).publisher(stream, "src") as pub:
        publish_epoch(pub, sub, 0)
        assert len(wait_notifications(epochs, sub, 1)) == 1
        browser = chromium()
        try:
            browser.get(dashboard.url)
            wait = WebDriverWait(browser, 30)
            notified = f"{card} tr.notification"
            wait.until(lambda b: rows(b, f'{notified}[data-time="0"]'))
            assert not rows(browser, f'{notified}[data-time="1"]')
            # the page is live: a new epoch shows up without a reload
            publish_epoch(pub, sub, 1)
            wait.until(lambda b: rows(b, f'{notified}[data-time="1"]'))
            # an open time, not sealed by its source (a terminal stream's record is sent
            # and received on delivery: its XOR is already balanced)
            publish_epoch(pub, sub, 2, seal=False)
            [cells] = wait.until(lambda b: rows(b, f'{card} tr.open-time[data-time="2"]'))
            assert cells[1:4] == ["0 (balanced)", "1", "src"]
            # it has not sealed epoch 2: it holds it ("holds", "for" after "state")
            [source] = wait.until(lambda b: [
                r for r in rows(b, 'tr.source[data-source="src"]') if r[-2] == "2"
            ])
            assert source[-3] == "live" and source[-1].endswith("s"), source  # "N ms" or "N.N s"
            assert "alive" in browser.find_element(By.ID, "acker").text
            script = "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent);"
            assert wait.until(
                lambda b: b.execute_script(script, f"{card} .frontier") == ["{2}", "{2}"]
            )
            publish_epoch(pub, sub, 3, seal=False)  # the upper frontier moves, the lower not
            assert wait.until(
                lambda b: b.execute_script(script, f"{card} .frontier") == ["{2}", "{3}"]
            )
            shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "dashboard.png")
            assert browser.save_screenshot(str(shot))
            assert shot.read_bytes().startswith(b"\x89PNG")
        finally:
            browser.quit()


def test_state_and_events_carry_the_snapshot(epochs: Config, dashboard: DashboardServer) -> None:
    stream, sub = epochs.streams[0].name, epochs.substreams[0].name
    with acker(epochs), Application(epochs).publisher(stream, "src") as pub:
        publish_epoch(pub, sub, 7)
        assert len(wait_notifications(epochs, sub, 1)) == 1
    with urllib.request.urlopen(dashboard.url + "events", timeout=30) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        while True:  # the first snapshots may predate the notification
            line = resp.readline().decode()
            if not line.startswith("data: "):
                continue
            snap = json.loads(line[len("data: "):])
            [card] = [s for s in snap["substreams"] if s["name"] == sub]
            if card["notifications"]:
                break
    assert [n["time"] for n in card["notifications"]] == ["7"]
    assert card["notifications"][0]["latency_ms"] >= 0
    with urllib.request.urlopen(dashboard.url + "state", timeout=10) as resp:
        state = json.load(resp)
    assert [s["name"] for s in state["substreams"]] == [sub]
    assert state["acker"]["name"] == epochs.acker.name


def test_ui_command_serves_until_interrupted(epochs: Config) -> None:
    with serving("ui", "-c", str(epochs.path), "--port", "0") as (_, line):
        assert line.startswith("dashboard on http://127.0.0.1:"), line
        url = line.split()[2]
        with urllib.request.urlopen(url + "state", timeout=30) as resp:
            state = json.load(resp)
        assert [s["name"] for s in state["substreams"]] == [epochs.substreams[0].name]
        with urllib.request.urlopen(url, timeout=30) as resp:
            assert b"EventSource" in resp.read()
