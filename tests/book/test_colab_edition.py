"""The Colab editions (colab/edition.py) and what every chapter prints for a reader to
run: editions never drift from their pages, carry no raw MyST, hold every listing's
code, number figures as the site does; one setup cell for every chapter; every printed
command names a real file, module or make target."""

import json
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from colab import edition, launch
from tests.conftest import ROOT

PAGES = edition.notebooks()
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
RAW = (
    "{cite",
    "{numref",
    "{ref}",
    "{doc}",
    "{eq}",
    "```{",
    ":::{",
    "{glue",
    "{dropdown",
    "{literalinclude",
    "{admonition",
)


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _src(cell):
    return "".join(cell["source"])


def test_every_chapter_has_an_edition():
    assert set(CHAPTERS) <= set(PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_edition_is_up_to_date(page):
    """Regenerated here, it equals the committed file (python -m colab.edition)."""
    out = edition.edition_path(page)
    assert out.exists(), f"no edition: run python -m colab.edition ({out})"
    assert out.read_text() == edition.dumps(edition.edition(page)), (
        f"{out.relative_to(ROOT)} differs from its page: run python -m colab.edition"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_raw_myst_and_every_listing_present(page):
    cells = _cells(edition.edition_path(page))
    text = "\n".join(_src(c) for c in cells if c["cell_type"] == "markdown")
    for raw in RAW:
        assert raw not in text, f"raw MyST {raw!r} in {page.name}'s edition"
    assert not re.search(r"\{[a-z][\w:-]*\}`", text), "a raw MyST role"
    listings = re.findall(
        r"\{literalinclude\} (\S+)\n(?::\w+:.*\n)*?:pyobject: (\S+)",
        "\n".join(_src(c) for c in _cells(page)),
    )
    for rel, obj in listings:
        code, first, last = edition.pyobject_source((page.parent / rel).resolve(), obj)
        assert f"```python\n{code}\n```" in text, f"{obj} missing"
        assert code.count("\n") == last - first
    assert cells[0]["source"] and _src(cells[0]) == edition.SETUP_CELL
    assert all(not c.get("outputs") for c in cells if c["cell_type"] == "code")


def test_figures_cited_and_linked_as_on_the_site():
    """Chapter numbers come from the toc, figure numbers from the order in the chapter;
    every figure gets its caption below it; citations are author-year links."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    org, repo = (
        config["repository"]["url"].removeprefix("https://github.com/").split("/")
    )
    assert edition.SITE_URL == f"https://{org}.github.io/{repo}/"
    for number, page in enumerate(CHAPTERS, 1):
        figs = [
            _src(c)
            for c in _cells(page)
            if c["cell_type"] == "code"
            and c["metadata"].get("mystnb", {}).get("figure")
        ]
        shown = re.findall(
            r"^\*\*Fig\. (\d+)\.(\d+)\.\*\* ",
            "\n".join(_src(c) for c in _cells(edition.edition_path(page))),
            re.M,
        )
        assert shown == [(str(number), str(k)) for k in range(1, len(figs) + 1)]
    text = "\n".join(_src(c) for c in _cells(edition.edition_path(CHAPTERS[0])))
    assert f"([Vaswani et al., 2017]({edition.REFERENCES_URL}))" in text


def test_renderer_refuses_what_it_does_not_know():
    r = edition.Renderer("chapters/01_self_cross_attention")
    with pytest.raises(ValueError, match="unknown directive"):
        r.render("```{mermaid}\ngraph\n```")
    with pytest.raises(ValueError, match="unknown role"):
        r.render("see {abbr}`x`")
    with pytest.raises(ValueError, match="no reference"):
        r.render("{cite:p}`nobody1999`")
    md = r.render(
        ":::{warning}\nmind `{cite:p}` in code\n:::\n\n````{dropdown} "
        "Solution\n```python\nx = 1  # {numref}`kept`\n```\n````"
    )
    assert md.startswith("> **Warning**\n>\n> mind `{cite:p}` in code")
    assert "<details>\n<summary>Solution</summary>" in md
    assert "x = 1  # {numref}`kept`" in md  # code is code


def test_launch_button_points_at_the_edition():
    base = "https://colab.research.google.com/github/o/r/blob/main/"
    page = "chapters/02_flash_attention"
    assert (
        launch.edition_url(base + page + ".ipynb", page)
        == base + "colab/" + page + ".ipynb"
    )
    assert (
        launch.edition_url(base + "nowhere.ipynb", "nowhere") == base + "nowhere.ipynb"
    )


def test_every_chapter_starts_with_the_one_setup_cell():
    """Cell 0 of every chapter is colab/setup_cell.py, word for word (``python -m
    colab.edition --sync-setup`` copies it), tagged remove-cell on the site."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert f'BOOK_REF = "{config["repository"]["branch"]}"' in edition.SETUP_CELL
    for path in CHAPTERS:
        first = _cells(path)[0]
        assert _src(first) == edition.SETUP_CELL, f"{path.name}: run --sync-setup"
        assert first["metadata"].get("tags") == ["remove-cell"]


COMMAND = re.compile(r"`(?P<cmd>(?:python (?:-m )?|make )[^`]+)`")


def _printed_commands():
    """(where, command) for every command in backticks a chapter prints or says, and
    every one kernels/timing's messages name."""
    out = []
    for path in CHAPTERS:
        for i, cell in enumerate(_cells(path)):
            for m in COMMAND.finditer(_src(cell)):
                out.append((f"{path.name} cell {i} {cell['cell_type']}", m["cmd"]))
    for path in sorted((ROOT / "kernels" / "timing").glob("*.py")):
        for m in COMMAND.finditer(path.read_text()):
            out.append((path.name, m["cmd"]))
    return out


def test_printed_commands_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    found = _printed_commands()
    assert len(found) > 5
    for where, cmd in found:
        words = cmd.split()
        if words[0] == "make":
            assert words[1] in targets, (where, cmd)
            # `make` builds its own .venv with torch pinned for a CPU: not on Colab
            assert "code" not in where, f"{where} prints {cmd!r}: print the python"
        elif words[1] == "-m":
            mod = ROOT / words[2].replace(".", "/")
            assert mod.with_suffix(".py").exists() or (mod / "__main__.py").exists(), (
                where,
                cmd,
            )
        else:
            assert (ROOT / words[1]).is_file(), (where, cmd)
            if "--suite" in words:
                suite = words[words.index("--suite") + 1]
                assert (ROOT / "kernels" / suite / "timing.py").exists(), cmd


def test_jupyter_book_build_points_colab_at_the_edition(tmp_path):
    """A two-page Jupyter Book (no execution) built with this _config.yml's repository,
    launch buttons and colab.launch: a page with an edition gets the edition's Colab
    link; a page without one keeps the theme's."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    book = {
        "title": "t",
        "execute": {"execute_notebooks": "off"},
        "repository": config["repository"],
        "launch_buttons": config["launch_buttons"],
        "sphinx": {"local_extensions": {"colab.launch": str(ROOT)}},
    }
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(book))
    page, other = "chapters/" + CHAPTERS[0].stem, "chapters/zz_no_edition"
    (tmp_path / "_toc.yml").write_text(
        yaml.safe_dump(
            {
                "format": "jb-book",
                "root": "intro",
                "chapters": [{"file": page}, {"file": other}],
            }
        )
    )
    (tmp_path / "intro.md").write_text("# Intro\n")
    (tmp_path / "chapters").mkdir()
    for name in (page, other):
        nb = {
            "cells": [{"cell_type": "markdown", "metadata": {}, "source": "# T"}],
            "metadata": {
                "kernelspec": {
                    "name": "python3",
                    "language": "python",
                    "display_name": "Python 3",
                }
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(nb))
    jb = pathlib.Path(sys.executable).with_name("jupyter-book")
    subprocess.run(
        [str(jb), "build", str(tmp_path)], check=True, capture_output=True, timeout=300
    )
    repo = config["repository"]["url"].removeprefix("https://github.com/")
    base = (
        f"https://colab.research.google.com/github/{repo}/blob/"
        f"{config['repository']['branch']}/"
    )
    html = tmp_path / "_build" / "html"
    assert f'href="{base}colab/{page}.ipynb"' in (html / f"{page}.html").read_text()
    assert f'href="{base}{other}.ipynb"' in (html / f"{other}.html").read_text()
