"""The Colab path, run here: a runtime that has only what Colab preinstalls
installs this book from its repository in the chapter's first cell,
then runs the chapter's first sections.

Colab's Python comes with torch, triton, numpy, matplotlib, ipywidgets, tqdm and
threadpoolctl (a scikit-learn dependency), and ipykernel runs the notebook; this project
is not there. The test builds such a virtual environment (the versions pinned in
requirements.txt, so pip takes them from its cache), fakes the ``google.colab`` module
the way a Colab kernel has it imported, points the setup cell's
``ATTENTION_BOOK_PACKAGE_URL`` at this clone (``git+file://...``, i.e. what is
committed) and executes chapter 1's setup cell and its sections up to "Masks", then
checks that ``attention`` and ``kernels`` were imported from the new environment's
site-packages, not from the working tree.
"""

import json
import re
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT

COLAB_PREINSTALLED = ("torch", "triton", "numpy", "matplotlib",
                      "ipywidgets", "ipykernel", "tqdm", "threadpoolctl")
CHAPTER = ROOT / "chapters" / "01_self_cross_attention.ipynb"
STOP_AT = "## Masks"  # the first sections: the equation, self-attention step by step


def _pins() -> list[str]:
    req = (ROOT / "requirements.txt").read_text()
    pins = []
    for name in COLAB_PREINSTALLED:
        m = re.search(rf"^({re.escape(name)}==[^\s;]+)", req, flags=re.M | re.I)
        assert m, f"requirements.txt pins no {name}"
        pins.append(m.group(1))
    return pins


def _first_sections(nb):
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.startswith(STOP_AT):
            break
        cells.append(cell)
    return cells


@pytest.mark.slow
@pytest.mark.xdist_group("colab")
@pytest.mark.skipif(not (ROOT / ".git").exists(),
                    reason="needs a git clone to install from")
def test_chapter1_runs_as_on_colab(tmp_path, monkeypatch):
    venv = tmp_path / "colab"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", *_pins()], check=True, timeout=900)
    # A kernel spec of that interpreter, found through JUPYTER_PATH.
    subprocess.run([str(py), "-m", "ipykernel", "install", "--prefix", str(venv),
                    "--name", "colab-sim"], check=True, capture_output=True)
    monkeypatch.setenv("JUPYTER_PATH", str(venv / "share" / "jupyter"))
    monkeypatch.setenv("ATTENTION_BOOK_PACKAGE_URL", f"git+file://{ROOT}")
    for var in ("PYTHONPATH", "TRITON_INTERPRET", "VIRTUAL_ENV"):
        monkeypatch.delenv(var, raising=False)

    nb = nbformat.read(CHAPTER, as_version=4)
    cells = _first_sections(nb)
    assert "PACKAGE_URL" in cells[0].source, "the setup cell installs from PACKAGE_URL"
    colab = nbformat.v4.new_code_cell(
        "import sys, types\nsys.modules['google.colab'] = "
        "types.ModuleType('google.colab')  # as on Colab")
    check = nbformat.v4.new_code_cell(
        "import json, attention, kernels\n"
        "from kernels.flash import flash_attention\n"
        "q = torch.randn(1, 2, 32, 16)\n"
        "o = flash_attention(q, q, q)\n"
        "assert torch.allclose(o, torch.softmax(q @ q.mT / 4, -1) @ q, atol=1e-5)\n"
        "print(json.dumps({'attention': attention.__file__, 'kernels': "
        "kernels.__file__,\n                  'python': sys.executable}))")
    nb.cells = [colab, *cells, check]
    # not the repository: nothing imports from the working tree
    workdir = tmp_path / "work"
    workdir.mkdir()
    client = NotebookClient(nb, timeout=600, kernel_name="colab-sim",
                            resources={"metadata": {"path": str(workdir)}})
    client.execute()

    out = "".join(o.get("text", "") for o in nb.cells[-1].outputs
                  if o.output_type == "stream")
    where = json.loads(out.strip().splitlines()[-1])
    site = str(venv)
    assert where["python"].startswith(site), where
    for pkg in ("attention", "kernels"):
        assert where[pkg].startswith(site) and "site-packages" in where[pkg], where
        assert not where[pkg].startswith(str(ROOT)), where
