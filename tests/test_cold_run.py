"""tools/cold_run.py on a tiny repository whose `make book` and `make test` only echo:
the record it appends (not the real book, which takes minutes)."""

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(
    not (shutil.which("git") and shutil.which("make")), reason="needs git and make"
)

sys.path.insert(0, str(ROOT / "tools"))
try:
    import cold_run
finally:
    sys.path.remove(str(ROOT / "tools"))

MAKEFILE = """\
book:
\t@echo built with TRITON_CACHE_DIR=$$TRITON_CACHE_DIR
\t@touch built
test:
\t@echo "======= 3 passed, 1 skipped in 0.02s ======="
\t@test ! -f fail
"""


def fake_repo(path, fail=False):
    """A git repository of one commit: the Makefile above (and ``fail``, to fail)."""
    path.mkdir()
    (path / "Makefile").write_text(MAKEFILE)
    if fail:
        (path / "fail").write_text("")
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "--quiet"], check=True)
    subprocess.run(git[:3] + ["add", "."], check=True)
    subprocess.run(git + ["commit", "--quiet", "-m", "fake"], check=True)
    return path


def test_a_cold_run_appends_its_record(tmp_path, capsys):
    repo = fake_repo(tmp_path / "repo")
    results = repo / "benchmarks" / "results" / "cold_runs.json"
    assert cold_run.main(["--source", str(repo)]) == 0
    assert cold_run.main(["--source", str(repo)]) == 0
    data = json.loads(results.read_text())
    assert "cold_run.py" in data["about"] and len(data["records"]) == 2
    record = data["records"][-1]
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    assert record["commit"] == head.stdout.strip() and record["passed"] is True
    assert record["date"][:4].isdigit()
    m = record["machine"]
    assert m["cores"] >= 1 and m["memory_gib"] > 0 and m["cpu"] and m["python"]
    book, test = record["make book"], record["make test"]
    assert book["passed"] and book["seconds"] >= 0 and book["pytest_summary"] == []
    assert test["pytest_summary"] == ["3 passed, 1 skipped in 0.02s"]
    out = capsys.readouterr().out
    assert "built with TRITON_CACHE_DIR=/" in out  # an empty cache of its own
    assert not (repo / "built").exists()  # ran in a clone, not in the source


def test_a_failing_command_is_recorded_as_failed(tmp_path):
    repo = fake_repo(tmp_path / "repo", fail=True)
    results = tmp_path / "runs.json"
    assert cold_run.main(["--source", str(repo), "--results", str(results)]) == 1
    (record,) = json.loads(results.read_text())["records"]
    assert record["passed"] is False and record["make book"]["passed"] is True
    assert record["make test"]["passed"] is False
    assert record["make test"]["exit_status"] != 0


def test_dry_run_writes_nothing(tmp_path, capsys):
    repo = fake_repo(tmp_path / "repo")
    assert cold_run.main(["--source", str(repo), "--dry-run"]) == 0
    assert "make book" in capsys.readouterr().out
    assert not (repo / "benchmarks").exists()
