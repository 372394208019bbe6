"""Source quoted in the chapters' prose still occurs, line for line, in the packages.

A ``{code-block} python`` whose caption starts ``<path>, <function>`` quotes lines of
that function: every line of the block that is not a comment must equal (after stripping
indentation) a line of the function's current source. Comment lines are the chapter's
own annotations. So a quoted inner loop cannot drift from `kernels/flash/` unnoticed.
"""

import ast
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
FENCE = re.compile(r"^```\{code-block\} python\n(.*?)^```", flags=re.M | re.S)
HEADER = re.compile(r"^:caption: ((?:attention|kernels)/[\w/]+\.py), (\w+)\b")


def _quotes() -> list[tuple[str, str, str, list[str]]]:
    """(notebook, path, function, quoted lines) for every quoting
    block in the chapters."""
    out = []
    for nb_path in NOTEBOOKS:
        cells = json.loads(nb_path.read_text())["cells"]
        for cell in cells:
            if cell["cell_type"] != "markdown":
                continue
            for block in FENCE.findall("".join(cell["source"])):
                lines = block.splitlines()
                head = HEADER.match(lines[0]) if lines else None
                if head:
                    body = [
                        ln.strip()
                        for ln in lines[1:]
                        if ln.strip() and not ln.strip().startswith(("#", ":"))
                    ]
                    out.append((nb_path.name, head.group(1), head.group(2), body))
    return out


def _function_lines(path: str, name: str) -> set[str]:
    text = (ROOT / path).read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            segment = ast.get_source_segment(text, node)
            return {ln.strip() for ln in segment.splitlines()}
    raise AssertionError(f"{path} has no function {name}")


QUOTES = _quotes()


def test_chapter_2_quotes_both_inner_loops():
    quoted = {(path, fn) for nb, path, fn, _ in QUOTES if nb.startswith("02_")}
    assert ("kernels/flash/blocks.py", "softmax_pv_step") in quoted
    assert ("attention/flash.py", "flash2_forward") in quoted


@pytest.mark.parametrize(
    "nb, path, fn, body", QUOTES, ids=[f"{q[0]}:{q[2]}" for q in QUOTES]
)
def test_quoted_lines_occur_verbatim(nb, path, fn, body):
    assert body, f"{nb}: the quote of {path}:{fn} has no code lines"
    source = _function_lines(path, fn)
    missing = [ln for ln in body if ln not in source]
    assert not missing, f"{nb} quotes lines no longer in {path}:{fn}: {missing}"
