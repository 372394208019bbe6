"""One rounding rule for byte counts: the site's explorers (``human`` in
_static/explorers.js) and the book's Python (``attention.plots.human_bytes``) print the
same string for the same number of bytes, ties included (12.25 MiB is "12.3 MiB" in
both, not "12.2" in one of them). The JavaScript runs under Node where it is
installed; the Python rule is checked on its own everywhere."""

import json
import pathlib
import re
import shutil
import subprocess

import pytest

from attention.plots import human_bytes

ROOT = pathlib.Path(__file__).resolve().parents[2]
JS = (ROOT / "_static" / "explorers.js").read_text()
CASES = [
    0,
    12,
    1000,
    1023,
    1024,
    1536,
    1023.5 * 1024,
    12.25 * 2**20,
    12.35 * 2**20,
    2.675 * 2**20,
    99.95 * 2**20,
    999.5 * 2**20,
    0.5 * 2**30,
    1.125 * 2**30,
    3 * 2**40,
    4096 * 64 * 2 * 6,
    16384**2 * 2 * 4,
]


def test_python_rounds_ties_up_and_drops_zeros():
    assert human_bytes(12.25 * 2**20) == "12.3 MiB"  # a tie: half up
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(2**30) == "1 GiB"
    assert human_bytes(1023.5 * 1024) == "1020 KiB"  # no exponent
    assert human_bytes(12) == "12 B"


def test_explorers_js_prints_what_python_prints():
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed: the JavaScript side is not run here")
    fn = re.search(r"\n  function human\(bytes\) \{.*?\n  \}\n", JS, re.S)
    assert fn, "human() not found in _static/explorers.js"
    cases = json.dumps(CASES)
    script = fn.group(0) + f"console.log(JSON.stringify({cases}.map(human)));"
    out = subprocess.run(
        [node, "-e", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert json.loads(out) == [human_bytes(x) for x in CASES]
