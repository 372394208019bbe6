"""The built site (_build/html), opened in headless Chromium the way a reader opens it.

Run after `make book` (``make site`` / ``make test`` do that). Chromium comes from
Debian's packages (``apt-get install chromium``; ``.ci/run`` installs it), driven by
Playwright (one browser per test worker, tests/book/conftest.py). The home page is
served over HTTP, each chapter page opened from its file as the explorer tests open it
(the worker's shared page, tests/book/site_tools.py), rendered with JavaScript, its DOM
checked, and a screenshot written to ``_build/screenshots/`` for a person to look at.
"""

import functools
import http.server
import pathlib
import socketserver
import threading

import pytest
import yaml
from bs4 import BeautifulSoup

pytestmark = pytest.mark.site

ROOT = pathlib.Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
CHAPTERS = [
    c["file"]
    for part in TOC.get("parts") or [TOC]
    for c in part.get("chapters") or []
    if c["file"].startswith("chapters/")
]


@pytest.fixture(scope="module")
def server():
    if not (HTML / "index.html").exists():
        pytest.fail("no built site: run `make book` first")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(HTML))
    with socketserver.TCPServer(("127.0.0.1", 0), handler) as httpd:
        t = threading.Thread(target=httpd.serve_forever, daemon=True)
        t.start()
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
        httpd.shutdown()


# True once MathJax has typeset the page's math (or the page has none).
MATH_TYPESET = (
    "() => !document.querySelector('.math') || "
    "document.querySelector('mjx-container') !== null"
)


def _render(b, url: str, shot: pathlib.Path) -> BeautifulSoup:
    """The page as Chromium renders it (JavaScript run, MathJax typeset where the page
    has math), its DOM parsed and a 1280-wide screenshot of the whole page written."""
    ctx = b.new_context(viewport={"width": 1280, "height": 2400})
    try:
        page = ctx.new_page()
        page.goto(url, wait_until="load", timeout=120_000)
        page.wait_for_function(MATH_TYPESET, timeout=60_000)
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=False)
        return BeautifulSoup(page.content(), "html.parser")
    finally:
        ctx.close()


def test_home_page_renders(server, browser):
    soup = _render(browser, f"{server}/index.html", SHOTS / "index.png")
    assert CONFIG["title"] in soup.get_text()
    cards = soup.select(".sd-card")
    for chapter in CHAPTERS:
        href = f"{chapter}.html"
        assert soup.find("a", href=lambda h, href=href: h and h.endswith(href)), chapter
        # Every chapter of _toc.yml has its card (not only the table of contents' link).
        linked = [
            c for c in cards if c.find("a", href=lambda h, s=href: h and h.endswith(s))
        ]
        assert linked, f"{chapter} has no card on the landing page"
        assert linked[0].find("img"), f"{chapter}'s card has no thumbnail"
    assert (SHOTS / "index.png").stat().st_size > 10_000


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_page_renders(open_page, chapter):
    # the worker's shared page at 1400 px (tests/book/site_tools.py: loaded once, put
    # back as it was on load), as the explorer tests open it: offline, from the files
    pg = open_page(f"{chapter}.html")
    pg.page.wait_for_function(MATH_TYPESET, timeout=60_000)
    shot = SHOTS / f"{pathlib.Path(chapter).name}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    pg.page.screenshot(path=str(shot), full_page=False)
    soup = BeautifulSoup(pg.page.content(), "html.parser")
    assert not pg.outside, f"requests that left the site: {pg.outside}"
    assert not pg.errors, pg.errors
    main = soup.find("main") or soup
    text = main.get_text(" ")
    # It rendered as a chapter: a title, a summary, exercises.
    assert soup.find("h1"), "no title"
    assert "Summary" in text and "Exercises" in text
    # No cell output is an error.
    errors = soup.select(".output.traceback, .output.error")
    assert not errors, "a cell output is an error"
    assert "Traceback (most recent call last)" not in text
    # Equations were typeset (MathJax is served from the site itself).
    assert soup.find("mjx-container"), "no typeset math"
    # Figures are present (executed at build time).
    imgs = [i for i in soup.select(".cell_output img") if i.get("src")]
    assert len(imgs) >= 3, f"only {len(imgs)} figures on {chapter}"
    # The Colab launch link opens this chapter's Colab edition in the repository
    # (colab/edition.py writes it, colab/launch.py points the theme's button at it).
    repo = CONFIG["repository"]["url"].removeprefix("https://github.com/")
    branch = CONFIG["repository"]["branch"]
    colab = [
        a["href"]
        for a in soup.find_all("a", href=True)
        if "colab.research.google.com" in a["href"]
    ]
    assert colab, "no Colab launch link"
    want = (
        f"https://colab.research.google.com/github/{repo}/blob/{branch}/"
        f"colab/{chapter}.ipynb"
    )
    assert want in colab, colab
    assert (ROOT / "colab" / f"{chapter}.ipynb").exists()
    # Kernel source is on the page (literalinclude, in a dropdown): the Triton kernels;
    # in chapter 1, which calls the kernel chapter 2 lists, its public wrapper; in
    # chapter 6, the ring on torch.distributed that calls the flash kernel per block.
    code = "".join(block.get_text("") for block in main.select("div.highlight"))
    assert (
        "tl.load(" in code
        or "tl.dot(" in code
        or "def flash_attention(" in code
        or "def ring_forward(" in code
    )
    # ... folded: each listing sits in a dropdown, not open on the page.
    listings = [
        d
        for d in main.select("details.sd-dropdown")
        if "Listing" in d.get_text(" ")[:200]
    ]
    assert listings, "no folded kernel listing"
    assert "{dropdown}" not in text, "a dropdown directive rendered as text"
    assert shot.stat().st_size > 10_000
