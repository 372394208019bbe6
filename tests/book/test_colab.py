"""The Colab path, run here: each page's Colab edition opened alone in a runtime that
has only what Colab preinstalls, plus a foreign package named ``kernels`` (and one
named ``attention``), run top to bottom.

Colab's Python comes with torch, triton, numpy, matplotlib, ipywidgets, tqdm and
threadpoolctl (a scikit-learn dependency), and ipykernel runs the notebook; this project
is not there. The test builds such a virtual environment (the versions pinned in
requirements.txt, so pip takes them from its cache), installs into its site-packages a
foreign ``kernels`` (as Hugging Face's package of that name would be) and a foreign
``attention``, each with a marker function, fakes the ``google.colab`` module the way a
Colab kernel has it imported, and points the setup cell at this repository's committed
HEAD (``ATTENTION_BOOK_REPO_URL``, ``ATTENTION_BOOK_REF``; ``ATTENTION_BOOK_DIR`` in
place of /content). Then, for every edition in ``colab/``:

* it runs with no error, from the fetched repository (its working directory);
* the book's ``attention`` and ``kernels`` were imported from the fetched repository,
  also in a child process (PYTHONPATH), and the reports the site reads are found
  (chapter 2 prints the machine-code counts, not "no compile report");

and afterwards the foreign packages are intact: byte for byte, and a fresh interpreter
of that environment imports them and their markers answer.

All pages, one after another, in one worker. The environment is made of links to the
pinned distributions this project's venv holds (see ``colab``), so it takes a second,
not the 100 s pip took to unpack the same wheels.
"""

import hashlib
import json
import pathlib
import re
import subprocess
import sys
from importlib import metadata

import nbformat
import pytest
from nbclient import NotebookClient
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from colab import edition
from tests.conftest import ROOT

COLAB_PREINSTALLED = (
    "torch",
    "triton",
    "numpy",
    "matplotlib",
    "ipywidgets",
    "ipykernel",
    "tqdm",
    "threadpoolctl",
)
EDITIONS = [edition.edition_path(p) for p in edition.notebooks()]
FOREIGN = {
    "kernels": "def get_kernel(name):\n    return f'foreign kernel {name}'\n",
    "attention": "def marker():\n    return 'foreign attention'\n",
}
CALLS = {
    "kernels": "kernels.get_kernel('x') == 'foreign kernel x'",
    "attention": "attention.marker() == 'foreign attention'",
}
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("colab"),
    pytest.mark.skipif(
        not (ROOT / ".git").exists(), reason="needs a git clone to fetch from"
    ),
]


def _pins() -> list[str]:
    req = (ROOT / "requirements.txt").read_text()
    pins = []
    for name in COLAB_PREINSTALLED:
        m = re.search(rf"^({re.escape(name)}==[^\s;]+)", req, flags=re.M | re.I)
        assert m, f"requirements.txt pins no {name}"
        pins.append(m.group(1))
    return pins


def _digest(folder) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(folder)).encode() + f.read_bytes())
    return h.hexdigest()


def _closure(names) -> dict:
    """The installed distributions ``names`` need, with their dependencies (markers
    evaluated, no extras): name -> importlib.metadata distribution of this venv."""
    seen, todo = {}, list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen[name] = dist = metadata.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _link_site(site: pathlib.Path, names) -> list[str]:
    """Put the distributions ``names`` need into ``site`` as links to this venv's own
    copies: each top-level file or folder their RECORDs list (scripts outside
    site-packages and shared __pycache__ folders left out). Returns the names."""
    dists = _closure(names)
    for dist in dists.values():
        for top in {f.parts[0] for f in dist.files or []}:
            if top in ("..", "__pycache__") or (site / top).exists():
                continue
            (site / top).symlink_to(pathlib.Path(dist.locate_file(top)).resolve())
    return sorted(dists)


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """The Colab-like environment: its python, the foreign packages' folders and
    digests, and the folder the setup cell fetches the book into.

    A fresh virtual environment holding only what Colab preinstalls: the pinned
    distributions and their dependencies, the very ones this project's venv installed
    from requirements.txt, linked into its site-packages (pip would unpack the same
    wheels in about 100 s; links take under a second). Nothing else of this venv is
    there: not the book (installed editable here), not jupyter-book, not pytest."""
    tmp = tmp_path_factory.mktemp("colab")
    venv = tmp / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    py = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = pathlib.Path(
        subprocess.run(
            [str(py), "-c", where], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    pins = dict(p.split("==") for p in _pins())
    linked = _link_site(site, [*pins, "pip"])  # Colab has pip (chapter 1 uses it)
    for name, version in pins.items():  # the versions requirements.txt pins
        assert metadata.version(name).split("+")[0] == version.split("+")[0], name
    assert "jupyter-book" not in linked and "pytest" not in linked
    subprocess.run(
        [
            str(py),
            "-m",
            "ipykernel",
            "install",
            "--prefix",
            str(venv),
            "--name",
            "colab-sim",
        ],
        check=True,
        capture_output=True,
    )
    foreign = {}
    for name, body in FOREIGN.items():  # installed as pip would: package + dist-info
        pkg = site / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(
            f'"""A foreign package named {name}."""\n' + body
        )
        info = site / f"{name}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n"
        )
        (info / "RECORD").write_text(f"{name}/__init__.py,,\n")
        foreign[name] = (pkg, _digest(pkg))
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "py": py,
        "venv": venv,
        "foreign": foreign,
        "head": head,
        "book": tmp / "content" / "book",
    }


