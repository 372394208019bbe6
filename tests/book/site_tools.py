"""What the site tests share: headless Chromium (Debian's, driven by Playwright) and the
built pages it opens offline, each loaded once per test worker and reset between tests.

Loading a chapter page takes Chromium 2 to 4 s on 2 cores, most of it MathJax's and
the theme's icon scripts (1.1 and 1.5 MB) compiling, not ours; the explorer tests open
six pages at two widths some sixty times. So a page is loaded once per worker and
width (``open_page``), 2400 px tall (every explorer in view), and handed to each test
as it was loaded: before a test takes it, every explorer control goes back to the value
it had on load (through the control's own DOM event, as a reader's move), the theme
and scroll position too, focus leaves, and the lists of page errors and refused
requests start empty. The explorers' states must then equal those on load, or the
page is loaded anew; a page whose test failed is closed, not reused.
"""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots" / "explorers"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HEIGHT = 2400  # every explorer of a page in view at once, at 1400 and 390 px wide


def launch_browser():
    """The browser for a test session (a generator: yields it, closes it after)."""
    if not (HTML / "index.html").exists():
        pytest.fail("no built site: run `make book` first")
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        msg = "headless Chromium is needed for the site tests: apt-get install chromium"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


# What a page holds on load (read once), and puts back before each later test: each
# explorer control's value (or checked state), the theme attributes of <html>.
_SNAPSHOT = """() => ({
  theme: document.documentElement.dataset.theme ?? null,
  mode: document.documentElement.dataset.mode ?? null,
  controls: Object.fromEntries(Object.entries(window.staticExplorers).map(
    ([eid, h]) => [eid, Object.entries(h.controls).map(([name, c]) =>
      [name, c.input.type === "checkbox" ? c.input.checked : c.input.value])])),
  states: Object.fromEntries(Object.entries(window.staticExplorers).map(
    ([eid, h]) => [eid, h.state()])),
})"""

_RESET = """async (snap) => {
  const root = document.documentElement;
  for (const key of ["theme", "mode"]) {
    if (snap[key] === null) delete root.dataset[key];
    else root.dataset[key] = snap[key];
  }
  // twice: a control whose options another control sets is right on the second pass
  for (let pass = 0; pass < 2; pass++) {
    for (const [eid, controls] of Object.entries(snap.controls)) {
      const h = window.staticExplorers[eid];
      for (const [name, value] of controls) {
        const input = h.controls[name].input;
        if (input.type === "checkbox") {
          if (input.checked !== value) input.click();
        } else if (input.value !== value) {
          input.value = value;
          input.dispatchEvent(new Event(
            input.type === "range" ? "input" : "change", {bubbles: true}));
        }
      }
      await h.ready;
    }
  }
  if (document.activeElement) document.activeElement.blur();
  window.scrollTo(0, 0);
  return Object.fromEntries(Object.entries(window.staticExplorers).map(
    ([eid, h]) => [eid, h.state()]));
}"""


