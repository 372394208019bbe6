"""What the Colab editions are made from: the pages of ``_toc.yml``, the figure and
section labels of every page (numbered as Jupyter Book numbers them), the bibliography
and the source of a ``:pyobject:`` listing. :mod:`colab.edition` renders with them."""

from __future__ import annotations

import ast
import json
import pathlib
import re

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def toc_pages() -> list[tuple[str, int | None]]:
    """Every page of _toc.yml in order, with its chapter number (None: unnumbered)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages, number = [(toc["root"], None)], 0
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        for chapter in part.get("chapters", []):
            if part.get("numbered"):
                number += 1
            pages.append((chapter["file"], number if part.get("numbered") else None))
    return pages


def notebooks() -> list[pathlib.Path]:
    """The notebook pages of the book, in toc order (the ones that get an edition)."""
    return [
        ROOT / f"{page}.ipynb"
        for page, _ in toc_pages()
        if (ROOT / f"{page}.ipynb").exists()
    ]


def cell_source(cell) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def page_title(path: pathlib.Path) -> str:
    if path.suffix == ".ipynb":
        text = "\n".join(
            cell_source(c)
            for c in json.loads(path.read_text())["cells"]
            if c["cell_type"] == "markdown"
        )
    else:
        text = path.read_text()
    m = re.search(r"^# (.+)$", text, re.M)
    return m.group(1).strip() if m else path.stem


def labels() -> dict[str, dict]:
    """label -> {"page", "text" (what {numref}/{ref} shows), "caption"} for every
    figure (numbered "Fig. <chapter>.<k>" in numbered chapters) and every ``(x)=``
    target of the book's notebook pages."""
    out: dict[str, dict] = {}
    for page, number in toc_pages():
        path = ROOT / f"{page}.ipynb"
        if not path.exists():
            continue
        k = 0
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            found = []  # (name, caption) of figures, in document order
            fig = cell.get("metadata", {}).get("mystnb", {}).get("figure")
            if cell["cell_type"] == "code" and fig and fig.get("caption"):
                found.append((fig.get("name"), fig["caption"]))
            if cell["cell_type"] == "markdown":
                src = cell_source(cell)
                for m in re.finditer(
                    r"^ *(`{3,}|:{3,})\{(figure|glue:figure)\}.*\n"
                    r"((?: *:[\w-]+:.*\n)*)((?:(?!\1).*\n?)*?) *\1",
                    src,
                    re.M,
                ):
                    name = re.search(r":name: *(\S+)", m.group(3))
                    found.append((name.group(1) if name else None, m.group(4).strip()))
                for m in re.finditer(
                    r"^\((?P<label>[\w-]+)\)=\s*\n#+ (?P<head>.+)$", src, re.M
                ):
                    out[m.group("label")] = {
                        "page": page,
                        "text": m.group("head"),
                        "caption": None,
                    }
            for name, caption in found:
                k += 1
                text = f"Fig. {number}.{k}" if number else "Fig."
                if name:
                    out[name] = {
                        "page": page,
                        "text": text,
                        "caption": caption,
                        "cell": i,
                    }
    return out


def _bib_field(entry: str, field: str) -> str | None:
    m = re.search(rf"\b{field}\s*=\s*", entry, re.I)
    if not m:
        return None
    i, depth, start = m.end(), 0, m.end()
    if entry[i] != "{":
        return re.match(r"[^,\n}]+", entry[i:]).group(0).strip().strip('"')
    for j in range(i, len(entry)):
        depth += {"{": 1, "}": -1}.get(entry[j], 0)
        if depth == 0:
            return " ".join(entry[start + 1 : j].split())
    raise ValueError(f"unbalanced braces in field {field}")


def _tex(text: str) -> str:
    text = re.sub(r"\\['`^\"~]\{?(\w)\}?", r"\1", text)  # L{\'e}onard -> Leonard
    return text.replace("{", "").replace("}", "")


def bibliography() -> dict[str, tuple[str, str]]:
    """BibTeX key -> (authors as the site's author-year style shows them, year)."""
    text = (ROOT / "references.bib").read_text()
    out = {}
    for m in re.finditer(r"^@\w+\{([^,\s]+),", text, re.M):
        end = text.find("\n@", m.end())
        entry = text[m.end() : None if end < 0 else end]
        raw = _bib_field(entry, "author") or _bib_field(entry, "editor") or "?"
        names = [n.strip() for n in re.split(r"\s+and\s+", raw)]
        last = [
            _tex(
                n
                if n.startswith("{")
                else n.split(",")[0]
                if "," in n
                else n.split()[-1]
            )
            for n in names
        ]
        who = (
            last[0]
            if len(last) == 1
            else f"{last[0]} and {last[1]}"
            if len(last) == 2
            else f"{last[0]} et al."
        )
        out[m.group(1)] = (who, _bib_field(entry, "year") or "n.d.")
    return out


# -- listings ------------------------------------------------------------------------


def pyobject_source(path: pathlib.Path, name: str) -> tuple[str, int, int]:
    """The source of ``name`` ("func" or "Class.method") in ``path``, decorators
    included (as Sphinx's :pyobject: shows it), and its first and last line."""
    text = path.read_text()
    body = ast.parse(text).body
    node = None
    for part in name.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.name == part
            ),
            None,
        )
        if node is None:
            raise ValueError(f"{path.relative_to(ROOT)} has no {name}")
        body = node.body
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = text.splitlines()[first - 1 : node.end_lineno]
    return "\n".join(lines), first, node.end_lineno


# -- Markdown ------------------------------------------------------------------------
