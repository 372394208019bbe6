"""Compile the decode kernels' shipped tiles for sm_75, sm_80, sm_89 and sm_90 on a CPU.

    python -m kernels.decode.compile_check            # the full matrix below
    python -m kernels.decode.compile_check --quick    # the heaviest of each kind
    python -m kernels.decode.compile_check --report   # hot-loop SASS, sm90 + sm80

Each case is ``triton.compile`` of ``_decode_split`` (or ``_decode_merge``) for
``GPUTarget("cuda", cc, 32)`` with the tile ``kernels.decode.tiles.tiles`` ships for
that target, head dim, dtype and query-row block, specialised as a launch is (the
helpers of ``kernels.flash.compile_check``: ``native_specialize_impl`` on
representative arguments, ``ptxas -v`` with Triton's flags). Reported: registers per
thread, spill bytes, shared memory against the target's limit. The full matrix: head
dims 64, 80 (padded to 128), 128, 256; fp16, bf16, fp32 (CUDA-core dots); BLOCK_M 16
(MHA/GQA at N_q = 1) and 64 (G x N_q >= 64; 32 for CUDA-core dots at d = 256); cache
layouts ``paged16`` (16-token pages: BLOCK_N = 16), ``paged256`` (the table's BLOCK_N,
one block-table entry per tile), ``paged48`` (a page size that is not a power of two:
one entry per key) and ``contiguous``; causal; the split (partial) store. Both
plans add issue 29's paths (``feature_cases``, path column): a 4k window, softcap +
ALiBi + sinks under it, an fp8 cache (Triton's conversion on sm_89/90, the byte
decode on sm_75/80), MLA at 576 = 512 + 64 and its merge (not on sm_75, where
``mla_with_kvcache`` is refused: its tiles exceed 64 KB of shared memory). Exits 1 on a
spill, a shared-memory overflow or a compile failure. Runs with ``TRITON_INTERPRET=0``
(re-executes itself when kernels was imported under the interpreter).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from kernels import runtime

runtime.compile_ahead("kernels.decode.compile_check", __name__)

import torch  # noqa: E402
import triton  # noqa: E402

from kernels.common import DTYPE_NAMES, dot_precision, upcast_on  # noqa: E402
from kernels.decode import blocks as M  # noqa: E402
from kernels.decode import forward as F  # noqa: E402
from kernels.decode import tiles as K  # noqa: E402
from kernels.decode.api import MERGE_BLOCK_D  # noqa: E402
from kernels.machine_code.compiler import (  # noqa: E402
    compile_values,
    jit_function,
    ptxas_usage,
)

TARGETS = ("sm75", "sm80", "sm89", "sm90")
HEAD_DIMS = (64, 80, 128, 256)
DTYPES = DTYPE_NAMES  # fp16, bf16, fp32
LAYOUTS = ("paged16", "paged256", "paged48", "contiguous")
BLOCK_MS = (16, 64)
#: A launch the cases stand for: 8 KV heads, B = 8; N_q x group = BLOCK_M rows.
H_KV, B = 8, 8


@dataclasses.dataclass
class Case:
    kernel: str  # "split" or "merge"
    target: str
    head_dim: int
    dtype: str
    block_m: int = 16
    layout: str = "paged256"
    causal: bool = True
    variant: str = "base"  # base, window, extras, fp8, mla (see VARIANTS)
    tile: tuple = ()  # (BLOCK_N, num_warps, num_stages)
    shared: int | None = None
    shared_limit: int = 0
    registers: int | None = None
    spills: int | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.shared is not None
            and self.shared <= self.shared_limit
            and self.spills == 0
        )

    def row(self) -> str:
        tile = "x".join(map(str, self.tile[:1])) + (
            f" w{self.tile[1]} s{self.tile[2]}" if self.tile else ""
        )
        smem = "-" if self.shared is None else f"{self.shared / 1024:.1f}"
        return (
            f"{self.kernel:<6} {self.target:<5} {self.head_dim:>4} "
            f"{self.variant:<6} "
            f"{self.dtype:<5} {self.block_m:>3} {self.layout:<10} "
            f"{tile:<10} {smem:>6}/{self.shared_limit // 1024:<4} "
            f"{self.registers if self.registers is not None else '-':>4} "
            f"{self.spills if self.spills is not None else '-':>5} "
            f"{self.seconds:5.1f}s {'ok' if self.ok else self.error or 'FAIL'}"
        )


HEADER = (
    f"{'kernel':<6} {'arch':<5} {'d':>4} {'path':<6} {'dtype':<5} {'BM':>3} "
    f"{'layout':<10} {'BN w s':<10} {'smem KB/lim':>11} {'regs':>4} {'spill':>5} "
    f"{'time':>6}"
)


def _page(layout: str) -> int | None:
    return {"paged16": 16, "paged64": 64, "paged256": 256, "paged48": 48}.get(layout)


#: The kernel's constexpr paths the check compiles: the plain call; a sliding window
#: (its masked front tiles: three tile loops); softcap + ALiBi + sinks under a window;
#: an fp8 cache (native conversion on sm_89/90, the byte decode on sm_75/80); MLA at
#: DeepSeek-V3's 576 = 512 + 64 (BLOCK_D 512 shared by K and V, BLOCK_R 64).
VARIANTS = ("base", "window", "extras", "fp8", "mla")
MLA_DIM, MLA_DIM_V = 576, 512


def _split_values(case: Case, cap) -> tuple[dict, int, int]:
    dt = DTYPES[case.dtype]
    mla, fp8 = case.variant == "mla", case.variant == "fp8"
    d, bm = case.head_dim, case.block_m
    dv = MLA_DIM_V if mla else d
    page = _page(case.layout)
    tr = case.variant == "extras"
    bn = K.block_n(cap, dv, bm, dt, page, mla, fp8, tr)
    _, warps, stages = K.tiles(cap, dv, bm, dt, mla, fp8, tr)
    case.tile = (bn, warps, stages)
    h_kv = 1 if mla else H_KV
    group = (16 if mla else 4) if bm == 16 else 8
    n_q = 1 if bm == 16 else 8
    h_q = h_kv * group
    native = cap >= (8, 9)
    t = torch.empty(16, dtype=dt)
    kt = t
    if fp8:
        kt = torch.empty(16, dtype=torch.float8_e4m3fn if native else torch.uint8)
    f32 = torch.empty(16, dtype=torch.float32)
    i32 = torch.empty(16, dtype=torch.int32)
    rows = page or 32768  # tokens per page (or per sequence, contiguous)
    kv = (rows * h_kv * d, h_kv * d, d, 1)
    windowed = case.variant in ("window", "extras")
    vals = {
        "Q": t,
        "K": kt,
        "V": kt,
        "BT": i32,
        "SEQLENS": i32,
        "Out": f32,
        "LSE": f32,
        "ALIBI": f32,
        "SINKS": f32,
        "KDESC": f32,
        "VDESC": f32,
        "sm_scale": 0.125,
        "softcap": 30.0,
        "win_left": 4096 if windowed else -1,
        "win_right": 0 if case.causal else -1,
        "stride_ab": h_q,
        "stride_dsb": h_kv,
        "N_Q": n_q,
        "GROUP": group,
        "HEAD_DIM": dv,
        "ROPE_DIM": d - dv,
        "N_SPLITS": 4,
        "M_BLOCKS": max(1, group * n_q // bm),
        "PAGED": page is not None,
        "PAGE_SIZE": page or 0,
        "HAS_LEFT": windowed,
        "HAS_RIGHT": case.causal,
        "HAS_SOFTCAP": case.variant == "extras",
        "HAS_ALIBI": case.variant == "extras",
        "HAS_SINKS": case.variant == "extras",
        "FP8": fp8,
        "FP8_NATIVE": native,
        "SHARED_KV": mla,
        "SPLIT": True,
        "UPCAST": upcast_on(dt, cap),
        "DOT_PRECISION": dot_precision(dt),
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_D": K.block_d(dv),
        "BLOCK_R": K.block_r(d - dv) if mla else 0,
        "EVEN_D": dv == K.block_d(dv),
        "stride_btb": 512,
    }
    for pfx, st in (("q", (n_q * h_q * d, h_q * d, d, 1)), ("k", kv), ("v", kv)):
        names = ("b", "t", "h", "d") if pfx == "q" else ("p", "n", "h", "d")
        vals.update({f"stride_{pfx}{n}": s for n, s in zip(names, st)})
    # the fp32 partials (B, H_q, N_q, 4 splits, d_v)
    vals.update(
        stride_ob=h_q * n_q * 4 * dv,
        stride_ot=4 * dv,
        stride_oh=n_q * 4 * dv,
        stride_od=1,
        stride_lb=h_q * n_q * 4,
        stride_lh=n_q * 4,
        stride_lt=4,
    )
    return vals, warps, stages


def _merge_values(case: Case) -> tuple[dict, int, int]:
    d = MLA_DIM_V if case.variant == "mla" else case.head_dim
    bd = min(K.block_d(d), MERGE_BLOCK_D)
    t = torch.empty(16, dtype=DTYPES[case.dtype])
    f32 = torch.empty(16, dtype=torch.float32)
    h_q = 32
    case.tile = (0, 4 if bd >= 128 else 2, 1)
    return (
        {
            "OP": f32,
            "LSEP": f32,
            "Out": t,
            "LSE": f32,
            "N_Q": 1,
            "H_Q": h_q,
            "N_SPLITS": 16,
            "HEAD_DIM": d,
            "stride_ob": h_q * d,
            "stride_ot": h_q * d,
            "stride_oh": d,
            "stride_od": 1,
            "stride_lb": h_q,
            "stride_lh": 1,
            "stride_lt": 1,
            "BLOCK_S": 64,
            "BLOCK_D": bd,
        },
        case.tile[1],
        1,
    )


def compile_case(case: Case):
    """Compile one case; fill its registers, spills and shared memory. Returns the
    compiled kernel (None on failure)."""
    cap, limit = K.ARCHS[case.target]
    case.shared_limit = limit
    t0 = time.perf_counter()
    compiled = None
    try:
        if case.kernel == "split":
            vals, w, s = _split_values(case, cap)
            fn = jit_function(F._decode_split)
        else:
            vals, w, s = _merge_values(case)
            fn = jit_function(M._decode_merge)
        compiled = compile_values(fn, vals, cap, w, s)
        case.shared = int(compiled.metadata.shared)
        case.registers, st, ld = ptxas_usage(compiled.asm["ptx"])
        case.spills = st + ld
    except Exception as e:  # noqa: BLE001 - a compile failure is a reported result
        first = str(e).strip().splitlines()[0] if str(e) else ""
        case.error = f"{type(e).__name__}: {first}"
    case.seconds = time.perf_counter() - t0
    return compiled


def plan(quick: bool, targets=TARGETS, dims=None, dtypes=None) -> list[Case]:
    """The cases. Full: every head dim, dtype, query-row block and cache layout, the
    merge, and the new paths at d = 128 and 256. ``quick`` (what ``make test``
    compiles: the heaviest of each kind): d = 128, the split kernel in fp16 at
    query-row blocks 16 and 64 on the table's tile (256-token pages), bf16 at 64 on
    the contiguous cache (its per-row offsets), the merge, and one case of each new
    path."""
    if quick and dims is None and dtypes is None:
        return [c for t in targets for c in _quick_cases(t)]
    dims = dims or ((64, 128) if quick else HEAD_DIMS)
    layouts = ("paged256", "contiguous") if quick else LAYOUTS
    dtypes = dtypes or (("fp16", "bf16") if quick else tuple(DTYPES))
    cases = []
    for t in targets:
        for d in dims:
            for dt in dtypes:
                if not K.supported(K.ARCHS[t][0], d, DTYPES[dt]):
                    continue
                most = K.max_block_m(K.ARCHS[t][0], d, DTYPES[dt])
                for bm in sorted({min(bm, most) for bm in BLOCK_MS}):
                    cases += [Case("split", t, d, dt, bm, lay) for lay in layouts]
                cases.append(Case("merge", t, d, dt, 0, "-"))
        cases += feature_cases(t, quick)
    return cases


def _quick_cases(t: str) -> list[Case]:
    most = K.max_block_m(K.ARCHS[t][0], 128, torch.float16)
    bms = sorted({min(bm, most) for bm in BLOCK_MS})
    # fp16 at both query-row blocks; bf16 (the same tile, one more conversion) on the
    # contiguous cache at the larger block, the heavier of its two layouts.
    cases = [Case("split", t, 128, "fp16", bm, "paged256") for bm in bms]
    cases += [
        Case("split", t, 128, "bf16", bms[-1], "contiguous"),
        Case("merge", t, 128, "bf16", 0, "-"),
    ]
    feats = feature_cases(t, quick=True)
    top = {("window", bms[-1]), ("extras", bms[-1]), ("fp8", bms[-1])}
    return cases + [
        c
        for c in feats
        if (c.variant, c.block_m) in top
        and c.layout == "paged256"
        or (c.variant == "mla" and c.layout != "contiguous")
    ]


def feature_cases(target: str, quick: bool = True) -> list[Case]:
    """The new paths on ``target``: a 4k window (BLOCK_M 16 and 64), softcap + ALiBi +
    sinks under it, an fp8 cache under fp16 and bf16 queries, MLA at 576/512 (paged
    64-token pages as FlashMLA's, and contiguous) and its merge; d = 128 (and 256 in
    the full matrix) for the others."""
    cases = []
    for d in (128,) if quick else (128, 256):
        most = K.max_block_m(K.ARCHS[target][0], d, torch.float16)
        top = min(64, most)
        cases += [
            Case("split", target, d, "fp16", 16, "paged256", variant="window"),
            Case("split", target, d, "fp16", top, "paged256", variant="window"),
            Case("split", target, d, "bf16", 16, "contiguous", variant="extras"),
            Case("split", target, d, "bf16", top, "paged256", variant="extras"),
            Case("split", target, d, "fp16", 16, "paged256", variant="fp8"),
            Case("split", target, d, "bf16", 16, "contiguous", variant="fp8"),
            Case("split", target, d, "fp16", top, "paged256", variant="fp8"),
        ]
    if not K.mla_supported(K.ARCHS[target][0]):  # sm_75: refused by the call
        return cases
    bm = K.max_block_m(K.ARCHS[target][0], MLA_DIM_V, torch.bfloat16, True)
    cases += [
        Case("split", target, MLA_DIM, "bf16", bm, lay, variant="mla")
        for lay in ("paged64", "contiguous")
    ]
    cases.append(Case("merge", target, MLA_DIM, "bf16", 0, "-", variant="mla"))
    return cases


def machine_code_report(
    target: str, head_dim: int = 128, dtype: str = "bf16", layout: str = "paged256"
) -> list[dict]:
    """Hot-loop SASS counts of the split kernel (BLOCK_M 16 and 64) on ``target``,
    with the K/V bytes its loop loads per iteration (BLOCK_N x d x 2 tensors x the
    element size: counted from the tile, not measured)."""
    from kernels.machine_code import sass

    out = []
    for bm in BLOCK_MS:
        case = Case("split", target, head_dim, dtype, bm, layout)
        c = compile_case(case)
        if c is None:
            out.append({"case": dataclasses.asdict(case)})
            continue
        rep = sass.report(c.asm["cubin"])
        size = DTYPES[dtype].itemsize
        out.append(
            {
                "case": dataclasses.asdict(case),
                **rep,
                "kv_bytes_per_iteration": 2 * case.tile[0] * head_dim * size,
            }
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--target", action="append", choices=TARGETS)
    ap.add_argument("--head-dim", action="append", type=int, choices=HEAD_DIMS)
    ap.add_argument("--dtype", action="append", choices=list(DTYPES))
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args(argv)
    if runtime.INTERPRET:
        print("needs TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    if args.report:
        import json

        from kernels.machine_code.compiler import STATIC_DIR

        STATIC_DIR.mkdir(parents=True, exist_ok=True)
        for t in args.target or ["sm90", "sm80"]:
            rows = machine_code_report(t)
            for r in rows:
                c, hl = r["case"], r.get("hot_loop") or {}
                print(
                    f"{t} BM={c['block_m']} tile={c['tile']} regs={c['registers']} "
                    f"kv_bytes/iter={r.get('kv_bytes_per_iteration')} hot loop: "
                    f"{hl}",
                    flush=True,
                )
            path = STATIC_DIR / f"decode-{t}.json"
            path.write_text(
                json.dumps(
                    {
                        "target": t,
                        "triton": triton.__version__,
                        "date": time.strftime("%Y-%m-%d"),
                        "command": (
                            "python -m kernels.decode.compile_check "
                            f"--report --target {t}"
                        ),
                        "note": (
                            "instruction counts of the compiled machine code, not time"
                        ),
                        "kernels": rows,
                    },
                    indent=1,
                )
                + "\n"
            )
            print(f"# written to {path}", flush=True)
        return 0
    cases = plan(args.quick, tuple(args.target or TARGETS), args.head_dim, args.dtype)
    print(f"# triton {triton.__version__}, {len(cases)} compilations", flush=True)
    print(HEADER, flush=True)
    for c in cases:
        compile_case(c)
        print(c.row(), flush=True)
    bad = [c for c in cases if not c.ok]
    print(f"# {len(cases) - len(bad)}/{len(cases)} ok", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
