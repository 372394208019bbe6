"""The book's explorers: one call each, a static twin on the site, widgets elsewhere."""
