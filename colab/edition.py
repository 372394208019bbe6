"""The Colab edition of every notebook page of the book: what the site renders from
MyST markup, written out as plain notebook Markdown that Colab shows as the site does.

Colab opens notebooks from GitHub and renders only Markdown, HTML and LaTeX, so a
MyST role or directive would arrive as raw text. For each notebook in ``_toc.yml`` this
writes ``colab/<its path>`` (``chapters/02_flash_attention.ipynb`` ->
``colab/chapters/02_flash_attention.ipynb``), committed, with:

* ``{literalinclude}`` with ``:pyobject:`` -> the object's source, read with ``ast``
  from the file at this commit, as a fenced code block with a link to the file;
* ``{cite:p}`` / ``{cite:t}`` -> author-year text linked to the References page on the
  site; ``{numref}`` / ``{ref}`` -> "Fig. 2.3" (numbered as Jupyter Book numbers them:
  the chapter's place among the numbered chapters of ``_toc.yml``, the figure's place
  in its chapter), ``{doc}`` and links to other pages -> the pages on the site, links to
  files -> the files on GitHub;
* ``{dropdown}`` -> ``<details>``, admonitions -> quotes, ``{code-block}`` -> a fence
  with its caption, ``{glue:figure}`` -> a line saying where the figure appears;
* each figure's caption as a Markdown cell below the cell that draws it; cells hidden
  on the site (``hide-input``) as Colab forms, their code one click away; outputs
  cleared. The setup cell (``colab/setup_cell.py``) stays first and runs; a page
  without one gets it.

A directive or role this module does not know is an error, never passed through.
``python -m colab.edition`` rewrites every edition (``make book`` does, first);
``--check`` only reports the editions that differ, and ``--sync-setup`` first copies
``colab/setup_cell.py`` into cell 0 of every ``chapters/*.ipynb``.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import re
import sys

import yaml

from .sources import (
    ROOT,
    bibliography,
    cell_source,
    labels,
    notebooks,
    page_title,
    pyobject_source,
    toc_pages,
)

OUT = ROOT / "colab"
SETUP_CELL = (OUT / "setup_cell.py").read_text()
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPO_URL = CONFIG["repository"]["url"].rstrip("/")
BRANCH = CONFIG["repository"].get("branch", "main")
_ORG, _REPO = REPO_URL.removeprefix("https://github.com/").split("/")[:2]
#: The book's site: GitHub Pages of the repository named in _config.yml.
SITE_URL = f"https://{_ORG}.github.io/{_REPO}/"
REFERENCES_URL = SITE_URL + "references.html"
FILES_URL = f"{REPO_URL}/blob/{BRANCH}/"

ADMONITIONS = (
    "note",
    "tip",
    "hint",
    "important",
    "warning",
    "caution",
    "attention",
    "danger",
    "error",
    "seealso",
)
FENCE = re.compile(
    r"^(?P<indent> *)(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:-]+)\}"
    r"(?P<arg>.*)$"
)
PLAIN_FENCE = re.compile(r"^ *(`{3,}|~{3,})")
ROLE = re.compile(r"\{(?P<name>[a-z][\w:-]*)\}`(?P<text>[^`]*)`")
#: One pass, left to right: a role, a link, or a code span or math kept as it is.
INLINE = re.compile(
    "|".join(
        [
            ROLE.pattern,
            r"(?<!!)\[(?P<ltext>[^\]]+)\]\((?P<url>[^)\s]+)\)",
            r"`[^`\n]+`",
            r"\$\$.*?\$\$",
            r"\$[^$\n]+\$",
        ]
    ),
    re.S,
)


# -- the book: its pages, numbers, labels and references -----------------------------


class Renderer:
    """Turns one page's MyST Markdown into Colab Markdown."""

    def __init__(self, page: str):
        self.page = page  # "chapters/02_flash_attention"
        self.dir = (ROOT / page).parent
        self.labels = LABELS
        self.bib = BIB

    # inline
    def page_url(self, target: str) -> str:
        """A page of the book (a path relative to this page, any suffix) on the site."""
        rel = (self.dir / target).resolve().relative_to(ROOT)
        return SITE_URL + rel.with_suffix(".html").as_posix()

    def link(self, m: re.Match) -> str:
        text, url = m.group("ltext"), m.group("url")
        if re.match(r"^[a-z]+:|^#|^mailto:", url):
            return m.group(0)
        path, _, anchor = url.partition("#")
        target = (self.dir / path).resolve()
        if target.suffix in (".ipynb", ".md") and target.exists():
            new = self.page_url(path) + (f"#{anchor}" if anchor else "")
        elif target.exists() or (target.parent.exists() and path.endswith("/")):
            rel = target.relative_to(ROOT).as_posix()
            new = (
                f"{REPO_URL}/tree/{BRANCH}/{rel}"
                if target.is_dir()
                else FILES_URL + rel
            ) + (f"#{anchor}" if anchor else "")
        else:
            raise ValueError(f"{self.page}: link to a missing file: {url}")
        return f"[{text}]({new})"

    def cite(self, keys: str, textual: bool) -> str:
        parts = []
        for key in (k.strip() for k in keys.split(",")):
            if key not in self.bib:
                raise ValueError(f"{self.page}: no reference {key!r} in references.bib")
            who, year = self.bib[key]
            parts.append(
                f"[{who} ({year})]({REFERENCES_URL})"
                if textual
                else f"[{who}, {year}]({REFERENCES_URL})"
            )
        return "; ".join(parts) if textual else f"({'; '.join(parts)})"

    def role(self, m: re.Match) -> str:
        name, text = m.group("name"), m.group("text")
        explicit = re.match(r"^(?P<title>.*?)\s*<(?P<target>[^>]+)>$", text, re.S)
        title, target = (
            (explicit.group("title"), explicit.group("target"))
            if explicit
            else (None, text)
        )
        if name in ("cite", "cite:p", "cite:ps"):
            return self.cite(text, textual=False)
        if name in ("cite:t", "cite:ts"):
            return self.cite(text, textual=True)
        if name in ("numref", "ref"):
            if target not in self.labels:
                raise ValueError(f"{self.page}: no figure or target {target!r}")
            lab = self.labels[target]
            shown = (
                lab["text"]
                if name == "numref" or lab["caption"] is None
                else self.inline(lab["caption"])
            )
            if title:
                shown = title.replace("%s", lab["text"].removeprefix("Fig. ")).replace(
                    "{number}", lab["text"].removeprefix("Fig. ")
                )
            if lab["page"] == self.page:
                return shown
            return f"[{shown}]({SITE_URL}{lab['page']}.html#{target})"
        if name == "doc":
            path = self.dir / target
            found = next(
                (
                    path.with_suffix(s)
                    for s in (".ipynb", ".md")
                    if path.with_suffix(s).exists()
                ),
                None,
            )
            if found is None:
                raise ValueError(f"{self.page}: no page {target!r}")
            return f"[{title or page_title(found)}]({self.page_url(target)})"
        if name == "math":
            return f"${text}$"
        if name in ("code", "samp", "file", "command", "kbd"):
            return f"`{text}`"
        raise ValueError(f"{self.page}: unknown role {{{name}}}")

    def inline(self, text: str) -> str:
        """Roles and links rewritten; code spans and math left as they are."""

        def one(m: re.Match) -> str:
            if m.group("name"):
                return self.role(m)
            if m.group("url"):
                return self.link(m)
            return m.group(0)  # a code span or math

        return INLINE.sub(one, text)

    # blocks
    def directive(self, name: str, arg: str, options: dict, body: str) -> str:
        if name == "dropdown":
            summary = re.sub(r"`([^`]+)`", r"<code>\1</code>", self.inline(arg.strip()))
            return (
                f"<details>\n<summary>{summary or 'Details'}</summary>\n\n"
                f"{self.render(body).strip()}\n\n</details>"
            )
        if name == "literalinclude":
            path = (self.dir / arg.strip()).resolve()
            rel = path.relative_to(ROOT).as_posix()
            lang = options.get("language", "")
            if "pyobject" in options:
                code, first, last = pyobject_source(path, options["pyobject"])
                url = f"{FILES_URL}{rel}#L{first}-L{last}"
                where = f"[{rel}, lines {first}-{last}]({url})"
            elif not set(options) - {"language", "caption"}:
                code = path.read_text().rstrip("\n")
                where = f"[{rel}]({FILES_URL}{rel})"
            else:
                raise ValueError(f"{self.page}: literalinclude options {options}")
            return f"From {where}:\n\n```{lang}\n{code}\n```"
        if name in ("code-block", "code", "code-cell"):
            caption = options.get("caption")
            lead = f"*{self.inline(caption)}*\n\n" if caption else ""
            return f"{lead}```{arg.strip()}\n{body.strip(chr(10)).rstrip()}\n```"
        if name == "math":
            return f"$$\n{body.strip()}\n$$"
        if name == "admonition" or name in ADMONITIONS:
            title = arg.strip() if name == "admonition" else name.capitalize()
            inner = self.render(body).strip().splitlines()
            quoted = "\n".join(f"> {line}" if line else ">" for line in inner)
            return f"> **{self.inline(title)}**\n>\n{quoted}"
        if name == "glue:figure":
            target = options.get("name")
            fig = self.labels.get(target, {}).get("text", "The figure")
            return f"*{fig} appears below the cell that draws it.*"
        if name in ("figure", "image"):
            path = (self.dir / arg.strip()).resolve().relative_to(ROOT).as_posix()
            alt = (
                self.inline(body.strip())
                if name == "figure"
                else options.get("alt", "")
            )
            url = f"https://raw.githubusercontent.com/{_ORG}/{_REPO}/{BRANCH}/{path}"
            return f"![{alt}]({url})" + (f"\n\n*{alt}*" if alt else "")
        raise ValueError(f"{self.page}: unknown directive {{{name}}}")

    def render(self, text: str) -> str:
        """A Markdown text: directives (nested too) out, roles and links rewritten,
        plain code fences kept as they are."""
        lines, out, i = text.split("\n"), [], 0
        prose: list[str] = []

        def flush():
            if prose:
                out.append(self.inline("\n".join(prose)))
                prose.clear()

        while i < len(lines):
            line = lines[i]
            m = FENCE.match(line)
            plain = None if m else PLAIN_FENCE.match(line)
            if m:
                flush()
                fence, j = m.group("fence"), i + 1
                options: dict[str, str] = {}
                while j < len(lines) and re.match(r"^ *:[\w-]+:", lines[j]):
                    key, _, value = lines[j].strip()[1:].partition(":")
                    options[key] = value.strip()
                    j += 1
                body, depth = [], 0
                while j < len(lines):
                    s = lines[j].strip()
                    if (
                        s.startswith(fence)
                        and FENCE.match(lines[j])
                        and FENCE.match(lines[j]).group("fence") == fence
                    ):
                        depth += 1
                    elif s == fence or (
                        s.startswith(fence[0] * len(fence)) and not s.strip(fence[0])
                    ):
                        if depth == 0:
                            break
                        depth -= 1
                    body.append(lines[j])
                    j += 1
                else:
                    raise ValueError(f"{self.page}: unclosed {{{m.group('name')}}}")
                out.append(
                    self.directive(
                        m.group("name"), m.group("arg"), options, "\n".join(body)
                    )
                )
                i = j + 1
            elif plain:
                flush()
                fence, j = plain.group(1), i + 1
                while j < len(lines) and lines[j].strip() != fence:
                    j += 1
                out.append("\n".join(lines[i : j + 1]))
                i = j + 1
            elif re.match(r"^\([\w-]+\)=\s*$", line) or re.match(r"^%", line):
                i += 1  # a target or a comment: nothing to show
            else:
                prose.append(line)
                i += 1
        flush()
        return "\n".join(out)


