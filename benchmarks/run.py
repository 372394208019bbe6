"""One command on a CUDA GPU: correctness first, then timings, written to results/<gpu>.json.

    python benchmarks/run.py                 # every suite
    python benchmarks/run.py --suite flash   # one suite (flash, hard, deformable)
    python benchmarks/run.py --quick         # smallest sweep, to check the script itself

Each suite is a module ``benchmarks/suite_<name>.py`` with two functions:
``check() -> list[dict]`` compares the kernels against fp64/PyTorch references on this
GPU (each dict has ``name``, ``max_err``, ``tol``, ``ok``), and
``run(quick: bool, deadline: float) -> list[kernels.bench.Record]`` times them, stopping
cleanly at ``deadline`` (time.monotonic()). Timing is skipped for a suite whose
check fails. Results merge into ``benchmarks/results/<gpu-slug>.json``; with ``$OUT``
set, a copy is written there too (the device tool brings that folder back).
The whole run is designed to fit one 8-minute call, compilation included.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SUITES = ["flash", "hard", "deformable"]
# Share of the time budget per suite (time a suite leaves unused passes to the next ones).
# The flash sweep (fwd and fwd+bwd, two dtypes, six lengths, four baselines) is the largest.
WEIGHTS = {"flash": 3.0, "hard": 1.0, "deformable": 1.0}


def available_suites() -> list[str]:
    return [s for s in SUITES if (ROOT / "benchmarks" / f"suite_{s}.py").exists()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default="all", choices=["all", *SUITES])
    ap.add_argument("--quick", action="store_true", help="smallest sweep")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="total seconds for all suites (default 450: fits an 8-minute call)")
    args = ap.parse_args(argv)

    from kernels import bench, runtime

    if not runtime.HAS_CUDA or runtime.INTERPRET:
        print("benchmarks/run.py needs a CUDA GPU (and TRITON_INTERPRET unset); "
              "nothing is timed on the CPU.", file=sys.stderr)
        return 2

    suites = available_suites() if args.suite == "all" else [args.suite]
    start = time.monotonic()
    prov = runtime.describe()
    print(f"# {bench.provenance_label(prov)}", flush=True)
    status = 0
    for i, name in enumerate(suites):
        remaining = args.budget_s - (time.monotonic() - start)
        share = WEIGHTS[name] / sum(WEIGHTS[s] for s in suites[i:])
        deadline = time.monotonic() + remaining * share
        mod = importlib.import_module(f"benchmarks.suite_{name}")
        t0 = time.monotonic()
        correctness = mod.check()
        bad = [c for c in correctness if not c["ok"]]
        for c in correctness:
            print(f"[{name}] check {c['name']}: max_err={c['max_err']:.3g} tol={c['tol']:.3g} "
                  f"{'ok' if c['ok'] else 'FAIL'}", flush=True)
        records = []
        if bad:
            status = 1
            print(f"[{name}] {len(bad)} correctness checks failed: timing skipped", flush=True)
        else:
            records = mod.run(quick=args.quick, deadline=deadline)
        path = bench.save_results(name, records, correctness, provenance=prov)
        print(f"[{name}] {len(records)} records in {time.monotonic() - t0:.0f}s -> {path}",
              flush=True)
        if os.environ.get("OUT"):
            out = pathlib.Path(os.environ["OUT"])
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, out / path.name)
    return status


if __name__ == "__main__":
    sys.exit(main())
