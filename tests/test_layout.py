"""The house rules of the layout, read from the source (AST, nothing executed).

* No import circle among the book's packages (``attention``, ``kernels``,
  ``benchmarks``, ``figures``): module A importing B, B importing A (directly or through
  others) is refused, lazy imports inside functions included, so the next circle is
  caught when it is written.
* No module over ``MAX_LINES`` lines, the Triton kernel files included.
* The public calls users make keep their names.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("attention", "kernels", "benchmarks", "figures")
MAX_LINES = 600


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py file under the book's packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """Module -> the book's modules it imports (``from pkg import sub`` counts as
    importing ``pkg.sub`` when that is a module; a package's ``__init__`` is imported by
    everything under it, as Python does)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                    for a in node.names
                ]
            for t in targets:
                while t and t not in mods:  # a name inside a module: the module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(m):
        color[m] = GREY
        stack.append(m)
        for n in sorted(graph[m]):
            # a package's own submodules importing it is Python's normal order
            if m.startswith(n + "."):
                continue
            if color[n] == GREY:
                return stack[stack.index(n) :] + [n]
            if color[n] == WHITE:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(graph):
        if color[m] == WHITE:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a": set()}
    assert find_cycle(graph) == ["a.x", "a.y", "a.z", "a.x"]
    assert find_cycle({"a": set(), "a.x": {"a"}}) is None  # submodule -> its package


def test_no_module_is_too_long():
    long = {
        m: n
        for m, p in _modules().items()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


@pytest.mark.parametrize(
    "module, names",
    [
        (
            "kernels.flash",
            ["flash_attention", "attention_probs", "FORWARD_PATHS", "MAX_HEAD_DIM"],
        ),
        ("kernels.hard", ["hard_attention", "topk_attention"]),
        ("kernels.deformable", ["ms_deform_attn", "deformable_attention"]),
        ("kernels.decode", ["attention_with_kvcache"]),
        ("kernels.ring", ["ring_attention", "shard", "unshard"]),
    ],
)
def test_public_calls_keep_their_names(module, names):
    mod = importlib.import_module(module)
    assert all(callable(getattr(mod, n)) or n.isupper() for n in names)
