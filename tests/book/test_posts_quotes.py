"""The chapters' "What the posts said, made exact" boxes quote the posts word for word.

Markup: inside a box (a ``:::{admonition} What the posts said, made exact`` block of a
markdown cell) every quotation of the posts is in curly double quotes, “like this”; an
ellipsis … inside one marks words left out. Each piece must occur in the posts' text
(``shared/seed/attention-posts.txt`` next to the repository, or a folder above it),
in order, after normalising whitespace and apostrophes. Straight "double quotes" are
not quotations of the posts. Where the posts' text is absent (a pip-installed copy,
Colab) the check skips and says why.
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
BOX = re.compile(r":::\{admonition\} What the posts said, made exact\n(.*?)\n:::", re.S)
QUOTE = re.compile(r"“([^”]*)”")
POSTS_REL = pathlib.Path("shared", "seed", "attention-posts.txt")


def _posts_path() -> pathlib.Path | None:
    """The posts' text in a ``shared/`` beside the repository or a folder above it."""
    for parent in ROOT.parents:
        if (parent / POSTS_REL).is_file():
            return parent / POSTS_REL
    return None


def _norm(text: str) -> str:
    text = text.replace("’", "'").replace("‘", "'")
    return " ".join(text.split())


def boxes(nb_path: pathlib.Path) -> list[str]:
    cells = json.loads(nb_path.read_text())["cells"]
    return [
        m.group(1)
        for c in cells
        if c["cell_type"] == "markdown"
        for m in BOX.finditer("".join(c["source"]))
    ]


def quotes(box: str) -> list[list[str]]:
    """Each quotation of a box, as its pieces between ellipses."""
    return [
        [p for p in (_norm(s) for s in q.split("…")) if p] for q in QUOTE.findall(box)
    ]


def test_the_markup_reads_quotes_and_ellipses():
    box = "“Self-Attention: Each … all other\n  elements.” then “a”, “a’b”"
    assert quotes(box) == [
        ["Self-Attention: Each", "all other elements."],
        ["a"],
        ["a'b"],
    ]


def test_every_post_chapter_has_a_box_with_quotes():
    with_box = [p.name for p in CHAPTERS if boxes(p)]
    # the posts cover chapters 1-4 (self/cross, flash, soft/hard, deformable)
    assert with_box == [p.name for p in CHAPTERS[:4]]
    for p in CHAPTERS[:4]:
        (box,) = boxes(p)
        assert len(quotes(box)) >= 3, f"{p.name}: fewer than 3 quotations"
        assert "Vijayasri Iyer" in box, f"{p.name}: box does not credit the posts"


@pytest.mark.parametrize("nb_path", CHAPTERS[:4], ids=lambda p: p.name)
def test_quoted_phrases_occur_in_the_posts(nb_path):
    path = _posts_path()
    if path is None:
        pytest.skip(
            f"the posts' text ({POSTS_REL}) is not beside this copy of the "
            "book (e.g. on Colab): the quotations cannot be checked here"
        )
    posts = _norm(path.read_text())
    (box,) = boxes(nb_path)
    for pieces in quotes(box):
        at = 0
        for piece in pieces:
            found = posts.find(piece, at)
            assert found >= 0, f"{nb_path.name}: not in the posts (in order): {piece!r}"
            at = found + len(piece)


def test_references_page_lists_the_posts_reading_list():
    """Every link in the posts (their eight recommended resources) is on the References
    page, which credits the posts."""
    path = _posts_path()
    if path is None:
        pytest.skip(
            f"the posts' text ({POSTS_REL}) is not beside this copy of the "
            "book (e.g. on Colab): the reading list cannot be checked here"
        )
    links = re.findall(r"https?://\S+", path.read_text())
    assert len(links) == 8, links
    page = (ROOT / "references.md").read_text()
    assert "Vijayasri Iyer" in page
    missing = [u for u in links if f"<{u}>" not in page]
    assert not missing, f"references.md lacks the posts' links {missing}"
