"""tools/execute_notebooks.py: a page is executed again when its cells changed, or when
the code or data it imports or reads changed after its cached copy was executed."""

import datetime
import os

import nbformat
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn

from tools import execute_notebooks as ex


def _page(tmp_path, source="x = 1"):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = tmp_path / f"page{abs(hash(source))}.ipynb"
    nbformat.write(nb, path)
    return nb, path


def test_a_cached_page_is_current_only_if_newer_than_the_code(tmp_path):
    cache = get_cache(str(tmp_path / "cache"))
    nb, path = _page(tmp_path)
    record = cache.cache_notebook_bundle(
        CacheBundleIn(nb, str(path)), check_validity=False
    )
    second = datetime.timedelta(seconds=1)
    assert ex._cached(cache, path, record.created - second)
    assert not ex._cached(cache, path, record.created + second)  # code changed since
    _, other = _page(tmp_path, "y = 2")  # cells no copy matches
    assert not ex._cached(cache, other, record.created - second)


def test_newest_code_is_the_newest_file_of_the_folders_pages_read(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(ex, "ROOT", tmp_path)
    monkeypatch.setattr(ex, "CODE", ("a", "b"))
    for rel, t in (("a/x.py", 1_000_000), ("b/deep/y.json", 2_000_000)):
        f = tmp_path / rel
        f.parent.mkdir(parents=True)
        f.write_text("1")
        os.utime(f, (t, t))
    cached = tmp_path / "a" / "__pycache__" / "x.pyc"  # not code: written on import
    cached.parent.mkdir()
    cached.write_text("1")
    assert ex.newest_code() == datetime.datetime(1970, 1, 24, 3, 33, 20)


def test_the_pages_read_the_folders_the_rule_watches():
    # every folder that exists: a misspelt one would be ignored silently
    assert all((ex.ROOT / folder).is_dir() for folder in ex.CODE)
    assert {"attention", "kernels", "benchmarks"} <= set(ex.CODE)


def test_a_stale_markdown_page_is_left_to_the_build_to_execute_again(tmp_path):
    cache = get_cache(str(tmp_path / "cache"))
    nb, _ = _page(tmp_path)
    page = tmp_path / "intro.md"
    page.write_text("# a page the build executes itself\n")
    os.utime(page, (1_000_000, 1_000_000))
    record = cache.cache_notebook_bundle(
        CacheBundleIn(nb, str(page)), check_validity=False
    )
    second = datetime.timedelta(seconds=1)
    assert ex.forget_stale_markdown(cache, record.created - second) == []
    assert len(cache.list_cache_records()) == 1  # current: kept
    assert ex.forget_stale_markdown(cache, record.created + second) == [page]
    assert cache.list_cache_records() == []  # the build finds no copy: executes it
    assert page.stat().st_mtime > 1_000_000  # and Sphinx reads the page again
