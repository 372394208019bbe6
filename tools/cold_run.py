"""Time what a newcomer does: a fresh clone, ``make book``, then ``make test``.

    python3 tools/cold_run.py [--source DIR] [--results FILE] [--dry-run]

Clones ``--source`` (default: the checkout this file is in), at its HEAD, into a
temporary folder (no ``.venv``, no ``_build``), gives Triton an empty cache
(``TRITON_CACHE_DIR``), runs ``make book`` and then ``make test`` there, each timed by
the wall clock, and appends one record to ``--results`` (default
``benchmarks/results/cold_runs.json`` of the source checkout): the date, the commit, the
machine (cores, memory, CPU model, Python), and per command its seconds, whether it
passed and the pytest summary lines of its output ("1575 passed, 5 skipped in 323.4s").
Pip's download cache stays as the machine has it. Run it with nothing else running.

``--dry-run`` prints the steps and writes nothing. ``tests/test_cold_run.py`` runs the
tool on a tiny repository whose ``book`` and ``test`` targets only echo.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = pathlib.Path("benchmarks") / "results" / "cold_runs.json"
ABOUT = (
    "Cold runs of `make book` then `make test`, written by tools/cold_run.py: a new "
    "clone at `commit` (no .venv), an empty TRITON_CACHE_DIR, pip's download cache as "
    "the machine had it; wall-clock seconds. One machine's figures, not bounds."
)
#: A pytest summary line: "===== 12 passed, 3 skipped in 4.56s =====" (or without =).
SUMMARY = re.compile(
    r"^=*\s*(\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b"
    r".*\bin [\d.]+s\b.*?)\s*=*$"
)


def machine() -> dict:
    """The machine the commands run on: cores, memory, CPU model, Python."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    python = subprocess.run(  # the python3 `make` builds the venv with
        ["python3", "--version"], capture_output=True, text=True
    ).stdout.split()[-1:]
    return {
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory / 2**30, 1),
        "cpu": cpu,
        "python": python[0] if python else None,
    }


def run_timed(cmd: list[str], cwd: pathlib.Path, env: dict) -> dict:
    """Run ``cmd``, its output passed through and kept: seconds, pass, summaries."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    summary = []
    for line in proc.stdout:
        sys.stdout.write(line)
        found = SUMMARY.match(line.strip())
        if found:
            summary.append(found.group(1))
    rc = proc.wait()
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "passed": rc == 0,
        "exit_status": rc,
        "pytest_summary": summary,
    }


def append_record(path: pathlib.Path, record: dict) -> None:
    """Append ``record`` to the results file (an object with a ``records`` list)."""
    data = {"about": ABOUT, "records": []}
    if path.is_file():
        data = json.loads(path.read_text())
    data["records"].append(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=pathlib.Path, default=ROOT)
    ap.add_argument("--results", type=pathlib.Path, default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the steps only")
    args = ap.parse_args(argv)
    source = args.source.resolve()
    results = args.results or source / RESULTS
    git = ["git", "-C", str(source), "rev-parse", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True, check=True)
    commit = commit.stdout.strip()
    steps = (["make", "book"], ["make", "test"])
    if args.dry_run:
        print(f"git clone {source} <tmp>/clone; git checkout {commit}")
        print("TRITON_CACHE_DIR=<tmp>/triton-cache")
        for cmd in steps:
            print(f"time {' '.join(cmd)}")
        print(f"append the record to {results}")
        return 0
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "commit": commit,
        "machine": machine(),
    }
    with tempfile.TemporaryDirectory(prefix="cold-run-") as tmp:
        clone = pathlib.Path(tmp) / "clone"
        subprocess.run(["git", "clone", "--quiet", str(source), str(clone)], check=True)
        subprocess.run(
            ["git", "-C", str(clone), "checkout", "--quiet", commit], check=True
        )
        cache = pathlib.Path(tmp) / "triton-cache"
        cache.mkdir()
        env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
        for cmd in steps:
            step = record[" ".join(cmd)] = run_timed(cmd, clone, env)
            if not step["passed"]:
                break  # a newcomer stops where a command fails
    record["passed"] = all(record.get(" ".join(c), {}).get("passed") for c in steps)
    append_record(results, record)
    for cmd in steps:
        step = record.get(" ".join(cmd))
        if step:
            verdict = "passed" if step["passed"] else "FAILED"
            print(f"{' '.join(cmd)}: {step['seconds']:.0f} s, {verdict}")
    print(f"recorded in {results}")
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
