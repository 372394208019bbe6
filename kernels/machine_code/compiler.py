"""The ahead-of-time compile engine: one kernel compiled for one GPU target on a CPU,
and what every family's ``compile_check`` shares. It imports no kernel family.

``jit_function`` (the @jit function under @autotune/@heuristics), ``compile_values``
(``triton.compile`` of an ``ASTSource`` for a ``GPUTarget``, the arguments specialised
as a launch would), ``ptxas_usage`` (registers and spills from the ``ptxas -v`` report
Triton ran while compiling, kept per PTX digest), then the pieces of a check's table and
command line: ``measure``, ``cells``, ``check_args``, ``report_header``,
``write_reports``, ``run_jobs``. Each family's matrix of shipped tiles lives in its own
folder: ``python -m kernels.<family>.compile_check``. Sets ``TRITON_INTERPRET=0``
before importing :mod:`kernels`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pathlib
import re
import subprocess
import tempfile
import time

# before kernels is imported: compile, do not interpret
os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels import common  # noqa: E402

PTXAS = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
#: dtype -> its short name ("fp16", "bf16", "fp32")
DTYPE_NAMES = {dt: name for name, dt in common.DTYPE_NAMES.items()}


def jit_function(kernel) -> triton.runtime.JITFunction:
    """Unwrap @autotune / @heuristics down to the @jit function."""
    while not isinstance(kernel, triton.runtime.JITFunction):
        kernel = kernel.fn
    return kernel


def compile_values(
    fn, values: dict, cap: tuple[int, int], num_warps: int, num_stages: int
):
    """``triton.compile`` of jit function ``fn`` for compute capability ``cap`` (a
    (major, minor) pair) with argument ``values`` keyed by parameter name, specialised
    as a launch would be (integers equal to 1 baked in, 16-byte alignment noted)."""
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):  # specialised as a launch does
        val = values[p.name]
        if p.is_constexpr:
            signature[p.name], constexprs[p.name] = "constexpr", val
            continue
        ty, spec = native_specialize_impl(BaseBackend, val, False, True, True)
        signature[p.name] = ty
        if ty == "constexpr":  # integers equal to 1 are baked in
            constexprs[p.name] = spec
        elif spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", cap[0] * 10 + cap[1], 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


#: PTX (its SHA-256) -> the report of the ``ptxas -v`` Triton itself ran on it while
#: compiling (``_keep_ptxas_reports``), so that ``ptxas_usage`` need not assemble the
#: same PTX a second time (about half a second of the 2 to 3 s a compilation takes).
_PTXAS_REPORTS: dict[str, str] = {}


def _keep_ptxas_reports() -> None:
    """Record the report of each ``ptxas -v`` Triton runs (its ``make_cubin`` passes
    ``-v`` and prints the report when ``knobs.nvidia.dump_ptxas_log`` is on) under its
    PTX's digest, instead of printing it. A Triton without that knob is left alone:
    ``ptxas_usage`` then runs ptxas itself, as it does for a PTX Triton took from its
    cache (no ptxas ran)."""
    try:
        from triton import knobs
        from triton.backends.nvidia.compiler import CUDABackend
    except ImportError:
        return
    original = CUDABackend.make_cubin
    if not hasattr(knobs.nvidia, "dump_ptxas_log") or hasattr(original, "keeps"):
        return

    def make_cubin(self, src, metadata, opt, capability):
        report = io.StringIO()
        with knobs.nvidia.scope(), contextlib.redirect_stdout(report):
            knobs.nvidia.dump_ptxas_log = True
            cubin = original(self, src, metadata, opt, capability)
        _PTXAS_REPORTS[hashlib.sha256(src.encode()).hexdigest()] = report.getvalue()
        return cubin

    make_cubin.keeps = True
    CUDABackend.make_cubin = make_cubin


_keep_ptxas_reports()


def run_ptxas(ptx: str) -> str:
    """The report of ``ptxas -v`` on ``ptx``, run here with the flags Triton's own
    ptxas call uses (backends/nvidia/compiler.py: make_cubin)."""
    arch = re.search(r"^\.target\s+(\w+)", ptx, re.M).group(1)
    with tempfile.TemporaryDirectory() as d:
        src = pathlib.Path(d) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run(
            [
                str(PTXAS),
                "-lineinfo",
                "-v",
                "--regAllocOptLevel=2",
                f"--gpu-name={arch}",
                str(src),
                "-o",
                str(src) + ".o",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    return out.stdout + out.stderr


def ptxas_usage(ptx: str) -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) from ``ptxas -v`` on ``ptx``:
    the report of the run Triton made compiling it, or of a run here when there was
    none (the kernel came from Triton's cache)."""
    log = _PTXAS_REPORTS.get(hashlib.sha256(ptx.encode()).hexdigest())
    if log is None or "Used" not in log:
        log = run_ptxas(ptx)
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return regs, int(spill.group(1)), int(spill.group(2))


