"""Execute the book's notebook pages two at a time into jupyter-book's cache.

``make book`` runs this before ``jupyter-book build``. The build executes each page
itself, one after another (myst-nb's ``execute_notebooks: cache``), and looks each one
up in jupyter-cache first: a page whose code cells match an executed copy in the cache
is not executed again. So this script fills that cache with one worker per core (two
on the book's 2-core machines): the chapters are single-threaded Python for the most
part (NumPy at small sizes, Triton's interpreter), and two of them at once take about
half the time of two in a row. The build then finds every page cached and renders it.

It executes exactly as myst-nb would: the page's own folder as the working directory,
the timeout of ``_config.yml``, errors not allowed, and the site's environment variable
set (``attention.explorers.site.SITE_ENV``: the Sphinx process sets it for the kernels
it starts, so that explorers give their static twins and progress bars stay silent).
Each kernel gets one compute thread (OpenMP, BLAS, torch): two kernels of two threads
each on two cores spin against each other and run several times slower. A page that
raises stops the script with the failing cell's traceback and a non-zero exit, as the
build would have. Pages already in the cache (same code cells) are skipped, so a second
``make book`` executes only what changed; a cached page older than the newest file of
the code and data the pages import or read when executed (``CODE``: the two packages,
the recorded benchmark results and machine-code reports) was executed with other code
and is executed again (jupyter-cache alone matches a page by its own cells, and the
site would show the old code's figures and numbers); a page executed is marked changed
(its file's time set to now), so that the build reads it again, and a stale copy of a
.md page the build executes itself is removed from the cache, the page marked changed.

    python tools/execute_notebooks.py [--jobs N]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import pathlib
import sys
import time

import nbformat
import yaml
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from jupyter_cache.executors.utils import single_nb_execution

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from attention.explorers.site import SITE_ENV  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = ROOT / "_build" / ".jupyter_cache"  # jupyter-book's: <build dir>/.jupyter_cache
#: What the pages import or read when executed, besides their own cells (not colab/,
#: which is made from them, nor _static/, which only the browser runs).
CODE = ("attention", "kernels", "benchmarks")


def newest_code() -> datetime.datetime:
    """When the newest file of ``CODE`` was written (UTC, naive, as jupyter-cache
    records a bundle's ``created``)."""
    newest = max(
        f.stat().st_mtime
        for folder in CODE
        for f in (ROOT / folder).rglob("*")
        if f.is_file() and "__pycache__" not in f.parts
    )
    return datetime.datetime.fromtimestamp(newest, datetime.UTC).replace(tzinfo=None)


def _toc_files(node) -> list[str]:
    """Every ``file:`` entry of _toc.yml, in order."""
    out = []
    if isinstance(node, dict):
        if "file" in node:
            out.append(node["file"])
        for value in node.values():
            out += _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            out += _toc_files(item)
    return out


def notebook_pages() -> list[pathlib.Path]:
    """The .ipynb pages of the table of contents (the .md pages with code cells are
    few and fast: the build executes those itself)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [ROOT / f"{name}.ipynb" for name in [toc.get("root", "")] + _toc_files(toc)]
    return [p for p in pages if p.exists()]


def _timeout() -> int:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return int(config.get("execute", {}).get("timeout", 600))


#: What the kernels inherit: the site's flag, and one thread per kernel.
KERNEL_ENV = {
    SITE_ENV: "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def _execute(job: tuple[str, int]) -> tuple[str, float, str | None]:
    """Execute one page in its own folder and cache it: (page, seconds, error)."""
    os.environ.update(KERNEL_ENV)  # this worker's kernel inherits them
    path, timeout = pathlib.Path(job[0]), job[1]
    nb = nbformat.read(path, as_version=4)
    result = single_nb_execution(
        nb,
        cwd=str(path.parent),
        timeout=timeout,
        allow_errors=False,
        meta_override=True,
    )
    if result.err is not None:
        return str(path), result.time, result.exc_string or repr(result.err)
    get_cache(str(CACHE)).cache_notebook_bundle(
        CacheBundleIn(nb, str(path), data={"execution_seconds": result.time}),
        check_validity=False,
        overwrite=True,
    )
    return str(path), result.time, None


def _cached(cache, path: pathlib.Path, newest: datetime.datetime) -> bool:
    """Whether the cache holds this page's cells executed with the code as it is."""
    try:
        record = cache.match_cache_notebook(nbformat.read(path, as_version=4))
    except KeyError:
        return False
    return record.created >= newest


def forget_stale_markdown(cache, newest: datetime.datetime) -> list[pathlib.Path]:
    """The .md pages the build executes itself (``intro.md``'s teaser) whose cached
    execution is older than ``newest``: their records are removed and their files
    marked changed, so that the build executes them again and reads them again."""
    stale = []
    for record in cache.list_cache_records():
        path = pathlib.Path(record.uri)
        if path.suffix == ".md" and record.created < newest:
            cache.remove_cache(record.pk)
            if path.exists():
                os.utime(path)
                stale.append(path)
    return stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    CACHE.parent.mkdir(exist_ok=True)
    cache = get_cache(str(CACHE))
    newest = newest_code()
    for path in forget_stale_markdown(cache, newest):
        print(f"execute: {path.relative_to(ROOT)} left to the build (the code changed)")
    todo = [p for p in notebook_pages() if not _cached(cache, p, newest)]
    if not todo:
        print("execute: every notebook page is in the cache")
        return 0
    # Longest first (by source size, a fair proxy here), so the two workers end
    # together instead of one waiting on the last long chapter.
    todo.sort(key=lambda p: p.stat().st_size, reverse=True)
    print(f"execute: {len(todo)} page(s), {args.jobs} at a time")
    t0 = time.perf_counter()
    jobs = [(str(p), _timeout()) for p in todo]
    failed = []
    # Spawned, not forked (no state of this process in the kernels' parents); each
    # worker executes page after page (each page in a kernel of its own), so the
    # workers' own imports (about 2 s each on 2 cores) are paid twice, not per page.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(max(1, args.jobs)) as pool:
        for path, seconds, err in pool.imap_unordered(_execute, jobs):
            name = pathlib.Path(path).relative_to(ROOT)
            if err is None:
                # Sphinx reads again only the pages whose source is newer than its last
                # build: a page executed again for new code has the same source
                os.utime(path)
                print(f"execute: {name} in {seconds:.1f} s")
            else:
                failed.append(name)
                print(f"execute: {name} FAILED after {seconds:.1f} s\n{err}")
            sys.stdout.flush()
    print(f"execute: done in {time.perf_counter() - t0:.1f} s")
    if failed:
        print("execute: failed: " + ", ".join(map(str, failed)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