CHECK = """\
import json, os, subprocess, sys
import attention, kernels
from benchmarks import report
# where a child process's `import kernels` finds it (the search import does, without
# running the package: importing it would load torch and triton again, 2 s a page)
child = subprocess.run(
    [sys.executable, "-c",
     "import importlib.util as u; print(u.find_spec('kernels').origin)"],
    capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"attention": attention.__file__, "kernels": kernels.__file__,
                  "child": child, "cwd": os.getcwd(), "python": sys.executable,
                  "static": report.load_static("sm90") is not None}))
"""


@pytest.mark.parametrize("path", EDITIONS, ids=lambda p: p.name)
def test_edition_runs_as_on_colab(colab, path, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(colab["venv"] / "share" / "jupyter"))
    monkeypatch.setenv("ATTENTION_BOOK_REPO_URL", f"file://{ROOT}")
    monkeypatch.setenv("ATTENTION_BOOK_REF", colab["head"])
    monkeypatch.setenv("ATTENTION_BOOK_DIR", str(colab["book"]))
    for var in ("PYTHONPATH", "TRITON_INTERPRET", "VIRTUAL_ENV"):
        monkeypatch.delenv(var, raising=False)
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].source == edition.SETUP_CELL, "the setup cell comes first"
    fake = nbformat.v4.new_code_cell(
        "import sys, types\nsys.modules['google.colab'] = "
        "types.ModuleType('google.colab')  # as on Colab"
    )
    nb.cells = [fake, *nb.cells, nbformat.v4.new_code_cell(CHECK)]
    workdir = colab["book"].parent / "start"  # not the repository
    workdir.mkdir(parents=True, exist_ok=True)
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="colab-sim",
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()  # raises on the first cell that fails

    printed = "".join(
        o.get("text", "") for o in nb.cells[-1].outputs if o.get("name") == "stdout"
    )
    where = json.loads(printed.strip().splitlines()[-1])
    book = str(colab["book"])
    assert where["python"].startswith(str(colab["venv"])), where
    for key in ("attention", "kernels", "child"):
        assert where[key].startswith(book + "/"), where
    assert where["cwd"] == book and where["static"], where
    fetched = subprocess.run(
        ["git", "-C", book, "rev-parse", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert fetched == colab["head"]
    text = "\n".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    if path.name.startswith("02_"):
        assert "SASS per hot-loop iteration" in text and "no compile report" not in text
    # The foreign packages: untouched, and still theirs outside this notebook.
    for name, (pkg, digest) in colab["foreign"].items():
        assert _digest(pkg) == digest, f"the foreign {name} was changed"
        run = subprocess.run(
            [
                str(colab["py"]),
                "-c",
                f"import {name}; assert {CALLS[name]}; print({name}.__file__)",
            ],
            capture_output=True,
            text=True,
            cwd=str(workdir),
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == str(pkg / "__init__.py")


def test_a_foreign_package_already_imported_is_refused(colab, monkeypatch, tmp_path):
    """A notebook that imported another `kernels` first is told to restart."""
    monkeypatch.setenv("ATTENTION_BOOK_DIR", str(tmp_path / "book"))
    cell = (
        "import sys, types\nsys.modules['google.colab'] = "
        "types.ModuleType('google.colab')\nimport kernels\n" + edition.SETUP_CELL
    )
    run = subprocess.run(
        [str(colab["py"]), "-c", cell],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
    )
    assert run.returncode != 0
    assert "already imported" in run.stderr and "Restart the session" in run.stderr
    assert not (tmp_path / "book").exists()
