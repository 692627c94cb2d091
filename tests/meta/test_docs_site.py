"""The documentation site builds (``mkdocs build --strict``: every page in the nav, every anchor,
every API entry found) and renders in a real browser: headless Chromium, driven over the DevTools
protocol, opens the home page, an API page and a search, and each shows what it should. The
browser is started by the test and stopped by its own PID; the site is served on loopback."""
import base64
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from conftest import ROOT

pytest.importorskip("mkdocstrings", reason="pip install -e '.[test]' (mkdocs-material, mkdocstrings-python)")
pytest.importorskip("websockets", reason="pip install -e '.[test]' (the DevTools protocol's client)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = os.environ.get("RLPT_SITE_SHOTS")  # a folder to keep the screenshots in (docs/images/ when refreshing them)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class Page:
    """One browser tab over the DevTools protocol: navigate, evaluate, screenshot."""

    def __init__(self, ws_url: str):
        from websockets.sync.client import connect

        self.ws, self.next_id = connect(ws_url, max_size=None, open_timeout=30), 0

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events arrive between answers
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]

    def value(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while not (found := self.value(expression)):
            assert time.monotonic() < deadline, f"not true within {timeout:.0f} s: {expression}"
            time.sleep(0.2)
        return found

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for(f"location.href.startsWith({json.dumps(url.split('?')[0])}) && document.readyState == 'complete'")

    def screenshot(self, path) -> bytes:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        with open(path, "wb") as f:
            f.write(png)
        return png


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("needs Chromium (make install puts Debian's chromium in)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "Chromium did not open its DevTools port"
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        yield Page(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
    finally:
        os.killpg(proc.pid, 9)  # the browser and its helpers: a group of its own (start_new_session)
        proc.wait(timeout=30)


def _shot(page: Page, tmp_path, name: str) -> None:
    png = page.screenshot(tmp_path / name)
    assert png.startswith(b"\x89PNG") and len(png) > 20_000  # a rendered page, not a blank one
    if SHOTS:
        shutil.copy(tmp_path / name, os.path.join(SHOTS, name))


def test_the_home_page_renders_with_the_navigation(site, browser, tmp_path):
    browser.open(site + "/")
    assert browser.value("document.querySelector('h1').firstChild.textContent") == "lightning-rlpt documentation"
    nav = browser.value("[...document.querySelectorAll('.md-nav__item--section > label')].map(e => e.textContent.trim())")
    assert nav[:7] == ["Start", "Train", "Rollouts", "Rewards", "Scale", "Reference", "Results"][:len(nav)] and \
        len(nav) >= 6, nav
    _shot(browser, tmp_path, "site_home.png")


def test_an_api_page_shows_the_docstrings(site, browser, tmp_path):
    browser.open(site + "/api/")
    headings = browser.value("[...document.querySelectorAll('.doc-heading')].map(e => e.textContent.trim())")
    assert any(h.startswith("RLModule") for h in headings) and any(h.startswith("VLLMRollout") for h in headings), \
        headings
    assert "max_staleness" in browser.value("document.querySelector('.md-content').innerText")
    # docstring examples render as code blocks, never as prose (where `[...]` output reads as a link)
    where = browser.value("[...document.querySelectorAll('.md-content pre, .md-content p')]"
                          ".filter(e => e.textContent.includes('>>>')).map(e => e.tagName)")
    assert where and set(where) == {"PRE"}, where
    _shot(browser, tmp_path, "site_api.png")


def test_search_finds_a_page(site, browser, tmp_path):
    browser.open(site + "/")
    browser.value("(() => { const t = document.querySelector('[data-md-toggle=search]'); t.checked = true;"
                  " t.dispatchEvent(new Event('change', {bubbles: true}));"  # the search overlay opens, as on a click
                  " const i = document.querySelector('[data-md-component=search-query]'); i.focus();"
                  " i.value = 'staleness'; i.dispatchEvent(new Event('input', {bubbles: true}));"
                  " i.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true})); return true })()")
    titles = browser.wait_for("(() => { const r = [...document.querySelectorAll('.md-search-result__item')];"
                              " return r.length && r.map(e => e.textContent.trim().slice(0, 80)) })()")
    assert any("synchronous" in t.lower() or "staleness" in t.lower() for t in titles), titles
    _shot(browser, tmp_path, "site_search.png")
