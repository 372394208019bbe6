"""The chapter pages as a reader sees them: little visible code, every figure numbered.

The site tests read the built HTML (``make book`` first); the line-length test reads the
notebooks themselves.
"""

import json
import pathlib

import pytest
import yaml
from bs4 import BeautifulSoup

ROOT = pathlib.Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
CHAPTERS = [
    c["file"]
    for part in TOC.get("parts") or [TOC]
    for c in part.get("chapters") or []
    if c["file"].startswith("chapters/")
]
MAX_VISIBLE_CODE_LINES = 200
MAX_LINE = 88  # ruff's line length


def _page(chapter: str) -> BeautifulSoup:
    path = HTML / f"{chapter}.html"
    if not path.exists():
        pytest.fail(f"no built page {path}: run `make book` first")
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _collapsed(node) -> bool:
    """True when a code input is not shown until the reader opens it (hide-input)."""
    return node.find_parent("details") is not None


def visible_code_lines(soup: BeautifulSoup) -> int:
    """Lines of notebook code shown open on the page (kernel listings are not cells)."""
    lines = 0
    for cell_input in soup.select("div.cell_input"):
        if _collapsed(cell_input):
            continue
        for pre in cell_input.find_all("pre"):
            lines += len([ln for ln in pre.get_text().splitlines() if ln.strip()])
    return lines


@pytest.mark.site
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_visible_code_is_short(chapter):
    n = visible_code_lines(_page(chapter))
    print(f"{chapter}: {n} visible lines of notebook code")
    assert n < MAX_VISIBLE_CODE_LINES, (
        f"{chapter} shows {n} lines of code open; collapse plot-only cells (hide-input)"
    )


@pytest.mark.site
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_output_figure_is_numbered_and_captioned(chapter):
    soup = _page(chapter)
    images = soup.select("div.cell_output img")
    bad = []
    for img in images:
        fig = img.find_parent("figure")
        caption = fig.find("figcaption") if fig is not None else None
        number = caption.select_one("span.caption-number") if caption else None
        text = caption.get_text(" ", strip=True) if caption else ""
        if fig is None or number is None or len(text) < 20:
            bad.append(img.get("src", "?"))
    assert images, f"{chapter} has no figures from code outputs"
    assert not bad, f"{chapter}: figures without a numbered caption: {bad}"
    ids = [f.get("id") for f in soup.select("div.cell_output figure")]
    assert len(ids) == len(set(ids)), f"{chapter}: duplicate figure ids {ids}"


def _code_cells(path: pathlib.Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            yield cell.get("id"), "".join(cell["source"]).splitlines()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_code_lines_fit_88_columns(chapter):
    path = ROOT / f"{chapter}.ipynb"
    long = [
        f"cell {cid} line {i + 1} ({len(line)} chars): {line.strip()[:50]}"
        for cid, lines in _code_cells(path)
        for i, line in enumerate(lines)
        if len(line) > MAX_LINE
    ]
    assert not long, f"{chapter}: code lines over {MAX_LINE} characters:\n" + "\n".join(
        long
    )
