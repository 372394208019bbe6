"""One kernel of the FlashAttention family compiled for one GPU target, on a CPU.

The kernel table (``KERNELS``, ``KERNEL_FNS``), the argument values of a representative
launch, ``compile_one`` (``triton.compile`` of an ``ASTSource`` with a ``GPUTarget``,
then ``ptxas`` on the PTX) and ``ptxas_usage`` (registers and spills from ptxas's
report). :mod:`kernels.machine_code.compile_check` runs the matrix of shipped configs
through it. Sets ``TRITON_INTERPRET=0`` before importing :mod:`kernels`.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from kernels.flash import backward, backward_fused, forward, forward_tma, tiles  # noqa: E402

#: fwd-tma / fwd-tma-ws: kernels.flash.forward_tma's forward (TMA descriptors; the
#: second with its key loop warp-specialised), shipped for sm_90 only.
#: dkdv-shield / dq-shield: the causal backward's second launch (SHIELD=True), which
#: recomputes the gradients only when an input holds NaN/inf. bwd-fused:
#: kernels.flash.backward_fused (flash_attention(..., deterministic=False)).
KERNELS = (
    "fwd",
    "preprocess",
    "dkdv",
    "dq",
    "dkdv-shield",
    "dq-shield",
    "bwd-fused",
    "fwd-tma",
    "fwd-tma-ws",
)
TMA_KERNELS = ("fwd-tma", "fwd-tma-ws")
KERNEL_FNS = {
    "fwd": "_attn_fwd",
    "preprocess": "_attn_bwd_preprocess",
    "dkdv": "_attn_bwd_dkdv",
    "dq": "_attn_bwd_dq",
    "dkdv-shield": "_attn_bwd_dkdv",
    "dq-shield": "_attn_bwd_dq",
    "bwd-fused": "_attn_bwd_fused",
    "fwd-tma": "_attn_fwd_tma",
    "fwd-tma-ws": "_attn_fwd_tma",
}
HEAD_DIMS = (64, 80, 128, 256)  # 80: the padded, masked head-dim path (BLOCK_D = 128)
DTYPES = common.FLOAT_DTYPES  # fp16, bf16, fp32
DTYPE_NAMES = {dt: name for name, dt in common.DTYPE_NAMES.items()}  # dtype -> "fp16"
PTXAS = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@dataclasses.dataclass
class Result:
    kernel: str
    target: str
    head_dim: int
    dtype: str
    causal: bool
    config: tuple[int, int, int, int]  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    n_ctx: int = 4096
    shared: int | None = None
    shared_limit: int = 0
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    wgmma: bool | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        # the shield launches (NaN/inf inputs only) may spill: reported, not refused
        return (
            self.error is None
            and self.shared is not None
            and self.shared <= self.shared_limit
            and (
                self.kernel.endswith("-shield")
                or not (self.spill_stores or self.spill_loads)
            )
        )


def _jit_function(kernel) -> triton.runtime.JITFunction:
    """Unwrap @autotune / @heuristics down to the @jit function."""
    while not isinstance(kernel, triton.runtime.JITFunction):
        kernel = kernel.fn
    return kernel


def _launch_values(
    kernel: str,
    dtype,
    head_dim: int,
    n_ctx: int,
    causal: bool,
    config: tuple[int, int, int, int],
) -> dict:
    """Argument values of a representative launch, keyed by parameter name."""
    H = 16  # heads; the batch size only enters through stride_qz
    bd = tiles.block_d(head_dim)
    # only its dtype and (16-byte aligned) address matter
    t = torch.empty(16, dtype=dtype)
    lse = torch.empty(16, dtype=torch.float32)
    # contiguous (B, H, N, d)
    strides = (H * n_ctx * head_dim, n_ctx * head_dim, head_dim, 1)
    bm, bn = config[0], config[1]
    values = {
        "sm_scale": 0.125,
        "H": H,
        "H_KV": H,
        "GROUP": 1,
        "N_Q": n_ctx,
        "N_K": n_ctx,
        "HEAD_DIM": head_dim,
        "IS_CAUSAL": causal,
        "BLOCK_D": bd,
        "UPCAST": False,
        "DOT_PRECISION": common.dot_precision(dtype),
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "EVEN_M": n_ctx % bm == 0,
        "EVEN_N": n_ctx % bn == 0,
        "EVEN_D": head_dim == bd,
        "N_BUCKET": tiles.n_bucket(n_ctx),
        "NEG_SCALE": False,
        "SHIELD": kernel.endswith("-shield"),
    }
    for name in ("Q", "K", "V", "Out", "O", "DO", "DQ", "DK", "DV"):
        values[name] = t
    values["LSE2"] = values["Delta"] = lse
    values["V_BAD"] = values["BAD"] = torch.zeros(1, dtype=torch.int32)
    for prefix in ("q", "k", "v", "o", "do", "dq", "dk"):
        row = "m" if prefix in ("q", "o", "do", "dq") else "n"
        for suffix, s in zip(("z", "h", row, "d"), strides):
            values[f"stride_{prefix}{suffix}"] = s
    if kernel in TMA_KERNELS:  # host-side descriptors: dtype and block shape matter
        from triton.tools.tensor_descriptor import TensorDescriptor

        for name, rows in (
            ("desc_q", bm),
            ("desc_o", bm),
            ("desc_k", bn),
            ("desc_v", bn),
        ):
            values[name] = TensorDescriptor(
                t, [1, H, n_ctx, head_dim], list(strides), [1, 1, rows, bd]
            )
        values["WARP_SPECIALIZE"] = ws = kernel == "fwd-tma-ws"
        values["WS_LOOP"] = ws and not causal and n_ctx % bn == 0
    return values


def _compile_values(
    fn, values: dict, cap: tuple[int, int], num_warps: int, num_stages: int
):
    """``triton.compile`` of jit function ``fn`` with argument ``values`` keyed by
    name."""
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


def _compile(
    kernel: str,
    target: str,
    head_dim: int,
    dtype,
    causal: bool,
    config: tuple[int, int, int, int],
    n_ctx: int,
):
    """``triton.compile`` of one kernel/config for one target, as a launch would
    specialise."""
    cap = tiles.ARCHS[target][0]
    module = {"fwd": forward, "bwd-fused": backward_fused}.get(kernel) or (
        forward_tma if kernel in TMA_KERNELS else backward
    )
    fn = _jit_function(getattr(module, KERNEL_FNS[kernel]))
    values = _launch_values(kernel, dtype, head_dim, n_ctx, causal, config)
    values["UPCAST"] = common.upcast_on(dtype, cap)
    if kernel == "bwd-fused":
        values["DQ"] = torch.empty(16, dtype=torch.float32)  # the fp32 dQ accumulator
    return _compile_values(fn, values, cap, config[2], config[3])


def compile_one(
    kernel: str,
    target: str,
    head_dim: int,
    dtype,
    causal: bool,
    config: tuple[int, int, int, int],
    n_ctx: int = 4096,
) -> Result:
    """Compile one kernel/config for one target; measure shared memory, registers,
    spills."""
    limit = tiles.ARCHS[target][1]
    res = Result(
        kernel,
        target,
        head_dim,
        DTYPE_NAMES[dtype],
        causal,
        config,
        n_ctx,
        shared_limit=limit,
    )
    t0 = time.perf_counter()
    try:
        compiled = _compile(kernel, target, head_dim, dtype, causal, config, n_ctx)
        ptx = compiled.asm["ptx"]
        res.shared = int(compiled.metadata.shared)
        res.registers, res.spill_stores, res.spill_loads = ptxas_usage(ptx)
        res.wgmma = (
            "wgmma" in ptx if target == "sm90" and kernel != "preprocess" else None
        )
    except Exception as e:  # noqa: BLE001 - any compile failure is a reported result
        res.error = error_text(e)
    res.seconds = time.perf_counter() - t0
    return res


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
# What the family checks (flex_check, sparse_check) share: a row per compilation, its
# table cells, the command line and the --report files.
# ---------------------------------------------------------------------------------

STATIC_DIR = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "static"
REPORT_TARGETS = ("sm90", "sm80")


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
    that wrote it (``python -m kernels.machine_code.<check>``) and ``note``."""
    return {
        "target": target,
        "triton": triton.__version__,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "command": (
            f"python -m kernels.machine_code.{check} --report --target {target}"
        ),
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
