"""The repository's house rules: notebooks without outputs,
one repository URL, an honest toc."""

import json
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())


def _toc_files(node) -> list[str]:
    out = []
    if isinstance(node, dict):
        if "file" in node:
            out.append(node["file"])
        for v in node.values():
            out += _toc_files(v)
    elif isinstance(node, list):
        for v in node:
            out += _toc_files(v)
    return out


def _load(nb_path):
    return json.loads(nb_path.read_text())


def test_there_are_chapters():
    assert NOTEBOOKS, "no chapter notebooks found in chapters/"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(nb_path):
    nb = _load(nb_path)
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{nb_path.name} cell {i} has outputs"
            assert cell.get("execution_count") is None, (
                f"{nb_path.name} cell {i} has a count"
            )


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_a_unique_id(nb_path):
    """nbformat 4.5 cells carry ids (figures, glue and Colab anchor on them)."""
    ids = [cell.get("id") for cell in _load(nb_path)["cells"]]
    assert None not in ids, f"{nb_path.name}: cell {ids.index(None)} has no id"
    assert len(set(ids)) == len(ids), f"{nb_path.name}: duplicate cell ids"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_cell_sets_up_colab_and_interpreter(nb_path):
    nb = _load(nb_path)
    first = nb["cells"][0]
    src = "".join(first["source"])
    assert first["cell_type"] == "code"
    url = re.search(r'REPO_URL = "([^"]+)"', src)
    assert url, "first cell must define REPO_URL"
    assert url.group(1) == CONFIG["repository"]["url"], (
        "REPO_URL must match _config.yml"
    )
    assert "google.colab" in src and "TRITON_INTERPRET" in src
    # TRITON_INTERPRET is decided here, before any later cell imports kernels.
    assert "import kernels" not in src and "from kernels" not in src
    assert src.index("torch.cuda.is_available()") < src.index("TRITON_INTERPRET")


def _without_code_blocks(md: str) -> str:
    """Markdown without its fenced code blocks: a "# comment" in one is not a title.
    Directive fences (```{dropdown}, ```{literalinclude}) are kept,
    with what they hold."""
    out, code_fence = [], None
    for line in md.splitlines():
        fence = re.match(r"^\s*(`{3,}|~{3,})(.*)$", line)
        if code_fence:
            if fence and fence.group(1) == code_fence and not fence.group(2).strip():
                code_fence = None
            continue
        if (
            fence
            and fence.group(2).strip()
            and not fence.group(2).lstrip().startswith("{")
        ):
            code_fence = fence.group(1)  # ```python: skip to its closing fence
            continue
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_shape(nb_path):
    md = "\n".join(
        "".join(c["source"])
        for c in _load(nb_path)["cells"]
        if c["cell_type"] == "markdown"
    )
    md = _without_code_blocks(md)
    assert len(re.findall(r"^# ", md, flags=re.M)) == 1, "exactly one title"
    assert re.search(r"^## Summary", md, flags=re.M), "a Summary section"
    assert re.search(r"^## Exercises", md, flags=re.M), "an Exercises section"
    assert "{dropdown}" in md, "exercise solutions hidden in dropdowns"
    assert "{literalinclude}" in md and "../kernels/" in md, (
        "kernel source shown from kernels/"
    )


def test_toc_lists_exactly_the_existing_pages():
    files = [TOC["root"], *_toc_files(TOC)]
    for f in files:
        candidates = [ROOT / f"{f}{ext}" for ext in ("", ".md", ".ipynb")]
        assert any(c.is_file() for c in candidates), (
            f"_toc.yml lists a missing page: {f}"
        )
    listed = {pathlib.Path(f).stem for f in files}
    for nb_path in NOTEBOOKS:
        assert nb_path.stem in listed, f"{nb_path.name} is not in _toc.yml"


def test_requirements_pin_torch_and_triton():
    req = (ROOT / "requirements.txt").read_text()
    assert re.search(r"^torch==2\.13\.0$", req, flags=re.M)
    assert re.search(r"^triton==3\.7\.1;", req, flags=re.M)
    assert re.search(r"^jupyter-book==1\.", req, flags=re.M)


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make book" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_config_builds_strictly_with_colab():
    assert CONFIG["only_build_toc_files"] is True
    assert CONFIG["execute"]["execute_notebooks"] in ("cache", "force")
    assert "colab" in CONFIG["launch_buttons"]["colab_url"]
    assert CONFIG["sphinx"]["config"]["nb_execution_raise_on_error"] is True