class Page:
    """One built page, opened offline at a given width; ``outside`` lists
    refused requests, ``errors`` the page's uncaught errors."""

    def __init__(self, browser, name: str, width: int = 1400, height: int = HEIGHT):
        self.name, self.width = name, width
        self.outside, self.errors = [], []
        self.ctx = browser.new_context(
            viewport={"width": width, "height": height}, service_workers="block"
        )
        self.ctx.route("**/*", self._route)
        self.page = self.ctx.new_page()
        self.page.on("pageerror", self._error)
        self.page.goto((HTML / name).as_uri())
        self.page.wait_for_function(
            "() => document.querySelectorAll('.static-explorer').length > 0 && "
            "[...document.querySelectorAll('.static-explorer')].every(el => "
            "window.staticExplorers && window.staticExplorers[el.id] && "
            "window.staticExplorers[el.id].redraws > 0)",
            timeout=30_000,
        )
        self.snapshot = self.page.evaluate(_SNAPSHOT)

    def reset(self) -> bool:
        """Put the page back as it was on load (see the module's docstring); False
        when its explorers' states are not those of the load after it."""
        self.outside, self.errors = [], []
        states = self.page.evaluate(_RESET, self.snapshot)
        return states == self.snapshot["states"] and not self.errors

    def _error(self, err):
        # sphinx-thebe declares THEBE_JS_URL twice on every page (not ours, harmless).
        if "THEBE_JS_URL" not in str(err):
            self.errors.append(str(err))

    def _route(self, route):
        url = route.request.url
        if (
            url.startswith("file://")
            or url.startswith("data:")
            or url.startswith("blob:")
        ):
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()

    def explorer_id(self, kind: str) -> str:
        ids = self.page.evaluate(
            "k => Object.values(window.staticExplorers)"
            ".filter(h => h.kind === k).map(h => h.id)",
            kind,
        )
        assert len(ids) == 1, f"{len(ids)} explorers of kind {kind}"
        return ids[0]

    def set(self, eid: str, name: str, value) -> float:
        """Set control ``name`` (option index, or checked) as a reader would: change the
        element, fire its own event; wait for the redraw; return its time in ms."""
        return self.page.evaluate(
            """async ([eid, name, value]) => {
                 const root = document.getElementById(eid);
                 const input = root.querySelector(`[data-name="${name}"]`);
                 const h = window.staticExplorers[eid];
                 const before = h.redraws;
                 if (input.type === "checkbox") {
                   if (input.checked !== value) input.click();
                 } else {
                   input.value = String(value);
                   input.dispatchEvent(new Event(
                     input.type === "range" ? "input" : "change", {bubbles: true}));
                 }
                 await h.ready;
                 if (h.redraws === before) throw new Error("no redraw after " + name);
                 return h.lastRedrawMs;
               }""",
            [eid, name, value],
        )

    def timed_set(self, eid: str, name: str, value, away, limit_ms: float) -> float:
        """``set`` that times the move; a move past ``limit_ms`` is timed again, up to
        three more times, each after a pause and a move to ``away`` and back, and the
        least time is returned. On two cores shared with another test worker, the
        first redraw of a page can carry the browser's compile of the drawing code (CI
        measured 120 ms once, then about 30 ms for every later move), and a burst of
        the other worker's work can cover two moves in a row (115 ms twice, on a page
        whose every other move took 9 to 16 ms); a redraw slow four times over, with
        pauses between, is slow."""
        ms = self.set(eid, name, value)
        for _ in range(3):
            if ms < limit_ms:
                break
            self.page.wait_for_timeout(250)
            self.set(eid, name, away)
            ms = min(ms, self.set(eid, name, value))
        return ms

    def n_options(self, eid: str, name: str) -> int:
        return self.page.evaluate(
            """([eid, name]) => { const i = document.getElementById(eid)
                 .querySelector(`[data-name="${name}"]`);
                 return i.type === "checkbox" ? 2
                   : i.tagName === "SELECT" ? i.options.length
                   : Number(i.max) + 1; }""",
            [eid, name],
        )

    def data(self, eid: str, chart: str, name: str) -> list[dict]:
        return self.page.evaluate(
            "([eid, c, n]) => window.staticExplorers[eid].views[c].data(n)"
            ".map(r => Object.fromEntries(Object.entries(r).filter(([k]) => "
            "!k.startsWith('Symbol'))))",
            [eid, chart, name],
        )

    def state(self, eid: str) -> dict:
        return self.page.evaluate("eid => window.staticExplorers[eid].state()", eid)

    def readout(self, eid: str) -> str:
        return self.page.evaluate(
            "eid => document.getElementById(eid).querySelector('.se-readout')"
            ".textContent",
            eid,
        )

    def controls(self, eid: str) -> list[str]:
        return self.page.evaluate(
            "eid => Object.keys(window.staticExplorers[eid].controls)", eid
        )

    def control_boxes(self, eid: str) -> list[dict]:
        """The explorer's inputs in page order: name, whether a label names it, tab
        index, disabled, right edge and width on screen (px)."""
        return self.page.evaluate(
            """eid => [...document.getElementById(eid)
                 .querySelectorAll('input, select')]
                 .map(i => ({name: i.dataset.name, label: !!document.querySelector(
                   `label[for="${i.id}"]`), tab: i.tabIndex, disabled: i.disabled,
                   right: i.getBoundingClientRect().right,
                   w: i.getBoundingClientRect().width}))""",
            eid,
        )

    def close(self):
        self.ctx.close()


class SharedPages:
    """The pages of one test worker, loaded once per (page, width) and reset before
    each later use."""

    def __init__(self, browser):
        self.browser, self.open = browser, {}

    def get(self, name: str, width: int = 1400) -> Page:
        pg = self.open.pop((name, width), None)
        if pg is not None and not pg.reset():
            pg.close()
            pg = None
        if pg is None:
            pg = Page(self.browser, name, width=width)
        self.open[(name, width)] = pg
        return pg

    def drop(self, pg: Page) -> None:
        """Close ``pg`` and forget it (its test failed: the next one loads anew)."""
        if self.open.get((pg.name, pg.width)) is pg:
            del self.open[(pg.name, pg.width)]
        pg.close()

    def close(self) -> None:
        for pg in self.open.values():
            pg.close()
        self.open.clear()
