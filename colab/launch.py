"""Sphinx extension: the site's Colab launch button opens the page's Colab edition.

sphinx-book-theme builds the button as
``<colab_url>/github/<org>/<repo>/blob/<branch>/<page>.ipynb`` (its
``header_buttons.launch.add_launch_buttons``, on ``html-page-context`` at priority
501). This handler runs after it and points the link at ``colab/<page>.ipynb``, the
edition ``colab/edition.py`` writes, when that file exists; any other launch link is
left as the theme made it. Loaded from ``_config.yml`` (``sphinx.local_extensions``).
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
EDITIONS = ROOT / "colab"


def edition_url(url: str, pagename: str) -> str:
    """The theme's Colab URL of ``pagename`` -> its edition's (if it has one)."""
    if not (EDITIONS / f"{pagename}.ipynb").exists():
        return url
    return re.sub(
        rf"(/blob/[^/]+/){re.escape(pagename)}\.ipynb$",
        rf"\g<1>colab/{pagename}.ipynb",
        url,
    )


def point_colab_at_edition(app, pagename, templatename, context, doctree) -> None:
    for group in context.get("header_buttons") or []:
        if group.get("label") != "launch-buttons":
            continue
        for button in group.get("buttons", []):
            if "colab.research.google.com" in str(button.get("url", "")):
                button["url"] = edition_url(button["url"], pagename)


def setup(app):
    app.connect("html-page-context", point_colab_at_edition, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
