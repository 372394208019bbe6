"""At most 200 lines of code are visible on each chapter's page, listings included.

Counted from the notebook source, as the built page shows it:

* a code cell's source lines, unless the cell is tagged ``hide-input``,
  ``remove-input`` or ``remove-cell`` (hidden behind a toggle, or not shown);
* a code block in a markdown cell (a ```` ```python ```` fence or a ``{code-block}``)
  and a ``{literalinclude}`` (the lines of its ``:pyobject:``, or of its ``:lines:``
  range, or the whole file), unless it sits inside a ``{dropdown}`` (folded).

Blank lines are not counted. Whole kernel listings belong in dropdowns; what stays open
is what the prose walks through.
"""

import ast
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
MAX_VISIBLE = 200
HIDDEN = {"hide-input", "remove-input", "remove-cell"}
OPEN = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})\s*(\{[\w:-]+\})?\s*(.*)$")


def _nonblank(lines) -> int:
    return sum(1 for line in lines if line.strip())


def _included_lines(arg: str, options: dict, base: pathlib.Path) -> int:
    path = (base / arg.strip()).resolve()
    text = path.read_text()
    if "pyobject" in options:
        name = options["pyobject"]
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                and node.name == name
            ):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                return _nonblank(text.splitlines()[start - 1 : node.end_lineno])
        raise AssertionError(f"{path}: no object {name!r}")
    lines = text.splitlines()
    if "lines" in options:
        picked = []
        for part in options["lines"].split(","):
            a, _, b = part.partition("-")
            picked += lines[int(a) - 1 : int(b or a)]
        return _nonblank(picked)
    return _nonblank(lines)


def markdown_visible(text: str, base: pathlib.Path) -> int:
    """Visible code lines of one markdown cell (see the module docstring)."""
    lines = text.splitlines()
    stack = []  # (fence, directive) of the open blocks
    count, i = 0, 0
    while i < len(lines):
        m = OPEN.match(lines[i])
        if (
            stack
            and m
            and m.group(1) == stack[-1][0]
            and not m.group(2)
            and not m.group(3)
        ):
            stack.pop()
            i += 1
            continue
        if not m or (stack and stack[-1][1] in ("code", "{code-block}")):
            i += 1
            continue
        fence, directive, arg = m.groups()
        folded = any(d == "{dropdown}" for _, d in stack)
        if (
            fence[0] != ":"
            and directive in (None, "{code-block}", "{code-cell}")
            and (directive or arg.strip() in ("python", "py", "python3"))
        ):
            # a code block: count its body up to the closing fence
            j = i + 1
            while j < len(lines) and lines[j].strip() != fence:
                j += 1
            body = [x for x in lines[i + 1 : j] if not x.lstrip().startswith(":")]
            count += 0 if folded else _nonblank(body)
            i = j + 1
            continue
        if directive == "{literalinclude}":
            opts, j = {}, i + 1
            while j < len(lines) and lines[j].lstrip().startswith(":"):
                key, _, val = lines[j].strip()[1:].partition(":")
                opts[key] = val.strip()
                j += 1
            if not folded:
                count += _included_lines(arg, opts, base)
            while j < len(lines) and lines[j].strip() != fence:
                j += 1
            i = j + 1
            continue
        stack.append((fence, directive or "code"))
        i += 1
    return count


def visible_code_lines(nb_path: pathlib.Path) -> int:
    total = 0
    for c in json.loads(nb_path.read_text())["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] == "code":
            if not HIDDEN & set(c.get("metadata", {}).get("tags", [])):
                total += _nonblank(src.splitlines())
        elif c["cell_type"] == "markdown":
            total += markdown_visible(src, nb_path.parent)
    return total


def test_the_count_folds_dropdowns_and_reads_pyobjects(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("x = 1\n\n\ndef f(a):\n    b = a\n\n    return b\n")
    md = (
        "text\n```python\nprint(1)\n\nprint(2)\n```\n"
        "````{dropdown} Listing\n```{literalinclude} m.py\n:pyobject: f\n```\n````\n"
        "```{literalinclude} m.py\n:pyobject: f\n```\n"
        "```{code-block} python\n:caption: c\ny = 2\n```\n"
    )
    assert markdown_visible(md, tmp_path) == 2 + 3 + 1


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=lambda p: p.name)
def test_visible_code_per_chapter(nb_path):
    n = visible_code_lines(nb_path)
    assert n <= MAX_VISIBLE, (
        f"{nb_path.name}: {n} visible code lines (at most "
        f"{MAX_VISIBLE}): fold whole listings into dropdowns"
    )
