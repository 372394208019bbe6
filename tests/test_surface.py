"""The public surface and the outputs a refactor must keep (``tools/surface.py``):
the family packages' public names and signatures, the ``attention`` modules', the
compile peaks and SASS reports, the static explorers' page data and the results-file
schema, regenerated and compared with ``tests/data/surface.json``.

A change that is meant (a new public name, a new explorer setting) is recorded with
``python tools/surface.py --write``; the diff below says what to look at first."""

import json

from tools import surface


def test_the_surface_is_unchanged():
    recorded = json.loads(surface.SNAPSHOT.read_text())
    now = json.loads(surface.dumps(surface.snapshot()))
    changes = surface.diff(recorded, now)
    assert not changes, (
        "the public surface changed (- gone, + new, ~ changed); if meant, run "
        "python tools/surface.py --write\n" + "\n".join(changes)
    )


def test_the_diff_reads_what_changed():
    old = {"surface": {"kernels.flash": {"f": "call f(x)", "g": "call g()"}}}
    new = {"surface": {"kernels.flash": {"f": "call f(x, y)", "h": "call h()"}}}
    assert surface.diff(old, new) == [
        '- /surface/kernels.flash/g: "call g()"',
        '+ /surface/kernels.flash/h: "call h()"',
        '~ /surface/kernels.flash/f:\n    was "call f(x)"\n    now "call f(x, y)"',
    ]
