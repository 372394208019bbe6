"""The site tests' browser (one per test worker) and its shared pages
(``tests/book/site_tools.py``)."""

import pytest

from tests.book.site_tools import SharedPages, launch_browser


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item (``rep_setup``, ``rep_call``), so that a
    fixture's teardown can tell whether its test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def browser():
    yield from launch_browser()


@pytest.fixture(scope="session")
def _shared_pages(browser):
    pages = SharedPages(browser)
    yield pages
    pages.close()


@pytest.fixture
def open_page(request, _shared_pages):
    """``open_page(name, width=1400)``: the built page ``name`` at ``width`` px, as it
    was on load (loaded once per worker and width, reset for each test). A page whose
    test failed is closed afterwards, so no later test inherits its state."""
    used = []

    def open_(name: str, width: int = 1400):
        pg = _shared_pages.get(name, width)
        used.append(pg)
        return pg

    yield open_
    call = getattr(request.node, "rep_call", None)
    if call is None or not call.passed:
        for pg in used:
            _shared_pages.drop(pg)