# ---------------------------------------------------------------------------------
# What the families' compile checks share: a row per compilation, its
# table cells, the command line and the --report files.
# ---------------------------------------------------------------------------------

STATIC_DIR = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "static"
REPORT_TARGETS = ("sm90", "sm80")
#: The --report files' shapes, the same for every family: bf16 at the head dims models
#: use, long aligned sequences.
REPORT_SHAPES = {"head_dims": (64, 128), "dtype": torch.bfloat16, "n_ctx": 16384}


def error_text(e: Exception) -> str:
    """A failed compilation as the checks report it: the exception's type and the
    first line of its message."""
    first = str(e).strip().splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def measure(res: dict, build, spills_ok: bool = False) -> dict:
    """Fill the check row ``res`` (it holds ``target`` and ``limit``, the target's
    shared memory) from the compilation ``build()`` returns: shared, registers,
    spills (bytes stored + loaded), wgmma (sm_90: did the dots become Hopper
    ``wgmma``), ok (within shared memory, and no spill unless ``spills_ok``) and the
    compiled kernel under ``compiled``; on a failure error and ok False; seconds."""
    t0 = time.perf_counter()
    try:
        c = build()
        res["shared"] = int(c.metadata.shared)
        res["registers"], st, ld = ptxas_usage(c.asm["ptx"])
        res["spills"] = st + ld
        res["wgmma"] = "wgmma" in c.asm["ptx"] if res["target"] == "sm90" else None
        spill_ok = res["spills"] == 0 or spills_ok
        res["ok"] = spill_ok and res["shared"] <= res["limit"]
        res["compiled"] = c
    except Exception as e:  # noqa: BLE001 - a failed compile is a reported result
        res.update(error=error_text(e), ok=False)
    res["seconds"] = time.perf_counter() - t0
    return res


def cells(r: dict) -> tuple[str, str, str]:
    """A row's shared memory ("KB/limit KB", "-" when it did not compile), status
    ("ok" or the error) and wgmma ("yes", "no", "-") columns."""
    shared = f"{r['shared'] / 1024:.1f}/{r['limit'] // 1024}" if "shared" in r else "-"
    status = "ok" if r["ok"] else r.get("error", "FAIL")
    wg = {True: "yes", False: "no", None: "-"}[r.get("wgmma")]
    return shared, status, wg


def check_args(argv, doc: str, targets, kernels):
    """A check's command line: --quick, --target, --kernel, --report."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the representative subset")
    ap.add_argument("--target", action="append", choices=list(targets))
    ap.add_argument("--kernel", action="append", choices=list(kernels))
    ap.add_argument(
        "--report",
        action="store_true",
        help="hot-loop SASS counts of the forward (sm90/sm80) -> benchmarks/static/",
    )
    return ap.parse_args(argv)


def report_header(target: str, check: str, note: str) -> dict:
    """The fields a --report file opens with: target, versions, date, the command
    that wrote it (``python -m <check>``, ``check`` the module's dotted name) and
    ``note``."""
    return {
        "target": target,
        "triton": triton.__version__,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "command": f"python -m {check} --report --target {target}",
        "note": note,
    }


def write_reports(family: str, targets, machine_code_report, describe) -> int:
    """--report: ``machine_code_report(target)`` for each of ``targets`` (sm90 and
    sm80 when none) into ``benchmarks/static/<family>-<target>.json``, printing
    ``describe(target, row)`` for each of its kernels' rows; 2 for another target."""
    import json
    import sys

    bad = set(targets or ()) - set(REPORT_TARGETS)
    if bad:
        print(f"--report covers sm90 and sm80, not {sorted(bad)}", file=sys.stderr)
        return 2
    STATIC_DIR.mkdir(parents=True, exist_ok=True)
    for target in targets or REPORT_TARGETS:
        rep = machine_code_report(target)
        path = STATIC_DIR / f"{family}-{target}.json"
        path.write_text(json.dumps(rep, indent=1) + "\n")
        for r in rep["kernels"]:
            print(describe(target, r), flush=True)
        print(f"# written to {path}", flush=True)
    return 0


def run_jobs(jobs, header: str, compile_case, format_row, not_shipped=None) -> int:
    """Compile ``compile_case(*job)`` for each job and print the table: ``header``,
    ``format_row(row)`` per compilation, ``not_shipped(*job)`` where ``compile_case``
    returns None (a case the family refuses), then the tally; 1 if any failed."""
    print(f"# {len(jobs)} compilations", flush=True)
    print(header, flush=True)
    bad = skipped = 0
    for job in jobs:
        r = compile_case(*job)
        if r is None:
            print(not_shipped(*job))
            skipped += 1
            continue
        bad += not r["ok"]
        print(format_row(r), flush=True)
    done = len(jobs) - skipped
    print(f"# {done - bad}/{done} ok" + (f", {skipped} not shipped" if skipped else ""))
    return 1 if bad else 0
