"""The families' house rules (issue 44), read from the source (AST, nothing executed).

A family is a package directly under ``kernels/`` (``kernels.flash``, ``kernels.hard``,
... read from the tree, so a new one is covered when it lands) other than the engines
``kernels.timing`` and ``kernels.machine_code``; elsewhere ``family`` of
``tests.test_layout`` says whose a module is (``attention.explorers``,
``tests.kernels``, ``kernels`` for ``kernels.naive``...).

* No underscore name reached across families by attribute: ``X._y`` where ``X`` is a
  module of another family, bound by an import (``from kernels.flex import forward``,
  ``import kernels.hard.forward as F``, ``from kernels import hard``, ``import
  kernels.hard.forward`` then ``kernels.hard.forward._y``), dunders excepted.
* No underscore name reached across families by string: ``getattr`` (``hasattr``,
  ``setattr``, ``delattr``) on another family's module takes a string literal that is
  public (a dunder is); and a module that calls one of them holds no string naming a
  private module-level name (``"_attn_fwd"``) that another family defines and its own
  does not (``KERNEL_FNS = {"fwd": "_attn_fwd"}`` then ``getattr(module,
  KERNEL_FNS[k])``).
  These two rules hold for the book's packages (``attention``, ``kernels``,
  ``benchmarks``, ``figures``); a test may read a module's private state to check it.
* The engines import no family: nothing under ``kernels/timing`` or
  ``kernels/machine_code`` imports ``kernels.<family>`` (``from ..flash import x``,
  ``from kernels import hard``, ``importlib.import_module("kernels.sparse")``), at
  module level or inside a function.
"""

from __future__ import annotations

import ast
import functools
import re

import pytest

from tests.test_layout import CHECKED, PACKAGES, ROOT, _modules, _resolve, family

ENGINES = ("kernels.timing", "kernels.machine_code")
GETATTRS = ("getattr", "hasattr", "setattr", "delattr")
PRIVATE_STRING = re.compile(r"_[A-Za-z]\w*")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def kernel_families() -> set[str]:
    """``kernels.<x>`` for every package directly under kernels/ but the engines."""
    return {
        f"kernels.{p.parent.name}" for p in (ROOT / "kernels").glob("*/__init__.py")
    } - set(ENGINES)


def module_bindings(module: str, is_pkg: bool, tree: ast.AST, mods: set[str]):
    """Local name -> the book's module it is bound to by an import, anywhere in the
    file (a module's functions rarely reuse an import's name for something else)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in mods:
                    bound[a.asname] = a.name
                elif not a.asname and a.name.split(".")[0] in mods:
                    bound[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_pkg, node)
            for a in node.names:
                if f"{base}.{a.name}" in mods:
                    bound[a.asname or a.name] = f"{base}.{a.name}"
    return bound


def _dotted(expr: ast.AST, bound: dict[str, str], mods: set[str]) -> str | None:
    """The module an expression names (``F``, ``kernels.hard.forward``), or None."""
    if isinstance(expr, ast.Name):
        return bound.get(expr.id)
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value, bound, mods)
        if base and f"{base}.{expr.attr}" in mods:
            return f"{base}.{expr.attr}"
    return None


def _foreign(target: str | None, mine: str, packages: set[str]) -> bool:
    return bool(target) and family(target, packages) != mine


def private_attributes(module, is_pkg, tree, mods, packages):
    """(line, 'X._y') for every underscore attribute ``module`` reads, writes or
    deletes on a module of another family."""
    mine = family(module, packages)
    bound = module_bindings(module, is_pkg, tree, mods)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            target = _dotted(node.value, bound, mods)
            if _foreign(target, mine, packages):
                out.append((node.lineno, f"{target}.{node.attr}"))
    return sorted(out)


def _defined(tree: ast.AST) -> set[str]:
    """The names a module defines at its top level (def, class, assignment)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def private_definitions(trees: dict[str, ast.AST], packages) -> dict[str, set[str]]:
    """Family -> the underscore names its modules define at their top level."""
    out: dict[str, set[str]] = {}
    for mod, tree in trees.items():
        mine = out.setdefault(family(mod, packages), set())
        mine |= {n for n in _defined(tree) if _private(n)}
    return out


