"""Citations: every {cite} key resolves in references.bib,
each chapter cites >= 3 works."""

import json
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
BIB = (ROOT / "references.bib").read_text()
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
MIN_WORKS_PER_CHAPTER = 3


def _entries() -> dict[str, str]:
    """Key -> body of each @type{key, ...} entry in references.bib."""
    starts = list(re.finditer(r"^@(\w+)\{([^,\s]+),", BIB, flags=re.M))
    ends = [m.start() for m in starts[1:]] + [len(BIB)]
    return {m.group(2): BIB[m.end() : end] for m, end in zip(starts, ends)}


def _keys(text: str) -> set[str]:
    return {k.strip() for group in CITE.findall(text) for k in group.split(",")}


def _markdown(nb_path: pathlib.Path) -> str:
    cells = json.loads(nb_path.read_text())["cells"]
    return "\n".join(
        "".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
    )


def test_bib_keys_are_unique_and_linked():
    keys = re.findall(r"^@\w+\{([^,\s]+),", BIB, flags=re.M)
    assert len(keys) == len(set(keys)), "duplicate keys in references.bib"
    for key, body in _entries().items():
        assert re.search(r"^\s*(url|doi)\s*=", body, flags=re.M), (
            f"{key}: no url or doi"
        )


@pytest.mark.parametrize("page", [*NOTEBOOKS, ROOT / "intro.md"], ids=lambda p: p.name)
def test_every_citation_resolves(page):
    text = _markdown(page) if page.suffix == ".ipynb" else page.read_text()
    missing = _keys(text) - set(_entries())
    assert not missing, (
        f"{page.name} cites keys not in references.bib: {sorted(missing)}"
    )


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_chapter_cites_enough_works(nb_path):
    cited = _keys(_markdown(nb_path))
    assert len(cited) >= MIN_WORKS_PER_CHAPTER, (
        f"{nb_path.name} cites only {sorted(cited)}"
    )


def test_bibliography_page_is_built():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert "references.bib" in config["bibtex_bibfiles"]
    assert "{bibliography}" in (ROOT / "references.md").read_text()
    toc = (ROOT / "_toc.yml").read_text()
    assert re.search(r"file:\s*references\s*$", toc, flags=re.M)


def test_bibliography_labels_are_short_author_year_keys():
    """The References page labels entries with pybtex's alpha style: initials or a short
    name and a two-digit year ("VSP+17", "NVIDIA20"). An accent written as a TeX macro
    or a multi-word author in braces leaks whole words into it ("BLeonardC13",
    "TheTauthors24"): write accents in Unicode and organisations as one braced name."""
    pybtex = pytest.importorskip("pybtex")
    from pybtex.database import parse_string
    from pybtex.style.labels.alpha import LabelStyle

    assert pybtex
    entries = parse_string(BIB, "bibtex").entries
    labels = list(LabelStyle().format_labels(entries.values()))
    bad = {
        k: lab
        for k, lab in zip(entries, labels)
        if not re.fullmatch(r"[A-Za-z+]{1,7}\d\d[a-z]?", lab)
    }
    assert not bad, bad
