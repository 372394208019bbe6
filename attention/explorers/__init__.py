"""The book's explorers: each is one call, the static twin on the site and
ipywidgets in Jupyter."""