def private_strings(module, is_pkg, tree, mods, packages, privates):
    """(line, what) for every way ``module`` reaches an underscore name of another
    family by string: a ``getattr``-like call on another family's module whose name is
    not a public string literal, and, in a module that makes such calls at all, a
    string literal naming a private name another family defines (``privates``, from
    ``private_definitions``) and its own family does not."""
    mine = family(module, packages)
    bound = module_bindings(module, is_pkg, tree, mods)
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id in GETATTRS
        and len(n.args) >= 2
    ]
    out = []
    for call in calls:
        target = _dotted(call.args[0], bound, mods)
        name = call.args[1]
        public = isinstance(name, ast.Constant) and isinstance(name.value, str)
        if _foreign(target, mine, packages) and not (
            public and not _private(name.value)
        ):
            out.append((call.lineno, f"{call.func.id}({target}, {ast.unparse(name)})"))
    if calls:
        own = privates.get(mine, set())
        theirs: dict[str, list[str]] = {}
        for fam, names in sorted(privates.items()):
            for n in names - own if fam != mine else ():
                theirs.setdefault(n, []).append(fam)
        for node in ast.walk(tree):
            s = node.value if isinstance(node, ast.Constant) else None
            if isinstance(s, str) and PRIVATE_STRING.fullmatch(s) and s in theirs:
                whose = ", ".join(theirs[s])
                out.append((node.lineno, f"{s!r} (a private name of {whose})"))
    return sorted(set(out))


def engine_imports(module, is_pkg, tree, families: set[str]):
    """(line, family module) for every import of a family by ``module``, lazy ones and
    ``importlib.import_module("kernels.<family>...")`` included."""
    out = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_pkg, node)
            targets = [f"{base}.{a.name}" for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            targets = [node.args[0].value]
        out += [
            (node.lineno, t) for t in targets if ".".join(t.split(".")[:2]) in families
        ]
    return sorted(out)


# ---------------------------------------------------------------------------------
# On the tree.
# ---------------------------------------------------------------------------------


@functools.cache
def _tree():
    mods = _modules(CHECKED)
    packages = {m for m, p in mods.items() if p.name == "__init__.py"}
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in mods.items()}
    return mods, packages, trees


def _where(mods, m, line, what):
    return f"{mods[m].relative_to(ROOT)}:{line}: {what}"


def _in(top: str, m: str) -> bool:
    return m == top or m.startswith(top + ".")


# The attribute and string rules hold for the book's packages; a test may read a
# module's private state (a cache, a table) to check it, by attribute or string.
BY_PACKAGE = [
    "kernels",
    "attention",
    "benchmarks",
    "figures",
]


@pytest.mark.parametrize("top", BY_PACKAGE)
def test_no_underscore_name_is_reached_across_families_by_attribute(top):
    mods, packages, trees = _tree()
    bad = [
        _where(mods, m, line, what)
        for m in sorted(mods)
        if _in(top, m)
        for line, what in private_attributes(
            m, mods[m].name == "__init__.py", trees[m], set(mods), packages
        )
    ]
    assert not bad, "underscore names reached by attribute:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "top",
    ["kernels", "attention", "benchmarks", "figures"],
)
def test_no_underscore_name_is_reached_across_families_by_string(top):
    mods, packages, trees = _tree()
    book = {m: t for m, t in trees.items() if m.split(".")[0] in PACKAGES}
    privates = private_definitions(book, packages)
    bad = [
        _where(mods, m, line, what)
        for m in sorted(mods)
        if _in(top, m)
        for line, what in private_strings(
            m, mods[m].name == "__init__.py", trees[m], set(mods), packages, privates
        )
    ]
    assert not bad, "underscore names reached by string:\n" + "\n".join(bad)


def test_the_engines_import_no_family():
    mods, _, trees = _tree()
    families = kernel_families()
    bad = [
        _where(mods, m, line, f"imports {what}")
        for m in sorted(mods)
        if any(_in(e, m) for e in ENGINES)
        for line, what in engine_imports(
            m, mods[m].name == "__init__.py", trees[m], families
        )
    ]
    assert not bad, "the engines import families:\n" + "\n".join(bad)


def test_the_families_are_read_from_the_tree():
    families = kernel_families()
    assert {"kernels.flash", "kernels.hard", "kernels.ring"} <= families
    assert not families & set(ENGINES) and "kernels.naive" not in families


# ---------------------------------------------------------------------------------
# The rules on planted cases.
# ---------------------------------------------------------------------------------

PLANTED_MODS = {
    "kernels",
    "kernels.runtime",
    "kernels.flash",
    "kernels.flash.forward",
    "kernels.flex",
    "kernels.flex.forward",
    "kernels.hard",
    "kernels.hard.forward",
    "kernels.machine_code",
    "kernels.machine_code.compiler",
    "kernels.machine_code.sass",
}
PLANTED_PACKAGES = {
    "kernels",
    "kernels.flash",
    "kernels.flex",
    "kernels.hard",
    "kernels.machine_code",
}
PLANTED_FAMILIES = {"kernels.flash", "kernels.flex", "kernels.hard"}


