"""The server's web page in a real browser: `keras-transformer serve` as users
start it, driven by Debian's headless Chromium through Selenium.

Needs `apt-get install chromium chromium-driver` (CI installs both).
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import keras
import pytest

import keras_transformer as kt

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SENTENCE = "Two dogs play in the snow."
# The server answers /health with 200 only once every batch shape is compiled.
HEALTH_WAIT_S = 900
TRANSLATION_WAIT_S = 60

pytestmark = [
    pytest.mark.slow,  # a server that compiles its batch shapes, and a browser
    pytest.mark.skipif(
        not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
        reason=f"needs Chromium and its driver at {CHROMIUM} and {CHROMEDRIVER}: "
        "apt-get install chromium chromium-driver",
    ),
]

# Chromium reaches for Google's hosts (updates, sync, field trials, QUIC
# probes) unless told not to; a test talks to the local server only.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,800",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(url: str, process: subprocess.Popen, log: Path) -> None:
    """Returns once `url`/health answers 200; fails with the server's log if it
    exits or is not ready within `HEALTH_WAIT_S`."""
    deadline = time.monotonic() + HEALTH_WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"The server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):  # not listening yet, or 503 while warming up
            pass
        time.sleep(1)
    pytest.fail(f"/health did not answer 200 within {HEALTH_WAIT_S} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """The URL of `keras-transformer serve multi30k_en_de`, stopped after the module."""
    folder = tmp_path_factory.mktemp("server")
    port = free_port()
    # The console script pip installed beside this Python.
    script = str(Path(sys.executable).with_name("keras-transformer"))
    command = [script, "serve", "multi30k_en_de", "--port", str(port), "--greedy"]
    command += ["--max-batch-size", "1", "--max-source-tokens", "32"]  # the page sends one sentence
    # Compiled programs go to this run's folder, not the user's cache.
    environment = dict(
        os.environ, KERAS_BACKEND=keras.config.backend(), KERAS_TRANSFORMER_COMPILE_CACHE=str(folder / "compiled")
    )
    log = folder / "server.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=environment)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def expected_translation() -> str:
    model = kt.Transformer.from_preset("multi30k_en_de")
    return model.translate([SENTENCE], beam_size=None)[0]


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    # A driver path of our own: Selenium Manager would look for one online.
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def wait_for_languages(browser) -> None:
    """Waits until the page has filled its selects from /languages."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 30).until(
        lambda driver: driver.execute_script("return document.getElementById('target').options.length")
    )


def options_of(browser, select_id: str) -> list[tuple[str, str]]:
    from selenium.webdriver.support.ui import Select

    element = browser.find_element("id", select_id)
    return [(option.get_attribute("value"), option.text) for option in Select(element).options]


def test_page_translates_with_the_languages_the_server_serves(server_url, expected_translation, browser):
    from selenium.webdriver.support.ui import Select, WebDriverWait

    languages = get_json(f"{server_url}/languages")
    names = {language["code"]: language["name"] for language in languages}
    targets = {language["code"]: language["targets"] for language in languages}
    browser.get(f"{server_url}/")
    wait_for_languages(browser)

    sources = [(code, names[code]) for code in names if targets[code]]
    assert sources == [("en", "English")]
    # "Detect language" first, as LibreTranslate's page starts: it translates into every target.
    assert options_of(browser, "source") == [("auto", "Detect language"), *sources]
    assert options_of(browser, "target") == [(code, names[code]) for code in targets["en"]] == [("de", "German")]
    assert Select(browser.find_element("id", "source")).first_selected_option.text == "Detect language"
    assert Select(browser.find_element("id", "target")).first_selected_option.text == "German"

    browser.find_element("id", "text").send_keys(SENTENCE)
    browser.find_element("id", "translate").click()
    translation = WebDriverWait(browser, TRANSLATION_WAIT_S).until(
        lambda driver: driver.find_element("id", "translation").text
    )
    assert translation == expected_translation
    assert browser.find_element("id", "detected").text.startswith("Detected: English (")
    assert browser.find_element("id", "status").text == ""
    assert browser.find_element("id", "translate").is_enabled()

    # A chosen source translates without detection.
    Select(browser.find_element("id", "source")).select_by_value("en")
    assert browser.find_element("id", "detected").text == ""
    browser.find_element("id", "translate").click()
    WebDriverWait(browser, TRANSLATION_WAIT_S).until(lambda driver: driver.find_element("id", "translate").is_enabled())
    assert browser.find_element("id", "translation").text == expected_translation
    assert browser.find_element("id", "detected").text == ""


class ResourceReferences(HTMLParser):
    """The URLs an HTML page's tags load (scripts, style sheets, fonts, images, frames)."""

    LOADING = {"src", "href", "data", "poster"}

    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            return  # a link is followed only when clicked
        self.urls += [value for name, value in attrs if name in self.LOADING and value]


def test_page_loads_nothing_from_other_hosts(server_url, browser):
    with urllib.request.urlopen(f"{server_url}/", timeout=10) as response:
        html = response.read().decode("utf-8")
    references = ResourceReferences()
    references.feed(html)
    host = urlsplit(server_url).netloc
    # A relative or data: URL has no host of its own.
    foreign = [url for url in references.urls if urlsplit(urljoin(f"{server_url}/", url)).netloc not in ("", host)]
    assert foreign == []
    assert "@import" not in html and "url(" not in html, "a style sheet that loads fonts or images"

    browser.get(f"{server_url}/")
    wait_for_languages(browser)
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map((entry) => entry.name)")
    assert f"{server_url}/languages" in loaded
    assert [url for url in loaded if urlsplit(url).netloc != host] == []
