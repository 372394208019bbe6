"""Every chapter executes top to bottom on a CPU-only machine,
without an error, in time.

``make test`` builds the book before the unit tests, and the build executes every
chapter (myst-nb, stopping on any error) into jupyter-cache: when the cache holds the
executed copy of exactly this source, the test checks that copy (its outputs and the
execution time the build recorded) instead of executing the chapter a second time.
Otherwise (no build, or a chapter changed since) it executes the chapter here.
"""

import pathlib
import time

import nbformat
import pytest
from nbclient import NotebookClient

from tools.execute_notebooks import newest_code

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
# Each chapter is designed to run in under 90 s on a 2-core CPU; CI machines vary,
# so the hard limit here is looser. The measured time is printed (pytest -s / -rA).
TIME_LIMIT_S = 240
CACHE = ROOT / "_build" / ".jupyter_cache"


def _executed_by_the_build(nb):
    """(executed notebook, seconds) that ``make book`` cached for exactly this source,
    or None."""
    if not (CACHE / "global.db").is_file():
        return None
    from jupyter_cache import get_cache

    cache = get_cache(CACHE)
    try:
        record = cache.match_cache_notebook(nb)
    except KeyError:  # no executed copy of this source
        return None
    seconds = (record.data or {}).get("execution_seconds")
    if seconds is None or record.created < newest_code():
        return None
    return cache.get_cache_bundle(record.pk).nb, seconds


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(nb_path, record_property):
    nb = nbformat.read(nb_path, as_version=4)
    built = _executed_by_the_build(nb)
    if built is not None:
        nb, elapsed = built
        how = "by make book (jupyter-cache)"
    else:
        client = NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": str(nb_path.parent)}},
        )
        t0 = time.perf_counter()
        client.execute()
        elapsed = time.perf_counter() - t0
        how = "here"
    record_property("seconds", round(elapsed, 1))
    print(f"{nb_path.name}: executed {how} in {elapsed:.1f} s")
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors, errors
    figures = sum(
        1
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    )
    assert figures >= 3, f"{nb_path.name} drew only {figures} figures"
    assert elapsed < TIME_LIMIT_S, f"{nb_path.name} took {elapsed:.0f} s"