def test_the_attribute_rule_finds_planted_reaches():
    src = (
        "from kernels.flex import forward\n"
        "import kernels.hard.forward as F\n"
        "from kernels import hard\n"
        "import kernels.flash.forward\n"
        "from . import sass\n"
        "a = forward._flex_fwd\n"  # 6: another family, by from-import
        "b = F._hard_attn_fwd\n"  # 7: by import-as
        "c = hard.forward._hard_attn_fwd\n"  # 8: through the package
        "d = kernels.flash.forward._attn_fwd\n"  # 9: by the full dotted name
        "e = sass._parse\n"  # own family: fine
        "f = forward.flex_attention\n"  # public: fine
        "g = forward.__doc__\n"  # a dunder: fine
        "def h(x):\n    return x._private\n"  # not a module: fine
    )
    found = private_attributes(
        "kernels.machine_code.compiler",
        False,
        ast.parse(src),
        PLANTED_MODS,
        PLANTED_PACKAGES,
    )
    assert found == [
        (6, "kernels.flex.forward._flex_fwd"),
        (7, "kernels.hard.forward._hard_attn_fwd"),
        (8, "kernels.hard.forward._hard_attn_fwd"),
        (9, "kernels.flash.forward._attn_fwd"),
    ]
    # the same reads inside the family that owns them are its own business
    own = "from kernels.flex import forward\nx = forward._flex_fwd\n"
    assert not private_attributes(
        "kernels.flex.api", False, ast.parse(own), PLANTED_MODS, PLANTED_PACKAGES
    )


def test_the_string_rule_finds_planted_reaches():
    privates = {
        "kernels.flash": {"_attn_fwd", "_attn_bwd_dq"},
        "kernels.flex": {"_flex_fwd", "_attn_fwd"},
        "kernels.machine_code": {"_jit_function"},
    }
    src = (
        "from kernels.flash import forward\n"
        "KERNEL_FNS = {'fwd': '_attn_fwd', 'dq': '_attn_bwd_dq'}\n"  # 2: private names
        "def compile_one(kernel, module=forward):\n"
        "    fn = getattr(forward, KERNEL_FNS[kernel])\n"  # 4: not a literal
        "    g = getattr(forward, '_attn_fwd')\n"  # 5: a private literal
        "    h = hasattr(forward, 'flash_attention')\n"  # public: fine
        "    i = getattr(forward, '__name__')\n"  # a dunder: fine
        "    j = getattr(module, '_jit_function')\n"  # own family's name: fine
        "    return '_unknown', '_'\n"  # names nothing: fine
    )
    found = private_strings(
        "kernels.machine_code.compiler",
        False,
        ast.parse(src),
        PLANTED_MODS,
        PLANTED_PACKAGES,
        privates,
    )
    assert found == [
        (2, "'_attn_bwd_dq' (a private name of kernels.flash)"),
        (2, "'_attn_fwd' (a private name of kernels.flash, kernels.flex)"),
        (4, "getattr(kernels.flash.forward, KERNEL_FNS[kernel])"),
        (5, "'_attn_fwd' (a private name of kernels.flash, kernels.flex)"),
        (5, "getattr(kernels.flash.forward, '_attn_fwd')"),
    ]
    # after the move: flash's own compile check names its own kernels
    own = (
        "from kernels.flash import forward\n"
        "from kernels.machine_code import compiler\n"
        "KERNEL_FNS = {'fwd': '_attn_fwd'}\n"
        "fn = compiler.jit(getattr(forward, KERNEL_FNS['fwd']))\n"
    )
    assert not private_strings(
        "kernels.flash.compile_check",
        False,
        ast.parse(own),
        PLANTED_MODS,
        PLANTED_PACKAGES,
        privates,
    )
    # a module that calls no getattr holds private-looking strings as it likes
    quiet = "NAMES = ['_attn_fwd']\n"
    assert not private_strings(
        "kernels.machine_code.sass",
        False,
        ast.parse(quiet),
        PLANTED_MODS,
        PLANTED_PACKAGES,
        privates,
    )


def test_the_engine_rule_finds_planted_imports():
    src = (
        "from .. import runtime\n"  # kernels.runtime: not a family, fine
        "from ..flash import flash_attention\n"  # 2: relative
        "from kernels import hard\n"  # 3: the package by name
        "import kernels.flex.forward as F\n"  # 4
        "from . import sass\n"  # another engine module: fine
        "def f():\n"
        "    from kernels.hard.forward import topk\n"  # 7: lazy
        "    import importlib\n"
        "    return importlib.import_module('kernels.flash')\n"  # 9: by name
    )
    found = engine_imports(
        "kernels.machine_code.compiler", False, ast.parse(src), PLANTED_FAMILIES
    )
    assert found == [
        (2, "kernels.flash.flash_attention"),
        (3, "kernels.hard"),
        (4, "kernels.flex.forward"),
        (7, "kernels.hard.forward.topk"),
        (9, "kernels.flash"),
    ]