# -- notebooks -----------------------------------------------------------------------


def _cell_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def edition(path: pathlib.Path) -> dict:
    """The Colab edition of one notebook page, as a notebook dict."""
    page = path.relative_to(ROOT).with_suffix("").as_posix()
    number = dict(toc_pages()).get(page)
    nb = json.loads(path.read_text())
    render = Renderer(page)
    figures = {
        lab["cell"]: lab
        for lab in LABELS.values()
        if lab["page"] == page and "cell" in lab
    }
    cells = []
    if not (nb["cells"] and cell_source(nb["cells"][0]) == SETUP_CELL):
        cells.append(
            {
                "cell_type": "code",
                "id": "colab-setup",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": _cell_lines(SETUP_CELL),
            }
        )
    for i, cell in enumerate(nb["cells"]):
        cell = copy.deepcopy(cell)
        meta = cell.setdefault("metadata", {})
        tags = meta.get("tags", [])
        if cell["cell_type"] == "markdown":
            cell["source"] = _cell_lines(render.render(cell_source(cell)))
            cells.append(cell)
            if re.match(r"^# ", cell_source(cell)) and not any(
                c.get("id") == "colab-edition" for c in cells
            ):
                heading = re.match(r"^# (.+)", cell_source(cell)).group(1).strip()
                title = f"chapter {number}" if number else f"the page “{heading}”"
                cells.append(
                    {
                        "cell_type": "markdown",
                        "id": "colab-edition",
                        "metadata": {},
                        "source": _cell_lines(
                            f"> The Colab edition of {title} of *{CONFIG['title']}*. "
                            f"[The website]({SITE_URL}{page}.html) shows it with every "
                            "output. Run the first cell first: it fetches the "
                            "book's code and says which runtime to pick."
                        ),
                    }
                )
            continue
        cell["outputs"], cell["execution_count"] = [], None
        meta.pop("execution", None)
        fig = figures.get(i)
        if "hide-input" in tags or "hide-cell" in tags:
            what = f"Code that draws {fig['text']}" if fig else "Code"
            cell["source"] = _cell_lines(
                f"# @title {what} (hidden on the website: double-click to show)\n"
                + cell_source(cell)
            )
            meta["cellView"] = "form"
        cells.append(cell)
        if fig:
            caption = f"**{fig['text']}.** {render.inline(fig['caption'])}"
            cells.append(
                {
                    "cell_type": "markdown",
                    "metadata": {},
                    "id": f"{cell.get('id', i)}-caption",
                    "source": _cell_lines(caption),
                }
            )
    meta = copy.deepcopy(nb.get("metadata", {}))
    meta["colab"] = {"provenance": [], "toc_visible": True}
    meta["accelerator"] = "GPU"
    return {
        "cells": cells,
        "metadata": meta,
        "nbformat": nb["nbformat"],
        "nbformat_minor": nb["nbformat_minor"],
    }


