"""The flash family's timing: suite "flash" of ``make bench`` (the Triton kernel against
naive PyTorch and every SDPA backend), the implementations chapters time
(``attention_impls``: the kernel, naive attention, SDPA or each SDPA backend on its own)
and the BLOCK_M x BLOCK_N sweep (``time_tiles``).

``check()`` holds ``kernels.flash.flash_attention`` (forward and backward; causal and
not; fp16 and bf16; GQA, ragged and cross lengths) to the fp64 ``reference_attention``
on this GPU, with the flash-attn tolerance rule: error at most twice PyTorch's own error
in the same dtype (naive attention vs fp64) plus a small atol.

``check_paths()`` holds every forward path of
``kernels.flash.forward_tma.FORWARD_PATHS`` (``pointer``, the default; ``tma``;
``tma-ws``) to the same reference, forward only (o and lse, fp16 and bf16, the check
shapes plus a causal case with a NaN hidden in V); a path that raises is recorded with
its error. ``benchmarks/run.py`` writes the result
to the flash suite's ``forward_paths`` (per path: ``ok``, ``max_err``, ``error``,
``checks``), so the default can be changed on evidence; a failed non-default path
is recorded, it does not stop the suite.

``goal(timer, dry, forward_paths)`` times the goal shapes, which
``benchmarks/run.py`` runs right after every suite's correctness checks and before any
sweep, with no deadline (the budget never cuts them): bf16, d = 128, N = 16384
(B = 1, H = 16), forward non-causal, forward causal, then forward + backward non-causal
and causal (``GOAL_CASES``, in that order), then the forward cases again for each
non-default forward path that passed ``check_paths`` (impl ``triton-tma``,
``triton-tma-ws``; ``PATH_GOAL_CASES``).

``run(quick, deadline, timer, dry)`` then records the sweeps, in order of importance (so
a deadline cuts the least important part):

1. forward, fp16: d in {64, 128}, N in {512, ..., 16k}, causal and not;
2. forward + backward, fp16, same shapes;
3. peak memory of one forward against N up to 64k, fp16, d = 64: Triton vs naive
   (naive's out-of-memory is recorded as error "OOM");
4. a BLOCK_M x BLOCK_N sweep of the forward kernel (fp16, d = 64, N = 4096; tiles in the
   shape dict, autotuner bypassed with ``kernels.flash.forward_with_tiles``);
5. and 6. the same as 1 and 2 in bf16.

Implementations: ``triton`` (kernels.flash), ``naive`` (kernels.naive: S and P in HBM),
and ``sdpa-cudnn`` / ``sdpa-flash`` / ``sdpa-efficient`` / ``sdpa-math`` (torch SDPA
pinned to one backend with ``torch.nn.attention.sdpa_kernel``; a backend that refuses
this GPU/shape is recorded with error "unsupported" and its reasons in ``detail``; the
results file's summary names the best SDPA backend that ran). Shapes keep B * N = 16k
tokens and H * d = 2048 so every point does similar work per token. Timing goes through
``kernels.timing.bench`` (``time_attention``, ``time_tiles``), the chapters' path too;
FLOPs are ``kernels.timing.bench.attention_flops``. With ``dry`` (``benchmarks/run.py
--dry-run`` on a CPU) every step runs at tiny shapes under the Triton interpreter with
the run's fake timer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import torch

from kernels import runtime
from kernels.flash import flash_attention, forward_tma
from kernels.naive import naive_attention, reference_attention
from kernels.timing import bench
from kernels.timing.bench import attention_flops, measure, random_qkv, torch_dtype
from kernels.timing.records import MIN_REPS, Record, clip_text

SUITE = "flash"
TOKENS = 16 * 1024  # B * N per shape
WIDTH = 2048  # H * d
SEQ_LENS = [512, 1024, 2048, 4096, 8192, 16384]
MEM_SEQ_LENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
HEAD_DIMS = [64, 128]


def _qkv(B, H, H_kv, N_q, N_k, d, dtype, grad=False, seed=0):
    return bench.random_qkv(
        B,
        H,
        N_q,
        d,
        H_kv=H_kv,
        N_k=N_k,
        dtype=dtype,
        device=runtime.DEVICE,
        seed=seed,
        grad=grad,
    )


def _max_err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


# (name, B, H, H_kv, N_q, N_k, d, causal)
CHECK_SHAPES = [
    ("mha-1024-d64", 2, 4, 4, 1024, 1024, 64, False),
    ("mha-1024-d128-causal", 2, 4, 4, 1024, 1024, 128, True),
    ("gqa-ragged-d64-causal", 1, 8, 2, 777, 777, 64, True),
    ("cross-d128", 1, 4, 4, 300, 1000, 128, False),
    ("masked-rows-d96-causal", 1, 2, 2, 500, 200, 96, True),
]


#: The dry run's checks: the same rule at shapes the Triton interpreter runs in
#: a second.
DRY_CHECK_SHAPES = [
    ("mha-32-d16", 1, 2, 2, 32, 32, 16, False),
    ("gqa-ragged-d16-causal", 1, 4, 2, 23, 23, 16, True),
]


#: Set by ``check``: did the fused backward (``flash_attention(...,
#: deterministic=False)``) pass every check on this GPU? ``goal`` times it only then.
FUSED_BACKWARD_OK: bool | None = None


def check(dry: bool = False) -> list[dict]:
    """Kernel vs fp64 reference on this GPU, forward and backward, fp16 and bf16; the
    backward both ways: the default two-kernel one, and the fused one with atomics
    (names ``fused-bwd-...``; ``FUSED_BACKWARD_OK`` says whether all of them passed)."""
    global FUSED_BACKWARD_OK
    out = []
    for det, dtype in [
        (det, dt) for det in (True, False) for dt in (torch.float16, torch.bfloat16)
    ]:
        prefix = "" if det else "fused-bwd-"
        atol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
        for name, B, H, H_kv, N_q, N_k, d, causal in (
            DRY_CHECK_SHAPES if dry else CHECK_SHAPES
        ):
            q, k, v = _qkv(B, H, H_kv, N_q, N_k, d, dtype, grad=True)
            o = flash_attention(q, k, v, causal=causal, deterministic=det)
            do = torch.randn_like(o)
            grads = torch.autograd.grad(o, (q, k, v), do)
            q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
            o_ref, _ = reference_attention(q64, k64, v64, causal)
            grads_ref = torch.autograd.grad(o_ref, (q64, k64, v64), do.double())
            qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
            o_pt = naive_attention(qs, ks, vs, causal)
            grads_pt = torch.autograd.grad(o_pt, (qs, ks, vs), do)
            for what, x, ref, pt in [("o", o, o_ref, o_pt)] + [
                (g, x, r, p)
                for g, x, r, p in zip(("dq", "dk", "dv"), grads, grads_ref, grads_pt)
            ]:
                err = _max_err(x, ref)
                tol = 2 * _max_err(pt, ref) + atol
                out.append(
                    {
                        "name": f"{prefix}{name}-{str(dtype)[6:]}-{what}",
                        "max_err": err,
                        "tol": tol,
                        "ok": bool(math.isfinite(err) and err <= tol),
                    }
                )
            del q, k, v, o, grads, q64, k64, v64, o_ref, grads_ref
            del qs, ks, vs, o_pt, grads_pt
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    FUSED_BACKWARD_OK = all(c["ok"] for c in out if c["name"].startswith("fused-bwd"))
    return out


#: A causal case whose last value row holds NaN (and an inf two rows before): hidden
#: from every earlier query, it must reach only the rows that see it (V_BAD path).
NAN_V_SHAPE = ("hidden-nan-v-causal", 1, 4, 2, 300, 300, 64, True)
DRY_NAN_V_SHAPE = ("hidden-nan-v-causal", 1, 2, 1, 20, 20, 16, True)


def _path_forward(path: str):
    return lambda q, k, v, causal: forward_tma.forward(q, k, v, causal, path=path)


def check_paths(dry: bool = False) -> dict:
    """Every forward path against the fp64 reference on this GPU: ``{"default": ...,
    "paths": {path: {"ok", "max_err", "error", "checks": [...]}}}``."""
    from kernels.common import LN2

    shapes = DRY_CHECK_SHAPES if dry else CHECK_SHAPES
    out = {"default": forward_tma.DEFAULT_FORWARD_PATH, "paths": {}}
    for path in forward_tma.FORWARD_PATHS:
        fwd, checks, error = _path_forward(path), [], None
        try:
            for dtype in (torch.float16, torch.bfloat16):
                atol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
                for name, B, H, H_kv, N_q, N_k, d, causal in shapes:
                    q, k, v = _qkv(B, H, H_kv, N_q, N_k, d, dtype)
                    o, lse2 = fwd(q, k, v, causal)
                    o_ref, lse_ref = reference_attention(
                        q.double(), k.double(), v.double(), causal
                    )
                    o_pt = naive_attention(q, k, v, causal)
                    tol = 2 * _max_err(o_pt, o_ref) + atol
                    vis = torch.isfinite(lse_ref)
                    empty_ok = bool(
                        torch.equal(torch.isneginf(lse2), ~vis) and (o[~vis] == 0).all()
                    )
                    for what, err, t in (
                        ("o", _max_err(o, o_ref), tol),
                        ("lse", _max_err(lse2[vis] * LN2, lse_ref[vis]), 1e-3),
                    ):
                        checks.append(
                            {
                                "name": f"{path}-{name}-{str(dtype)[6:]}-{what}",
                                "max_err": err,
                                "tol": t,
                                "ok": bool(
                                    math.isfinite(err) and err <= t and empty_ok
                                ),
                            }
                        )
                name, B, H, H_kv, N_q, N_k, d, causal = (
                    DRY_NAN_V_SHAPE if dry else NAN_V_SHAPE
                )
                q, k, v = _qkv(B, H, H_kv, N_q, N_k, d, dtype)
                # the tolerance from the same inputs without the NaN/inf (naive
                # attention lets a hidden NaN reach every row: 0 * NaN)
                tol = (
                    2
                    * _max_err(
                        naive_attention(q, k, v, causal),
                        reference_attention(q.double(), k.double(), v.double(), causal)[
                            0
                        ],
                    )
                    + atol
                )
                v[..., N_k - 1, 3] = float("nan")
                v[..., N_k - 3, 5] = float("inf")
                o, _ = fwd(q, k, v, causal)
                o_ref, _ = reference_attention(
                    q.double(), k.double(), v.double(), causal
                )
                fin = torch.isfinite(o_ref)
                same = bool(
                    torch.equal(torch.isnan(o), torch.isnan(o_ref))
                    and torch.equal(torch.isfinite(o), fin)
                )
                err = _max_err(o[fin], o_ref[fin]) if same else float("inf")
                checks.append(
                    {
                        "name": f"{path}-{name}-{str(dtype)[6:]}-o",
                        "max_err": err,
                        "tol": tol,
                        "ok": bool(same and err <= tol),
                    }
                )
        except Exception as e:  # noqa: BLE001 - a path that fails is the evidence
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            error = f"{type(e).__name__}: {first}"[:500]
        errs = [c["max_err"] for c in checks]
        out["paths"][path] = {
            "ok": bool(error is None and checks and all(c["ok"] for c in checks)),
            "max_err": max(errs) if errs else None,
            "error": error,
            "checks": checks,
        }
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def passed_paths(forward_paths: dict | None) -> list[str]:
    """The non-default forward paths that passed ``check_paths`` (timed at the goal)."""
    if not forward_paths:
        return []
    return [
        p
        for p, r in forward_paths["paths"].items()
        if r["ok"] and p != forward_paths["default"]
    ]


#: The goal shapes: what the book's headline numbers are, timed before any sweep.
GOAL = {"dtype": "bfloat16", "d": 128, "N": 16384, "B": 1, "H": 16}
#: The dry run's stand-in (same dtype and cases, a shape the interpreter runs at once).
DRY_GOAL = {"dtype": "bfloat16", "d": 16, "N": 32, "B": 1, "H": 2}
#: (mode, causal) in the order they are timed.
GOAL_CASES = [("fwd", False), ("fwd", True), ("fwd+bwd", False), ("fwd+bwd", True)]
#: The goal cases timed again for each non-default forward path that passed its check
#: (forward only: the TMA paths have no backward of their own).
PATH_GOAL_CASES = [("fwd", False), ("fwd", True)]
#: Timed reps per case (warm-up calls are not timed).
TIMING = {"warmup": 10, "rep": 50}
QUICK_TIMING = {"warmup": 5, "rep": MIN_REPS}


def goal(
    timer=None, dry: bool = False, forward_paths: dict | None = None
) -> list[Record]:
    """The goal shapes, every implementation (Triton, naive, each SDPA backend), no
    deadline: ``GOAL_CASES`` in order at ``GOAL`` (``DRY_GOAL`` with ``dry``); then
    ``PATH_GOAL_CASES`` for each forward path that passed (``check_paths``'s result),
    as impl ``triton-<path>``, and the fused backward's fwd+bwd cases (impl
    ``triton-fused-bwd``) if ``check`` passed it in this process."""
    g = DRY_GOAL if dry else GOAL
    impls = attention_impls(sdpa_backends=True)
    records: list[Record] = []
    for mode, causal in GOAL_CASES:
        records += bench.time_attention(
            [g["N"]],
            impls,
            d=g["d"],
            causal=causal,
            dtype=g["dtype"],
            modes=(mode,),
            batch=g["B"],
            heads=g["H"],
            suite=SUITE,
            timer=timer,
            log=_log,
            stage="goal",
            device=runtime.DEVICE,
            **TIMING,
        )
    if FUSED_BACKWARD_OK:  # the fused backward, only if check() passed it here
        fused = {
            "triton-fused-bwd": lambda q, k, v, causal: flash_attention(
                q, k, v, causal=causal, deterministic=False
            )
        }
        for causal in (False, True):
            records += bench.time_attention(
                [g["N"]],
                fused,
                d=g["d"],
                causal=causal,
                dtype=g["dtype"],
                modes=("fwd+bwd",),
                batch=g["B"],
                heads=g["H"],
                suite=SUITE,
                timer=timer,
                log=_log,
                stage="goal",
                device=runtime.DEVICE,
                **TIMING,
            )
    paths = {f"triton-{p}": _path_forward(p) for p in passed_paths(forward_paths)}
    for mode, causal in PATH_GOAL_CASES if paths else []:
        records += bench.time_attention(
            [g["N"]],
            paths,
            d=g["d"],
            causal=causal,
            dtype=g["dtype"],
            modes=(mode,),
            batch=g["B"],
            heads=g["H"],
            suite=SUITE,
            timer=timer,
            log=_log,
            stage="goal",
            device=runtime.DEVICE,
            **TIMING,
        )
    return records


#: The BLOCK_M x BLOCK_N sweep: one forward shape, every tile pair (chapter 2 draws it).
TILE_SWEEP_SHAPE = {"B": 4, "H": 32, "N_q": 4096, "N_k": 4096, "d": 64, "causal": False}
TILE_SWEEP_BLOCKS = [16, 32, 64, 128]


def _log(r: Record) -> None:
    s = r.shape
    if r.error:
        what = r.error + (f" ({r.detail[:200]})" if r.detail else "")
    else:
        st = r.stats or {}
        band = (
            f" [p20 {st['p20_ms']:.3f}, p80 {st['p80_ms']:.3f}, n={st['reps']}]"
            if st.get("p20_ms") is not None
            else ""
        )
        what = (
            f"{r.ms:.3f} ms{band} {r.tflops:.1f} TFLOP/s "
            f"{(r.peak_mem_bytes or 0) / 2**20:.0f} MiB"
            + (" HOST-SYNC" if st.get("host_sync") else "")
        )
    print(
        f"[flash] {r.stage or ''} {r.op} {r.mode:<7} {r.dtype:<8} {r.impl:<14} "
        f"B={s['B']} H={s['H']} "
        f"N={s['N_q']} d={s['d']} causal={s['causal']}"
        + (f" tiles={s['BLOCK_M']}x{s['BLOCK_N']}" if "BLOCK_M" in s else "")
        + f": {what}",
        flush=True,
    )


def run(quick: bool, deadline: float, timer=None, dry: bool = False) -> list[Record]:
    """Time every implementation; stop cleanly at ``deadline``, keeping the records."""
    seq_lens = [16, 32] if dry else [1024, 4096] if quick else SEQ_LENS
    head_dims = [16] if dry else [64] if quick else HEAD_DIMS
    mem_lens = [16, 32] if dry else [4096, 16384] if quick else MEM_SEQ_LENS
    tokens, width = (64, 32) if dry else (TOKENS, WIDTH)
    timing = QUICK_TIMING if quick or dry else TIMING
    impls = attention_impls(sdpa_backends=True)
    common = {
        "suite": SUITE,
        "deadline": deadline,
        "log": _log,
        "timer": timer,
        "stage": "sweep",
        "device": runtime.DEVICE,
    }

    def speed(dtype, mode):
        return [
            r
            for d in head_dims
            for r in bench.time_attention(
                seq_lens,
                impls,
                d=d,
                causal=(False, True),
                dtype=dtype,
                modes=(mode,),
                tokens=tokens,
                width=width,
                **common,
                **timing,
            )
        ]

    def peak_memory():  # one fp16 forward, B = 1, H = 16, d = 64: Triton vs naive
        return bench.time_attention(
            mem_lens,
            {k: impls[k] for k in ("triton", "naive")},
            d=16 if dry else 64,
            batch=1,
            heads=2 if dry else 16,
            op="attention-memory",
            **common,
            warmup=1,
            rep=MIN_REPS,
        )

    def tiles():
        sh = (
            {"B": 1, "H": 2, "N_q": 32, "d": 16, "causal": False}
            if dry
            else TILE_SWEEP_SHAPE
        )
        return time_tiles(
            [16, 32] if dry else TILE_SWEEP_BLOCKS,
            batch=sh["B"],
            heads=sh["H"],
            N=sh["N_q"],
            d=sh["d"],
            causal=sh["causal"],
            **common,
            **timing,
        )

    plan = [
        lambda: speed("float16", "fwd"),
        lambda: speed("float16", "fwd+bwd"),
        peak_memory,
        tiles,
        lambda: speed("bfloat16", "fwd"),
        lambda: speed("bfloat16", "fwd+bwd"),
    ]
    records: list[Record] = []
    for step in plan:
        records.extend(step())
        if time.monotonic() > deadline:
            print(f"[flash] deadline reached: {len(records)} records kept", flush=True)
            break
    return records


#: Each PyTorch SDPA backend timed on its own: impl name -> ``SDPBackend`` member.
SDPA_BACKENDS = {
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-math": "MATH",
}


def attention_impls(sdpa_backends: bool = False) -> dict[str, Callable]:
    """The implementations chapters and suites time, each ``fn(q, k, v, causal)``.

    "triton" (``kernels.flash``), "naive" (``kernels.naive``: S and P in HBM) and
    PyTorch's scaled_dot_product_attention: one "sdpa" (PyTorch picks the backend) or,
    with ``sdpa_backends``, "sdpa-cudnn", "sdpa-flash", "sdpa-efficient" and
    "sdpa-math", each pinned to one backend with ``torch.nn.attention.sdpa_kernel``
    (those this torch has).
    """
    import torch.nn.functional as F

    from kernels.flash import flash_attention
    from kernels.naive import naive_attention

    impls = {
        "triton": lambda q, k, v, causal: flash_attention(q, k, v, causal=causal),
        "naive": lambda q, k, v, causal: naive_attention(q, k, v, causal=causal),
    }
    if not sdpa_backends:
        impls["sdpa"] = lambda q, k, v, causal: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal
        )
        return impls
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def pinned(backend):
        def attn(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return attn

    for name, attr in SDPA_BACKENDS.items():
        if hasattr(SDPBackend, attr):
            impls[name] = pinned(getattr(SDPBackend, attr))
    return impls


def time_tiles(
    blocks: Iterable[int] = (16, 32, 64, 128),
    *,
    batch: int = 4,
    heads: int = 32,
    N: int = 4096,
    d: int = 64,
    causal: bool = False,
    dtype="float16",
    num_stages: int = 2,
    suite: str = "live",
    device=None,
    seed: int = 0,
    timer: Callable[..., dict] | None = None,
    deadline: float | None = None,
    log: Callable[[Record], None] | None = None,
    stage: str | None = None,
    **timing,
) -> list[Record]:
    """Forward time of ``kernels.flash`` at each BLOCK_M x BLOCK_N, autotuner bypassed.

    One Record per tile pair, the tiles and warps in its shape (8 warps from 128 x 64
    up, else 4). A tile that does not fit this GPU is a result: its error names why.
    """
    from kernels.flash import forward_with_tiles

    _, dt_name = torch_dtype(dtype)
    q, k, v = random_qkv(batch, heads, N, d, dtype=dtype, device=device, seed=seed)
    shape = {"B": batch, "H": heads, "N_q": N, "N_k": N, "d": d, "causal": causal}
    records: list[Record] = []
    blocks = list(blocks)
    for bm in blocks:
        for bn in blocks:
            if deadline is not None and time.monotonic() > deadline:
                return records
            warps = 8 if bm * bn >= 128 * 64 else 4
            rec = Record(
                suite,
                "attention",
                "triton",
                "fwd",
                dt_name,
                {
                    **shape,
                    "BLOCK_M": bm,
                    "BLOCK_N": bn,
                    "num_warps": warps,
                    "num_stages": num_stages,
                },
                stage=stage,
            )
            fn = lambda bm=bm, bn=bn, w=warps: forward_with_tiles(  # noqa: E731
                q, k, v, bm, bn, causal=causal, num_warps=w, num_stages=num_stages
            )
            try:
                measure(
                    rec,
                    fn,
                    timer=timer,
                    flops=attention_flops(batch, heads, N, N, d, causal),
                    **timing,
                )
            except Exception as e:  # noqa: BLE001 - a tile that does not fit is a result
                rec.error, rec.detail = type(e).__name__, clip_text(str(e))
            records.append(rec)
            if log is not None:
                log(rec)
    return records
