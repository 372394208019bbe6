"""One command on a CUDA GPU: correctness first, then timings, written to
results/<gpu>.json.

    python benchmarks/run.py                # every suite
    python benchmarks/run.py --suite flash  # one suite (flash, hard, deformable,
                                            # decode, ring, flex, sparse)
    python benchmarks/run.py --quick        # smallest sweep, to check the script itself
    python benchmarks/run.py --dry-run      # on a CPU: the whole protocol, a fake timer

Each suite is its family's ``kernels/<name>/timing.py`` (the family's whole vertical
lives in its folder) with
``check(dry=False) -> list[dict]`` (the kernels against fp64/PyTorch references on this
GPU; each dict has ``name``, ``max_err``, ``tol``, ``ok``),
``run(quick, deadline, timer=None, dry=False) -> list[kernels.timing.records.Record]``
(the sweeps, stopping cleanly at ``deadline``, a ``time.monotonic()``) and optionally
``goal(timer=None, dry=False)`` (the goal shapes). The run goes in three phases:

1. ``check``: every suite's correctness, every path, before anything is timed; a suite
   with a failed check is not timed;
2. ``goal``: the goal shapes (flash: bf16, d = 128, N = 16384, forward non-causal
   and causal, then forward + backward), with no deadline: the budget never cuts them;
3. ``sweep``: each suite's sweeps, sharing what is left of ``--budget-s``
   by ``WEIGHTS``.

A suite may also have ``check_paths(dry=False) -> dict`` (flash: every forward
path of ``kernels.flash.forward_tma.FORWARD_PATHS``, pointer, tma and tma-ws, against
the reference), run in phase 1 beside ``check``: its result goes to the suite's
``forward_paths`` in the results file (per path ``ok``, ``max_err``, ``error``,
``checks``) and to ``goal(..., forward_paths=...)``, which times the paths that passed.
A failed non-default path is recorded; it does not stop the suite being timed.

Every timed case goes through ``kernels.timing.bench.time_fn`` (fixed reps, L2 flushed,
CUDA events around the kernels only, spread recorded). The file is written after each
phase (a crash keeps what was measured) with ``protocol``: the phases and every check
and timing event in the order they happened. It is checked with
``kernels.timing.bench.validate_results`` at the end. Results merge into
``benchmarks/results/<gpu-slug>.json``; with ``$OUT`` set, a copy is written there too
(the device tool brings that folder back). The whole run is designed to fit one 8-minute
call, compilation included.

``--dry-run`` runs all of it on a CPU: the checks and kernels at tiny shapes under the
Triton interpreter, ``kernels.timing.bench.FakeTimer`` instead of CUDA events, and the
file written to ``--results-dir`` (default: a new temporary folder; never
benchmarks/results/).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SUITES = ["flash", "hard", "deformable", "decode", "ring", "flex", "sparse"]
# Share of the sweep budget per suite (time a suite leaves unused passes to the next
# ones). The flash sweep (fwd and fwd+bwd, two dtypes, six lengths, six implementations)
# is the largest.
WEIGHTS = {
    "flash": 3.0,
    "hard": 1.0,
    "deformable": 1.0,
    "decode": 1.0,
    "ring": 0.5,
    "flex": 1.0,
    "sparse": 0.5,
}
DRY_GPU = "dry run (CPU, fake timer)"


def available_suites() -> list[str]:
    return [s for s in SUITES if (ROOT / "kernels" / s / "timing.py").exists()]


def _print_check(name: str, c: dict) -> None:
    print(
        f"[{name}] check {c['name']}: max_err={c['max_err']:.3g} tol={c['tol']:.3g} "
        f"{'ok' if c['ok'] else 'FAIL'}",
        flush=True,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--suite", default="all", choices=["all", *SUITES])
    ap.add_argument("--quick", action="store_true", help="smallest sweep")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=450.0,
        help="total seconds for all suites (default 450: fits an 8-minute call)",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="on a CPU: every phase at tiny shapes with a fake timer",
    )
    ap.add_argument(
        "--results-dir",
        type=pathlib.Path,
        default=None,
        help="where the results file goes (default benchmarks/results/; "
        "with --dry-run a new temporary folder)",
    )
    ap.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="time each case by replaying a CUDA graph of it",
    )
    args = ap.parse_args(argv)

    from kernels import runtime
    from kernels.timing import bench, results
    from kernels.timing.records import MIN_REPS, RESULTS_DIR

    dry = args.dry_run
    if not dry and (not runtime.HAS_CUDA or runtime.INTERPRET):
        print(
            "benchmarks/run.py needs a CUDA GPU (and TRITON_INTERPRET unset); "
            "nothing is timed on the CPU (--dry-run checks the protocol there).",
            file=sys.stderr,
        )
        return 2
    if dry and runtime.DEVICE.type != "cpu":
        print("--dry-run runs on the CPU: set TRITON_INTERPRET=1", file=sys.stderr)
        return 2

    suites = available_suites() if args.suite == "all" else [args.suite]
    start = time.monotonic()
    prov = results.gpu_provenance()
    events: list[dict] = []
    state = {"phase": "start", "suite": None}

    def note(event: str, **kw) -> None:
        events.append(
            {
                "seq": len(events),
                "phase": state["phase"],
                "suite": state["suite"],
                "event": event,
                "t_s": round(time.monotonic() - start, 3),
                **kw,
            }
        )

    if dry:
        prov["gpu"] = DRY_GPU
        base_timer = bench.FakeTimer()
        results_dir = args.results_dir or pathlib.Path(
            tempfile.mkdtemp(prefix="bench-dry-")
        )
    else:
        base_timer = functools.partial(bench.time_fn, cuda_graph=args.cuda_graphs)
        results_dir = args.results_dir or RESULTS_DIR
    prov["dry_run"] = dry
    path = results_dir / f"{runtime.slug(prov['gpu'] or 'unknown')}.json"

    def timer(fn, **kw):
        if state["phase"] not in ("goal", "sweep"):
            raise RuntimeError(f"timing during phase {state['phase']!r}")
        note("time")
        return base_timer(fn, **kw)

    protocol = {
        "dry_run": dry,
        "phases": ["check", "goal", "sweep"],
        "budget_s": args.budget_s,
        "quick": args.quick,
        "suites": suites,
        "timer": "fake" if dry else "kernels.timing.bench.time_fn",
        "cuda_graphs": args.cuda_graphs,
        "min_reps": MIN_REPS,
        "events": events,
    }
    print(f"# {results.provenance_label(prov)}", flush=True)
    mods = {name: importlib.import_module(f"kernels.{name}.timing") for name in suites}
    correctness: dict[str, list[dict]] = {}
    paths: dict[str, dict] = {}  # suite -> check_paths() result
    records: dict[str, list] = {name: [] for name in suites}

    def save() -> None:
        for name in suites:
            if name in correctness:
                extra = {"forward_paths": paths[name]} if name in paths else None
                results.save_results(
                    name,
                    records[name],
                    correctness[name],
                    path=path,
                    provenance=prov,
                    extra=extra,
                    top={"protocol": protocol},
                )

    # 1. correctness of every path, before anything is timed
    state["phase"] = "check"
    status = 0
    for name, mod in mods.items():
        state["suite"] = name
        t0 = time.monotonic()
        correctness[name] = mod.check(dry=dry)
        note(
            "check",
            n=len(correctness[name]),
            failed=sum(not c["ok"] for c in correctness[name]),
        )
        for c in correctness[name]:
            _print_check(name, c)
        if hasattr(mod, "check_paths"):
            paths[name] = mod.check_paths(dry=dry)
            res = paths[name]["paths"]
            note("check-paths", paths={p: r["ok"] for p, r in res.items()})
            for p, r in res.items():
                err = "-" if r["max_err"] is None else f"{r['max_err']:.3g}"
                print(
                    f"[{name}] forward path {p}: {len(r['checks'])} checks, "
                    f"max_err={err} {'ok' if r['ok'] else 'FAIL'}"
                    + (f" ({r['error']})" if r["error"] else ""),
                    flush=True,
                )
        print(
            f"[{name}] {len(correctness[name])} checks in {time.monotonic() - t0:.0f}s",
            flush=True,
        )
    timed = [n for n in suites if all(c["ok"] for c in correctness[n])]
    for name in set(suites) - set(timed):
        status = 1
        print(f"[{name}] correctness checks failed: timing skipped", flush=True)
    save()

    # 2. the goal shapes: no deadline
    state["phase"] = "goal"
    for name in timed:
        if hasattr(mods[name], "goal"):
            state["suite"] = name
            kw = {"forward_paths": paths[name]} if name in paths else {}
            records[name] += mods[name].goal(timer=timer, dry=dry, **kw)
            note("done", n=len(records[name]))
    save()

    # 3. the sweeps, in what is left of the budget
    state["phase"] = "sweep"
    for i, name in enumerate(timed):
        state["suite"] = name
        remaining = args.budget_s - (time.monotonic() - start)
        share = WEIGHTS[name] / sum(WEIGHTS[s] for s in timed[i:])
        deadline = time.monotonic() + max(remaining, 0.0) * share
        t0 = time.monotonic()
        records[name] += mods[name].run(
            quick=args.quick, deadline=deadline, timer=timer, dry=dry
        )
        note("done", n=len(records[name]))
        print(
            f"[{name}] {len(records[name])} records in {time.monotonic() - t0:.0f}s",
            flush=True,
        )
        save()
    save()

    problems = results.validate_results(json.loads(path.read_text()))
    for p in problems:
        print(f"results file: {p}", file=sys.stderr)
    status = status or (1 if problems else 0)
    for name in timed:
        for row in results.summarize(records[name]):
            if row["stage"] == "goal":
                print(results.summary_line(row), flush=True)
    print(f"results: {path}", flush=True)
    if os.environ.get("OUT") and not dry:
        out = pathlib.Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / path.name)
    return status


if __name__ == "__main__":
    sys.exit(main())
