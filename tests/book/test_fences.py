"""Every directive fence in the book's pages opens as a fence.

CommonMark: the info string of a backtick fence may not contain a backtick. A title
like ````{dropdown} Listing: `_attn_fwd` ... is then no fence at all: the page shows
the directive as text and the listing it was meant to fold open in full (which is how
chapter 2 once showed three whole kernels). Titles name code without backticks.
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "chapters").glob("*.ipynb")) + [
    ROOT / "benchmarks_page.ipynb",
    ROOT / "intro.md",
    ROOT / "references.md",
]
FENCE = re.compile(r"^(`{3,})(.*)$")


def _markdown(path: pathlib.Path) -> list[str]:
    if path.suffix == ".md":
        return [path.read_text()]
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_backtick_in_a_fence_info_string(path):
    bad = [
        line
        for text in _markdown(path)
        for line in text.splitlines()
        if (m := FENCE.match(line.strip())) and "`" in m.group(2)
    ]
    assert not bad, f"{path.name}: fences that CommonMark reads as text: {bad}"


def test_the_rule_catches_a_backtick_title():
    line = "````{dropdown} Listing: `_attn_fwd` (kernels/flash/forward.py)"
    assert "`" in FENCE.match(line).group(2)
