"""Where the book runs, and the static explorer's page object: ``ON_SITE``, ``tqdm``,
``Explorer`` and the Sphinx hook that vendors Vega into the build.

``ON_SITE`` is true while the site is built: ``setup`` (a Sphinx extension named in
``_config.yml``) sets ``SITE_ENV`` in the Sphinx process and the kernels executing the
chapters inherit it. ``explorers.X()`` reads it to give the static twin there and the
ipywidgets explorer in Jupyter and Colab. ``tqdm`` is tqdm's auto progress bar in
Jupyter and a silent one on the site.
"""

from __future__ import annotations

import functools
import html
import json
import os
import uuid

from .settings import check_option  # noqa: F401  (kept for callers of site)

#: Set (to "1") by ``setup`` in the Sphinx process; kernels it starts inherit it.
SITE_ENV = "ATTENTION_STATIC_SITE"
ON_SITE = os.environ.get(SITE_ENV) == "1"

if ON_SITE:
    from tqdm.std import tqdm as _tqdm

    # No widget, no stderr noise on the page.
    tqdm = functools.partial(_tqdm, disable=True)
else:
    from tqdm.auto import tqdm  # noqa: F401  (a widget in Jupyter, text in a terminal)


#: The Vega bundle's file name in the build's _static folder.
BUNDLE = "vega-bundle.js"


# ---------------------------------------------------------------------------------
# The HTML object: a <div> with the data as JSON; _static/explorers.js draws it.
# ---------------------------------------------------------------------------------


class Explorer:
    """A static explorer: ``kind`` names its drawing code in ``_static/explorers.js``,
    ``config`` holds its controls, Vega-Lite specs and precomputed data; ``live`` is
    the call that gives the same explorer in Jupyter or Colab."""

    def __init__(self, kind: str, config: dict, title: str, live: str):
        self.kind, self.config, self.title, self.live = kind, config, title, live

    def to_json(self) -> str:
        # "</" cannot end the <script> element early; JSON stays valid with "<\/".
        return json.dumps(
            {"kind": self.kind, **self.config}, separators=(",", ":")
        ).replace("</", "<\\/")

    def _repr_html_(self) -> str:
        eid = f"explorer-{self.kind}-{uuid.uuid4().hex[:8]}"
        fallback = (
            f"This explorer draws in the web browser on the book's site. In "
            f"Jupyter or Colab, run <code>{html.escape(self.live)}</code> "
            f"instead."
        )
        return (
            f'<div class="static-explorer" id="{eid}" data-kind="{self.kind}" '
            f'role="group" aria-label="{html.escape(self.title)}">'
            f'<p class="static-explorer-fallback">{fallback}</p>'
            f'<script type="application/json" class="static-explorer-data">'
            f"{self.to_json()}</script></div>"
        )

    def __repr__(self) -> str:
        return f"<static explorer {self.kind!r}: {self.title}>"


# ---------------------------------------------------------------------------------
# The Sphinx hook: vendor Vega into the build, mark the kernels as building the site.
# ---------------------------------------------------------------------------------


def _write_bundle(app, exc) -> None:
    if exc is not None or app.builder.format != "html":
        return
    import pathlib

    import vl_convert

    out = pathlib.Path(app.outdir) / "_static" / BUNDLE
    out.parent.mkdir(parents=True, exist_ok=True)
    # One function scope: the bundle's top-level names (``_``, ``n``, ...) would
    # otherwise collide with other scripts' globals; it sets window.vegaEmbed, vega,
    # vegaLite itself.
    bundle = vl_convert.javascript_bundle()
    head = (
        "/* vega, vega-lite, vega-embed from vl-convert-python "
        f"{vl_convert.__version__} */"
    )
    out.write_text(f"{head}\n(function () {{\n{bundle}\n}})();\n", encoding="utf-8")


def setup(app):
    """Sphinx extension (``_config.yml``: ``sphinx.extra_extensions``): executed
    chapters see ``ON_SITE``; every page loads the Vega bundle, written from
    ``vl-convert-python`` into the build's ``_static`` (no CDN, so the site works
    offline from files)."""
    os.environ[SITE_ENV] = "1"
    app.add_js_file(BUNDLE, priority=400)
    app.connect("build-finished", _write_bundle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
