"""The house rules of the layout, read from the source (AST, nothing executed).

* No import circle among the book's packages (``attention``, ``kernels``,
  ``benchmarks``, ``figures``): module A importing B, B importing A (directly or through
  others) is refused, lazy imports inside functions included, so the next circle is
  caught when it is written.
* No module over ``MAX_LINES`` lines, the Triton kernel files and the tests included.
* No underscore name imported across packages: ``from X import _y`` (module level or
  inside a function, relative or absolute) is refused when X lies outside the
  importer's own family package (``kernels.flash``, ``kernels.ring``,
  ``attention.explorers``, ``tests.kernels``...; a module directly under a top package
  belongs to that package). What one family lends another is a public name.
* The public calls users make keep their names.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("attention", "kernels", "benchmarks", "figures")
# the line cap and the underscore rule cover tests and tools too
CHECKED = PACKAGES + ("tests", "tools")
MAX_LINES = 600


def _modules(packages=PACKAGES) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py file under the book's packages."""
    out = {}
    for pkg in packages:
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


def family(module: str, packages: set[str]) -> str:
    """The family package of ``module``: its first two components when they name a
    package (``kernels.flash.api`` -> ``kernels.flash``), else its top package
    (``kernels.naive`` -> ``kernels``)."""
    parts = module.split(".")
    if len(parts) >= 2 and ".".join(parts[:2]) in packages:
        return ".".join(parts[:2])
    return parts[0]


def private_imports(module: str, is_pkg: bool, tree: ast.AST, packages: set[str]):
    """(line, 'from X import _y') for every underscore name ``module`` imports from a
    module outside its own family (dunder names such as ``__version__`` excepted)."""
    mine = family(module, packages)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _resolve(module, is_pkg, node)
        if source.split(".")[0] not in CHECKED or family(source, packages) == mine:
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not name.startswith("__"):
                out.append((node.lineno, f"from {source} import {name}"))
    return out


def test_no_underscore_name_is_imported_across_packages():
    mods = _modules(CHECKED)
    packages = {m for m, p in mods.items() if p.name == "__init__.py"}
    bad = [
        f"{mods[m].relative_to(ROOT)}:{line}: {what}"
        for m in sorted(mods)
        for line, what in private_imports(
            m,
            mods[m].name == "__init__.py",
            ast.parse(mods[m].read_text(), str(mods[m])),
            packages,
        )
    ]
    assert not bad, "underscore names imported across packages:\n" + "\n".join(bad)


def test_the_underscore_rule_finds_planted_imports():
    packages = {"kernels", "kernels.flash", "kernels.ring", "tests", "tests.kernels"}
    src = (
        "from ..flash.checks import _validate\n"  # relative, another family
        "from kernels.flash import forward_lse\n"  # public: fine
        "from .layout import _check_dim\n"  # own family: fine
        "def f():\n    from kernels.flash.tiles import _LOG2E as L\n"  # lazy
        "from kernels.ring.layout import __doc__\n"  # a dunder: fine
    )
    found = private_imports("kernels.ring.ring", False, ast.parse(src), packages)
    assert found == [
        (1, "from kernels.flash.checks import _validate"),
        (5, "from kernels.flash.tiles import _LOG2E"),
    ]
    test_src = "from kernels.flash.checks import _validate\n"
    assert private_imports(
        "tests.kernels.test_x", False, ast.parse(test_src), packages
    ) == [(1, "from kernels.flash.checks import _validate")]
    # a module directly under a top package: kernels.naive belongs to kernels
    assert family("kernels.naive", packages) == "kernels"
    assert family("kernels.flash.api", packages) == "kernels.flash"


def test_no_module_is_too_long():
    long = {
        m: n
        for m, p in _modules(CHECKED).items()
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
        ("kernels.sparse", ["sparse_attention", "select_blocks", "lightning_indexer"]),
        (
            "kernels.ring",
            ["ring_attention", "shard", "unshard", "merge_partials", "shard_intervals"],
        ),
    ],
)
def test_public_calls_keep_their_names(module, names):
    mod = importlib.import_module(module)
    assert all(callable(getattr(mod, n)) or n.isupper() for n in names)
