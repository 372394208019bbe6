"""Figure captions say what to see, never a number this build measured.

A chapter's figures are captioned in their code cell's ``mystnb.figure.caption``
(or a ``{figure}``/``{glue:figure}`` directive in a markdown cell). A measurement (a
fitted slope, a time, a ratio) belongs in the cell's printed output, where it is the
number this build got; a caption is the same on every build. Two rules make that
concrete:

* in the source: no caption hedges a number ("about 2", "~3", "≈ 0.5", "roughly
  10"), which is how a per-build measurement reads when it is written into prose;
* on the built outputs (``_build/jupyter_execute/chapters/*.ipynb``, where a
  ``make book`` left them): no number in a caption appears in the chapter's printed
  outputs unless the chapter's code also writes it as a literal (an input such as
  ``d = 64`` or ``100`` queries, not a result). Without a build this rule skips.
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
BUILT = ROOT / "_build" / "jupyter_execute" / "chapters"
HEDGED = re.compile(
    r"(?:\b(?:about|around|approximately|roughly|nearly|close to)"
    r"|[~≈])\s*\$?\s*\d",
    re.I,
)
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")
DIRECTIVE = re.compile(r"```+\{(?:glue:figure|figure)\}[^\n]*\n(.*?)```+", re.S)


def captions(nb: dict) -> list[str]:
    out = []
    for c in nb["cells"]:
        fig = c.get("metadata", {}).get("mystnb", {}).get("figure", {})
        if fig.get("caption"):
            out.append(fig["caption"])
        if c["cell_type"] == "markdown":
            for body in DIRECTIVE.findall("".join(c["source"])):
                out.append(
                    "\n".join(
                        line for line in body.splitlines() if not line.startswith(":")
                    )
                )
    return out


def _numbers(text: str) -> set[str]:
    return set(NUMBER.findall(text))


def printed_numbers(nb: dict) -> set[str]:
    """Numbers in a chapter's text outputs (streams and text/plain results)."""
    found = set()
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            text = o.get("text") or o.get("data", {}).get("text/plain") or ""
            found |= _numbers("".join(text))
    return found


def code_literals(nb: dict) -> set[str]:
    return {
        n
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for n in _numbers("".join(c["source"]))
    }


def measured_in_captions(built_nb: dict) -> list[tuple[str, str]]:
    """(number, caption) pairs where a caption number was printed but not written."""
    printed = printed_numbers(built_nb) - code_literals(built_nb)
    return [
        (n, cap) for cap in captions(built_nb) for n in _numbers(cap) if n in printed
    ]


def test_the_rules_catch_a_measured_slope():
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "source": "n = 64\nprint(slope)",
                "metadata": {"mystnb": {"figure": {"caption": "slope 2.27 at n = 64"}}},
                "outputs": [
                    {"output_type": "stream", "text": "slope 2.27 at n = 64\n"}
                ],
            }
        ]
    }
    assert measured_in_captions(nb) == [("2.27", "slope 2.27 at n = 64")]
    assert HEDGED.search("fitted slope about 2") and HEDGED.search("≈ $0.5$")
    assert not HEDGED.search("the dotted line has slope 2")


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=lambda p: p.name)
def test_no_caption_hedges_a_number(nb_path):
    nb = json.loads(nb_path.read_text())
    caps = captions(nb)
    assert caps, f"{nb_path.name}: no captioned figure found"
    bad = [cap for cap in caps if HEDGED.search(cap)]
    assert not bad, f"{nb_path.name}: captions state an approximate number: {bad}"


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=lambda p: p.name)
def test_no_caption_states_a_number_the_build_printed(nb_path):
    built = BUILT / nb_path.name
    if not built.is_file():
        pytest.skip(f"no built chapter at {built.relative_to(ROOT)} (run make book)")
    bad = measured_in_captions(json.loads(built.read_text()))
    assert not bad, f"{nb_path.name}: captions state numbers the build printed: {bad}"