def edition_path(path: pathlib.Path) -> pathlib.Path:
    return OUT / path.relative_to(ROOT)


def dumps(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def sync_setup() -> list[pathlib.Path]:
    """Copy colab/setup_cell.py into cell 0 of every chapter; the chapters changed."""
    changed = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        first = nb["cells"][0]
        if first["cell_type"] != "code" or "TRITON_INTERPRET" not in cell_source(first):
            raise ValueError(f"{path.name}: cell 0 is not a setup cell")
        if cell_source(first) != SETUP_CELL:
            first["source"] = _cell_lines(SETUP_CELL)
            path.write_text(dumps(nb))
            changed.append(path)
    return changed


LABELS = labels()
BIB = bibliography()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if an edition differs",
    )
    ap.add_argument(
        "--sync-setup",
        action="store_true",
        help="first copy colab/setup_cell.py into every chapter's cell 0",
    )
    args = ap.parse_args(argv)
    if args.sync_setup:
        for path in sync_setup():
            print(f"setup cell updated: {path.relative_to(ROOT)}")
    stale = []
    for path in notebooks():
        out, text = edition_path(path), dumps(edition(path))
        if out.exists() and out.read_text() == text:
            continue
        stale.append(out.relative_to(ROOT))
        if not args.check:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
    for rel in stale:
        print(f"{'differs' if args.check else 'written'}: {rel}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
