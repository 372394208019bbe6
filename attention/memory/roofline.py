"""Block sizes, FLOP counts and the roofline model: published GPU peaks turn element
counts into time ESTIMATES. Nothing here measures anything."""

from __future__ import annotations

import dataclasses
import math

from ..checks import check_real
from .sim import cdiv, check_count


def fa1_block_sizes(M: int, d: int) -> tuple[int, int]:
    """FlashAttention-1's rule (Algorithm 1, line 1): Bc = ceil(M/4d),
    Br = min(ceil(M/4d), d).

    Returns (Br, Bc). The rule sizes Q_i, K_j, V_j, O_i to about M/4 each; its constants
    are the paper's big-O ones, so with S_ij and l, m the tiles can exceed M slightly
    (``sram_need`` says by how much).
    """
    M, d = check_count("M", M), check_count("d", d)
    bc = cdiv(M, 4 * d)
    return min(bc, d), bc


def matmul_flops(algorithm: str, N: int, d: int, N_k: int | None = None) -> int:
    """Matrix-multiply FLOPs (2 per multiply-add) of one head,
    without the causal saving.

    Forward: S = Q K^T and O = P V, 4 N N_k d. Backward from a stored P: dV, dP, dQ, dK,
    8 N N_k d. FlashAttention-2's backward recomputes S first: 10 N N_k d. The
    two-kernel backward computes S and dP = dO V^T in both kernels: 14 N N_k d.
    """
    N, d = check_count("N", N), check_count("d", d)
    n_k = N if N_k is None else check_count("N_k", N_k)
    per = {
        "standard": 4,
        "flash1": 4,
        "flash2": 4,
        "standard_bwd": 8,
        "flash2_bwd": 10,
        "flash2_bwd_split": 14,
    }
    if algorithm not in per:
        raise ValueError(
            f"no FLOP count for algorithm {algorithm!r}; known: {sorted(per)}"
        )
    return per[algorithm] * N * n_k * d


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """Published peak numbers of one GPU (dense fp16/bf16 tensor-core FLOP/s, HBM).

    ``sram_tbps`` is DERIVED, not published: SMs x 128 bytes/clock (shared memory) x the
    boost clock at which the tensor-core peak is quoted. For the A100 it gives 19.5
    TB/s, the 19 TB/s of the FlashAttention paper's Figure 1.
    """

    name: str
    peak_tflops: float  # dense fp16/bf16 tensor cores, TFLOP/s
    hbm_tbps: float  # HBM bandwidth, TB/s
    hbm_gb: float  # HBM capacity, GB
    sms: int
    smem_kb_per_sm: int  # max shared memory per SM (KB)
    l1_smem_kb_per_sm: int  # combined L1 cache + shared memory per SM (KB)
    boost_ghz: float
    source: str
    l2_mb: float = 0.0  # L2 cache, MB (datasheet)

    @property
    def sram_mib(self) -> float:
        """On-chip L1 + shared memory over all SMs,
        in MiB (the paper's "SRAM, 20 MB")."""
        return self.sms * self.l1_smem_kb_per_sm / 1024

    @property
    def sram_tbps(self) -> float:
        return self.sms * 128 * self.boost_ghz * 1e9 / 1e12

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which the roofline model says
        a kernel is compute-bound."""
        return self.peak_tflops / self.hbm_tbps


#: Spec-sheet numbers (SXM parts). A100: 40 GB HBM2 as in the FlashAttention paper.
#: Cited in the book as nvidia2020a100, nvidia2022h100, nvidia2024h200, nvidia2018t4,
#: nvidia2023l4 (references.bib).
GPUS: dict[str, GPUSpec] = {
    "A100": GPUSpec(
        "A100 SXM4 40GB",
        312.0,
        1.555,
        40,
        108,
        164,
        192,
        1.41,
        "NVIDIA A100 datasheet; Ampere tuning guide (192 KB L1/shared per "
        "SM, up to 164 KB shared; 40 MB L2)",
        l2_mb=40.0,
    ),
    "H100": GPUSpec(
        "H100 SXM5 80GB",
        989.4,
        3.35,
        80,
        132,
        228,
        256,
        1.83,
        "NVIDIA H100 datasheet; Hopper tuning guide (256 KB L1/shared per "
        "SM, up to 228 KB shared; 50 MB L2)",
        l2_mb=50.0,
    ),
    "H200": GPUSpec(
        "H200 SXM 141GB",
        989.4,
        4.8,
        141,
        132,
        228,
        256,
        1.83,
        "NVIDIA H200 datasheet (the H100's GH100 compute with HBM3e; 50 MB L2)",
        l2_mb=50.0,
    ),
    # Chapter 5's inference GPUs. "hbm_tbps" is their DRAM bandwidth (GDDR6 on both).
    "T4": GPUSpec(
        "T4 16GB",
        65.0,
        0.320,
        16,
        40,
        64,
        96,
        1.59,
        "NVIDIA T4 datasheet (65 TFLOPS fp16 mixed precision, 320 GB/s "
        "GDDR6, 16 GB); Turing whitepaper (40 SMs, 96 KB L1/shared per SM, "
        "up to 64 KB shared; 4 MB L2; 1.59 GHz boost)",
        l2_mb=4.0,
    ),
    "L4": GPUSpec(
        "L4 24GB",
        121.0,
        0.300,
        24,
        58,
        100,
        128,
        2.04,
        "NVIDIA L4 datasheet (242 TFLOPS fp16 tensor with sparsity, so "
        "121 dense; 300 GB/s GDDR6, 24 GB); Ada tuning guide and "
        "whitepaper (58 SMs, 128 KB L1/shared per SM, up to 100 KB "
        "shared; 48 MB L2; 2.04 GHz boost)",
        l2_mb=48.0,
    ),
}


def roofline_ms(flops: float, hbm_bytes: float, gpu: str | GPUSpec) -> float:
    """ESTIMATED milliseconds from the roofline model: max(FLOPs/peak, bytes/bandwidth).

    An estimate, not a measurement: it assumes the kernel reaches the GPU's peak
    tensor-core throughput or its peak HBM bandwidth, whichever binds.
    """
    flops, hbm_bytes = _work("flops", flops), _work("hbm_bytes", hbm_bytes)
    if isinstance(gpu, str):
        if gpu not in GPUS:
            raise ValueError(
                f"gpu must be one of {sorted(GPUS)} or a GPUSpec, got {gpu!r}"
            )
        spec = GPUS[gpu]
    elif isinstance(gpu, GPUSpec):
        spec = gpu
    else:
        raise TypeError(
            f"gpu must be a name in {sorted(GPUS)} or a GPUSpec, got "
            f"{type(gpu).__name__}"
        )
    return (
        max(flops / (spec.peak_tflops * 1e12), hbm_bytes / (spec.hbm_tbps * 1e12)) * 1e3
    )


def arithmetic_intensity(flops: float, hbm_bytes: float) -> float:
    """FLOPs per byte of HBM traffic (inf when nothing moves)."""
    flops, hbm_bytes = _work("flops", flops), _work("hbm_bytes", hbm_bytes)
    return flops / hbm_bytes if hbm_bytes else math.inf


def _work(name: str, value) -> float:
    """An amount of work (FLOPs or bytes): a finite real number >= 0."""
    return check_real(name, value, 0)
