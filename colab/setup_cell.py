# Setup: run this cell first. It makes the book's code importable and chooses where
# the Triton kernels run.
#
# On Colab it fetches the book's repository (the version this notebook belongs to) into
# /content/paying-attention-to-attention and works from that folder, so this chapter
# reads the same recorded GPU timings and machine-code reports as the website, and a
# command it suggests, such as `python benchmarks/run.py --suite flash`, runs there as
# printed (in a notebook cell, put `!` in front). Nothing is installed into Python's
# site-packages: a package you already have named `kernels` or `attention` (Hugging
# Face's `kernels`, say) is left as it is and only hidden from this notebook.
#
# Which Colab runtime (Runtime > Change runtime type): for the timings, an L4 or an
# A100 GPU. The free T4 (sm_75) has tensor cores, but Triton 3.2 and later compile
# tl.dot to plain FMA instructions there, so on a T4 the book's kernels lose to
# PyTorch's own attention, which does use them; the timing sections then say so and
# show what still holds (the memory). Without a GPU, the kernels run under Triton's
# interpreter on the CPU, slowly, at small sizes.
import os
import subprocess
import sys

import torch

REPO_URL = "https://github.com/paying-attention/paying-attention-to-attention"
BOOK_REF = "main"  # the branch (or commit) of that repository this notebook belongs to
BOOK_DIR = "/content/paying-attention-to-attention"
# A fork or another copy of the repository can be named with environment variables.
REPO_URL = os.environ.get("ATTENTION_BOOK_REPO_URL", REPO_URL)
BOOK_REF = os.environ.get("ATTENTION_BOOK_REF", BOOK_REF)
BOOK_DIR = os.environ.get("ATTENTION_BOOK_DIR", BOOK_DIR)


def git(*args, check=True):
    run = subprocess.run(["git", "-C", BOOK_DIR, *args], capture_output=True, text=True)
    if check and run.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed in {BOOK_DIR}:\n{run.stderr}")
    return run.stdout.strip()


if "google.colab" in sys.modules:
    for name in ("attention", "kernels"):
        where = getattr(sys.modules.get(name), "__file__", None) or "?"
        if name in sys.modules and not where.startswith(BOOK_DIR + os.sep):
            raise RuntimeError(
                f"A package named {name!r} is already imported (from {where}), so "
                "this notebook cannot use the book's. Restart the session (Runtime > "
                "Restart session), then run this cell first."
            )
    if not os.path.isdir(os.path.join(BOOK_DIR, ".git")):
        os.makedirs(BOOK_DIR, exist_ok=True)
        git("init", "-q")
        git("remote", "add", "origin", REPO_URL)
    if git("rev-parse", "-q", "--verify", "HEAD", check=False) != BOOK_REF:
        git("fetch", "-q", "--depth", "1", "origin", BOOK_REF)  # a branch: its tip
        if git("rev-parse", "-q", "--verify", "HEAD", check=False) != git(
            "rev-parse", "FETCH_HEAD"
        ):
            git("checkout", "-q", "--detach", "FETCH_HEAD")
    print(f"The book's code: {BOOK_DIR} at {git('rev-parse', '--short', 'HEAD')}")
    # First on the import path, for this notebook and for the processes it starts.
    sys.path[:] = [BOOK_DIR] + [p for p in sys.path if p != BOOK_DIR]
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [BOOK_DIR] + [p for p in paths if p and p != BOOK_DIR]
    )
    os.chdir(BOOK_DIR)

if not torch.cuda.is_available():
    # Set before `kernels` is imported: triton.jit reads it when a kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")
