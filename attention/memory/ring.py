"""The communication model of context parallelism: the ring's (and DeepSpeed-Ulysses')
bytes and FLOPs per device per step, simulated and in closed form, and time ESTIMATES
from published link and GPU peaks.

The ring (``attention.ring``): at step t device r computes its queries against the K/V
shard it holds and, for t < P-1, sends that shard to r+1 while it receives the next
from r-1. The simulator walks the schedule with message buffers, counts every element
sent and received, and counts visible (query, key) pairs from the tokens' positions;
the closed forms give the same integers from shard sizes and interval arithmetic, for
every N, P, heads, head dim, layout and mask (the tests check equality, not closeness).

Counts (B sequences, H query heads, H_kv key/value heads, head dim d):

* elements moved per step: 2 * n_src * H_kv * d * B (K and V of the held shard of
  n_src tokens); P-1 transfers per ring;
* FLOPs per block: 4 * pairs * H * d * B (S = Q K^T and O = P V, 2 FLOPs per
  multiply-add), where ``pairs`` counts the visible (query, key) pairs *exactly*: a
  causal diagonal block of n tokens has n(n+1)/2, not n^2/2. A kernel computes whole
  tiles, so it does slightly more; the model counts the work the mask leaves.

The backward ring (``simulate_ring_backward`` / ``ring_backward_closed_form``), as
``kernels.ring`` runs it: K/V travel again in the input dtype (steps t < P-1) and each
shard's fp32 dK/dV accumulator travels one step behind them at every step, the last
hop bringing it home; FLOPs are 10 * pairs * H * d * B (FlashAttention-2's five
matmuls), so per step the backward moves (b + 4) / b times the forward's bytes (3x in
bf16) for 2.5x its FLOPs, and ``pass_threshold(..., backward=True)`` is 1.2x the
forward's in bf16. All-gather context parallelism (``allgather_closed_form``): one
all-gather of K/V (the ring's volume, at once) and one reduce-scatter of dK/dV.

DeepSpeed-Ulysses (Jacobs et al. 2023) splits heads instead: an all-to-all turns
(N/P tokens, all heads) into (all N tokens, H/P heads) for q, k, v, each device runs
ordinary attention, and a second all-to-all returns o. It needs H and H_kv divisible by
P (so P <= H_kv): ``ulysses_*`` raise otherwise.

Times are ESTIMATES: FLOPs / the GPU's dense tensor-core peak and bytes / the link's
per-direction peak (a device sends and receives at once over a full-duplex link). Real
kernels reach perhaps 50-75% of peak compute and links 70-90% of their rate; the
model's thresholds move by those factors.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from attention import ring as _ring
from attention.checks import check_bool, check_int

from .roofline import GPUS, GPUSpec
from .sim import cdiv


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """A point-to-point link per GPU: peak bandwidth in ONE direction (GB/s = 1e9 B/s).

    Vendors quote NVLink and PCIe as the sum of both directions; a ring step sends one
    shard and receives one at the same time, so the per-direction rate is what binds.
    """

    name: str
    gbps: float  # GB/s per direction
    source: str  # a references.bib key


#: Data-sheet link rates per GPU, per direction.
LINKS: dict[str, LinkSpec] = {
    "NVLink 4": LinkSpec(
        "NVLink 4 (H100 SXM), 450 GB/s per direction", 450.0, "nvidia2022h100"
    ),  # 900 GB/s total, both directions
    "NVLink 3": LinkSpec(
        "NVLink 3 (A100 SXM), 300 GB/s per direction", 300.0, "nvidia2020a100"
    ),  # 600 GB/s total, both directions
    "PCIe 5 x16": LinkSpec(
        "PCIe 5.0 x16, 64 GB/s per direction", 64.0, "nvidia2022h100"
    ),  # 128 GB/s total, both directions
    "InfiniBand NDR": LinkSpec(
        "InfiniBand NDR, 400 Gb/s = 50 GB/s per direction", 50.0, "nvidia2022connectx7"
    ),  # one NIC per GPU
}

#: Dense TF32 tensor-core peaks (TFLOP/s) for float32 inputs: half the data sheets'
#: "with sparsity" figures (A100 312, H100/H200 SXM 989). fp16/bf16 use GPUSpec.
TF32_TFLOPS = {"A100": 156.0, "H100": 494.7, "H200": 494.7}

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _check_dims(N, P, H, H_kv, d, B):
    N, P = check_int("N", N, 1), check_int("P", P, 1)
    H, d, B = check_int("H", H, 1), check_int("d", d, 1), check_int("B", B, 1)
    H_kv = H if H_kv is None else check_int("H_kv", H_kv, 1)
    if H % H_kv:
        raise ValueError(f"H_kv={H_kv} must divide H={H} (GQA)")
    return N, P, H, H_kv, d, B


@dataclasses.dataclass(frozen=True)
class RingCounts:
    """Per step t (rows) and device r (columns): visible pairs, FLOPs, elements sent
    and received. ``shard_len[r]``: tokens device r holds."""

    pairs: np.ndarray  # (P, P) int64
    flops: np.ndarray  # (P, P)
    sent: np.ndarray  # (P, P) elements
    received: np.ndarray  # (P, P) elements
    shard_len: np.ndarray  # (P,)

    def __eq__(self, other):
        return all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name))
            for f in dataclasses.fields(self)
        )

    __hash__ = None


def simulate_ring(
    N: int,
    P: int,
    H: int,
    d: int,
    H_kv: int | None = None,
    B: int = 1,
    causal: bool = False,
    layout: str = "contiguous",
) -> RingCounts:
    """Walk the ring: each device's buffer holds one K/V shard; every step computes on
    it, then passes it to the next device. Pairs are counted from positions, so sizes
    beyond ``attention.ring.check_walk``'s budget are refused: ``ring_closed_form``
    gives the same counts at once."""
    N, P, H, H_kv, d, B = _check_dims(N, P, H, H_kv, d, B)
    _ring.check_walk(
        "simulate_ring",
        N,
        P,
        "attention.memory.ring.ring_closed_form(N, P, H, d, H_kv, B, causal, layout)",
    )
    causal = check_bool("causal", causal)
    pos = [_ring.shard_positions(N, r, P, layout) for r in range(P)]
    buffer = list(range(P))  # buffer[r]: whose shard device r holds now
    pairs, sent, received = (np.zeros((P, P), dtype=np.int64) for _ in range(3))
    for t in range(P):
        for r in range(P):
            pairs[t, r] = _ring.block_pairs(N, P, layout, r, buffer[r], causal)
        if t == P - 1:
            break  # the last shard is used, not passed on
        incoming = [None] * P
        for r in range(P):  # r sends its shard (K and V) to r+1
            elements = 2 * len(pos[buffer[r]]) * H_kv * d * B
            sent[t, r] += elements
            received[t, (r + 1) % P] += elements
            incoming[(r + 1) % P] = buffer[r]
        buffer = incoming
    flops = 4 * pairs * H * d * B
    return RingCounts(
        pairs, flops, sent, received, np.array([len(p) for p in pos], dtype=np.int64)
    )


# ---------------------------------------------------------------------------------
# Closed forms.
# ---------------------------------------------------------------------------------


def _tri(n):
    """n (n + 1) / 2 for n > 0, else 0 (vectorised, exact in int64)."""
    n = np.maximum(np.asarray(n, dtype=np.int64), 0)
    return n * (n + 1) // 2


def interval_pairs(a0, a1, b0, b1):
    """Pairs (i, j), a0 <= i < a1, b0 <= j < b1, with j <= i:
    T(a1-b0) - T(a0-b0) - T(a1-b1) + T(a0-b1), T(n) = n(n+1)/2 (0 for n <= 0)."""
    return _tri(a1 - b0) - _tri(a0 - b0) - _tri(a1 - b1) + _tri(a0 - b1)


def _stripe_len(N, P, r):  # tokens r, r + P, ... below N
    return cdiv(N - r, P) if N > r else 0


def shard_lengths(N: int, P: int, layout: str) -> np.ndarray:
    """Tokens per device, from chunk sizes alone."""
    layout = _ring.check_layout(layout)
    if layout == "striped":
        return np.array([_stripe_len(N, P, r) for r in range(P)], dtype=np.int64)
    n = 2 * P if layout == "zigzag" else P
    size = np.array([e - s for s, e in _ring.chunk_bounds(N, n)], dtype=np.int64)
    return size if layout == "contiguous" else size[:P] + size[::-1][:P]


def pairs_closed_form(
    N: int, P: int, layout: str, q_rank: int, k_rank: int, causal: bool
) -> int:
    """``attention.ring.block_pairs`` from interval arithmetic (no positions)."""
    spans = _spans(N, P, layout, causal, {q_rank, k_rank})
    return _pairs(shard_lengths(N, P, layout), spans, layout, q_rank, k_rank, causal)


def _spans(N: int, P: int, layout: str, causal: bool, ranks) -> dict | None:
    """The ranks' position intervals where the causal count needs them."""
    skip = not causal or _ring.check_layout(layout) == "striped"
    return None if skip else {r: _ring.shard_intervals(N, r, P, layout) for r in ranks}


def _pairs(n, spans, layout: str, q_rank: int, k_rank: int, causal: bool) -> int:
    """``pairs_closed_form`` from the shard lengths ``n`` and ``_spans``."""
    if not causal:
        return int(n[q_rank] * n[k_rank])
    if layout == "striped":
        # query r_q + P a sees keys r_k + P b with b <= a - [r_k > r_q]
        e = 1 if k_rank <= q_rank else 0
        nq, nk = int(n[q_rank]), int(n[k_rank])
        # sum_{a < nq} clip(a + e, 0, nk) = sum max(a + e, 0) - sum max(a + e - nk, 0)
        return int(
            _tri(nq - 1 + e) - _tri(e - 1) - _tri(nq - 1 + e - nk) + _tri(e - nk - 1)
        )
    qi, ki = spans[q_rank], spans[k_rank]
    return int(sum(interval_pairs(a0, a1, b0, b1) for a0, a1 in qi for b0, b1 in ki))


@functools.lru_cache(maxsize=256)
def pairs_matrix(N: int, P: int, layout: str, causal: bool) -> np.ndarray:
    """pairs[t, r] = ``pairs_closed_form`` of device r against the shard it holds at
    step t (cached; read-only). Equals ``attention.ring.work_matrix``."""
    holds = _ring.ring_holds(P)
    n, spans = shard_lengths(N, P, layout), _spans(N, P, layout, causal, range(P))
    out = np.array(
        [
            [_pairs(n, spans, layout, r, int(holds[t, r]), causal) for r in range(P)]
            for t in range(P)
        ],
        dtype=np.int64,
    )
    out.flags.writeable = False
    return out


def ring_closed_form(
    N: int,
    P: int,
    H: int,
    d: int,
    H_kv: int | None = None,
    B: int = 1,
    causal: bool = False,
    layout: str = "contiguous",
) -> RingCounts:
    """``simulate_ring``'s counts from formulas: device r holds shard (r - t) mod P at
    step t, moves 2 n_src H_kv d B elements at each t < P-1, and computes 4 pairs H d B
    FLOPs."""
    N, P, H, H_kv, d, B = _check_dims(N, P, H, H_kv, d, B)
    causal = check_bool("causal", causal)
    n = shard_lengths(N, P, layout)
    holds = _ring.ring_holds(P)  # (t, r) -> source shard
    pairs = pairs_matrix(N, P, layout, causal)
    moving = (np.arange(P) < P - 1)[:, None]  # steps with a transfer
    sent = np.where(moving, 2 * n[holds] * H_kv * d * B, 0)
    received = np.where(moving, 2 * n[np.roll(holds, -1, axis=0)] * H_kv * d * B, 0)
    return RingCounts(pairs, 4 * pairs * H * d * B, sent, received, n)


# ---------------------------------------------------------------------------------
# DeepSpeed-Ulysses: two all-to-alls, heads split instead of the sequence.
# ---------------------------------------------------------------------------------


def _check_ulysses(P, H, H_kv):
    if H % P or H_kv % P:
        raise ValueError(
            f"DeepSpeed-Ulysses splits heads over devices: P={P} must "
            f"divide H={H} and H_kv={H_kv} (P <= heads)"
        )


def simulate_ulysses(
    N: int, P: int, H: int, d: int, H_kv: int | None = None, B: int = 1
) -> dict:
    """Walk the two all-to-alls message by message: device r sends each other device s
    its n_r tokens of s's heads of q, k, v; after attention, device s returns to r the
    n_r tokens of its heads of o. Returns per-device arrays sent, received (elements)
    and flops (non-causal). P * P messages: above ``attention.ring.MAX_WALK_BLOCKS``
    it refuses, naming ``ulysses_closed_form``."""
    N, P, H, H_kv, d, B = _check_dims(N, P, H, H_kv, d, B)
    _check_ulysses(P, H, H_kv)
    if P * P > _ring.MAX_WALK_BLOCKS:
        raise ValueError(
            f"simulate_ulysses(P={P}) would walk P*P = {P * P:,} messages, more than "
            f"its budget of {_ring.MAX_WALK_BLOCKS:,}: attention.memory.ring."
            "ulysses_closed_form(N, P, H, d, H_kv, B) gives the same counts at once"
        )
    n = [len(_ring.shard_positions(N, r, P, "contiguous")) for r in range(P)]
    sent, received = np.zeros(P, dtype=np.int64), np.zeros(P, dtype=np.int64)
    for r in range(P):
        for s in range(P):
            if s == r:
                continue
            fwd = n[r] * (H + 2 * H_kv) // P * d * B  # q, k, v of s's heads
            back = n[r] * H // P * d * B  # o of s's heads, back to r
            sent[r] += fwd
            received[s] += fwd
            sent[s] += back
            received[r] += back
    flops = np.full(P, 4 * N * N * (H // P) * d * B, dtype=np.int64)
    return {"sent": sent, "received": received, "flops": flops}


def ulysses_closed_form(
    N: int, P: int, H: int, d: int, H_kv: int | None = None, B: int = 1
) -> dict:
    """sent_r = (P-1) n_r (H + 2 H_kv) d B / P + (N - n_r) H d B / P;
    received_r = (N - n_r) (H + 2 H_kv) d B / P + (P-1) n_r H d B / P."""
    N, P, H, H_kv, d, B = _check_dims(N, P, H, H_kv, d, B)
    _check_ulysses(P, H, H_kv)
    n = shard_lengths(N, P, "contiguous")
    qkv, o = (H + 2 * H_kv) // P * d * B, H // P * d * B
    return {
        "sent": (P - 1) * n * qkv + (N - n) * o,
        "received": (N - n) * qkv + (P - 1) * n * o,
        "flops": np.full(P, 4 * N * N * (H // P) * d * B, dtype=np.int64),
    }


# ---------------------------------------------------------------------------------
# Time ESTIMATES at peak.
# ---------------------------------------------------------------------------------


def _one_of(name: str, value, options) -> str:
    """``value`` if it is one of ``options``; ValueError naming ``name``, the value and
    the options otherwise."""
    options = list(options)
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def peak_flops(gpu: str | GPUSpec, dtype: str) -> float:
    """FLOP/s at the tensor-core peak for ``dtype`` (TF32 for float32, known for the
    GPUs in ``TF32_TFLOPS``)."""
    dtype = _one_of("dtype", dtype, DTYPE_BYTES)
    if isinstance(gpu, GPUSpec):
        spec, key = gpu, gpu.name.split()[0]
    else:
        key = _one_of("gpu", gpu, GPUS)
        spec = GPUS[key]
    if dtype == "float32":
        if key not in TF32_TFLOPS:
            raise ValueError(
                f"gpu {key!r} has no TF32 peak here: for dtype='float32', gpu must be "
                f"one of {list(TF32_TFLOPS)}"
            )
        return TF32_TFLOPS[key] * 1e12
    return spec.peak_tflops * 1e12


def ring_times(counts: RingCounts, gpu: str, link: str, dtype: str) -> dict:
    """ESTIMATED seconds per step: compute (busiest device at peak), transfer (largest
    message at the link's per-direction peak), the step with overlap (double-buffered:
    max of the two) and without (their sum); totals and the hidden fraction."""
    F = peak_flops(gpu, dtype)
    bw = LINKS[_one_of("link", link, LINKS)].gbps * 1e9
    b = DTYPE_BYTES[dtype]
    compute = counts.flops.max(axis=1) / F  # (P,)
    transfer = counts.received.max(axis=1) * b / bw  # (P,)
    overlapped = np.maximum(compute, transfer)
    exposed = float((overlapped - compute).sum())
    total_x = float(transfer.sum())
    return {
        "compute_s": compute,
        "transfer_s": transfer,
        "step_s": overlapped,
        "total_s": float(overlapped.sum()),
        "serial_s": float((compute + transfer).sum()),
        "exposed_s": exposed,
        "hidden": 1.0 - exposed / total_x if total_x else 1.0,
    }


def overlap_threshold(
    gpu: str, link: str, dtype: str, H: int, H_kv: int | None = None, work: float = 1.0
) -> float:
    """Shard length n* (tokens) above which one step's compute outlasts its transfer:
    ``work`` * 4 n^2 H d / F = 2 n H_kv d b / BW, so n* = H_kv b F / (2 H BW work).

    ``work``: the fraction of the n x n block that is visible (1 non-causal; about 1/2
    for a causal zig-zag or striped step). d cancels: both sides grow with it. An
    ESTIMATE at peak rates. ``work`` must be a real number in (0, 1].
    """
    H = check_int("H", H, 1)
    H_kv = H if H_kv is None else check_int("H_kv", H_kv, 1)
    if isinstance(work, bool) or not isinstance(work, (int, float, np.number)):
        raise TypeError(f"work must be a real number, got {type(work).__name__}")
    if not 0 < work <= 1:
        raise ValueError(
            f"work must be the visible fraction of a block, in (0, 1], got {work!r}"
        )
    F = peak_flops(gpu, dtype)
    bw = LINKS[_one_of("link", link, LINKS)].gbps * 1e9
    return H_kv * DTYPE_BYTES[dtype] * F / (2 * H * bw * float(work))


def memory_per_device(
    N: int,
    P: int,
    H: int,
    d: int,
    H_kv: int | None = None,
    B: int = 1,
    dtype: str = "bfloat16",
    scheme: str = "ring",
) -> int:
    """ESTIMATED bytes of one attention layer's tensors on the busiest device.

    ring: Q and O shards, the own K/V shard (kept for the backward) and two K/V buffers
    (one computed on, one being received), plus the fp32 lse. ulysses: the local q, k,
    v, o shards plus q, k, v, o for all N tokens of H/P heads, plus the fp32 lse.
    Weights, other layers' activations and framework workspace are not counted. The
    shard is the largest contiguous one (zig-zag shards differ from it by at most one
    token).
    """
    N, P, H, H_kv, d, B = _check_dims(N, P, H, H_kv, d, B)
    b = DTYPE_BYTES[_one_of("dtype", dtype, DTYPE_BYTES)]
    scheme = _one_of("scheme", scheme, ("ring", "ulysses"))
    n = int(shard_lengths(N, P, "contiguous").max())
    if scheme == "ring":
        return B * n * d * (2 * H + 6 * H_kv) * b + B * H * n * 4
    _check_ulysses(P, H, H_kv)
    local = B * n * d * (2 * H + 2 * H_kv) * b
    return local + B * N * d * (2 * H + 2 * H_kv) // P * b + B * (H // P) * N * 4


# ---------------------------------------------------------------------------------
# The backward's communication, and all-gather context parallelism.
# ---------------------------------------------------------------------------------

#: FLOPs per visible (query, key) pair, per head and per unit of head dim: the forward
#: does two matmuls (S = Q K^T, O = P V), the FlashAttention-2 backward five (S again,
#: dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q), 2 FLOPs per multiply-add each.
FLOPS_PER_PAIR = {"forward": 4, "backward": 10}

#: Bytes of the fp32 dK/dV accumulators ``kernels.ring`` passes in the backward.
ACC_BYTES = 4


@dataclasses.dataclass(frozen=True)
class BackwardCounts:
    """The backward ring per step t (rows) and device r (columns): visible pairs,
    FLOPs (``FLOPS_PER_PAIR["backward"]``), K/V elements received (input dtype, steps
    t < P-1, as the forward) and dK/dV accumulator elements received (fp32, every step:
    at step P-1 the last hop brings each device its own shard's finished dK/dV)."""

    pairs: np.ndarray  # (P, P) int64
    flops: np.ndarray  # (P, P)
    kv_received: np.ndarray  # (P, P) elements in the input dtype
    dkv_received: np.ndarray  # (P, P) fp32 elements
    shard_len: np.ndarray  # (P,)

    __eq__ = RingCounts.__eq__
    __hash__ = None


def simulate_ring_backward(
    N: int,
    P: int,
    H: int,
    d: int,
    H_kv: int | None = None,
    B: int = 1,
    causal: bool = False,
    layout: str = "contiguous",
) -> BackwardCounts:
    """Walk the backward ring as ``kernels.ring.ring_backward`` does: a K/V buffer and
    a dK/dV accumulator per device. At step t device r computes with the shard in its
    K/V buffer, adds into that shard's accumulator (fresh at t = 0, else received) and
    passes the accumulator to r+1; K/V move on for t < P-1. After step P-1 every
    accumulator has visited all P devices and lands on its owner, which the walk
    checks. Size-guarded as ``simulate_ring``."""
    N, P, H, H_kv, d, B = _check_dims(N, P, H, H_kv, d, B)
    _ring.check_walk(
        "simulate_ring_backward",
        N,
        P,
        "attention.memory.ring.ring_backward_closed_form(N, P, H, d, H_kv, B, causal, "
        "layout)",
    )
    causal = check_bool("causal", causal)
    n = [len(_ring.shard_positions(N, r, P, layout)) for r in range(P)]
    kv = list(range(P))  # kv[r]: whose K/V shard device r holds
    acc = [None] * P  # acc[r]: (shard, devices visited) of the accumulator r holds
    pairs, kv_rx, dkv_rx = (np.zeros((P, P), dtype=np.int64) for _ in range(3))
    for t in range(P):
        for r in range(P):
            pairs[t, r] = _ring.block_pairs(N, P, layout, r, kv[r], causal)
            shard, visited = (kv[r], 0) if acc[r] is None else acc[r]
            if shard != kv[r]:
                raise AssertionError("dK/dV accumulator out of step with its K/V")
            acc[r] = (shard, visited + 1)
        moved = [None] * P  # every accumulator moves on, the last step included
        for r in range(P):
            moved[(r + 1) % P] = acc[r]
            dkv_rx[t, (r + 1) % P] += 2 * n[acc[r][0]] * H_kv * d * B
        acc = moved
        if t < P - 1:
            kv = [kv[(r - 1) % P] for r in range(P)]
            for r in range(P):
                kv_rx[t, r] += 2 * n[kv[r]] * H_kv * d * B
    if any(a != (r, P) for r, a in enumerate(acc)):
        raise AssertionError(f"dK/dV did not end home after P steps: {acc}")
    flops = FLOPS_PER_PAIR["backward"] * pairs * H * d * B
    return BackwardCounts(pairs, flops, kv_rx, dkv_rx, np.array(n, dtype=np.int64))


def ring_backward_closed_form(
    N: int,
    P: int,
    H: int,
    d: int,
    H_kv: int | None = None,
    B: int = 1,
    causal: bool = False,
    layout: str = "contiguous",
) -> BackwardCounts:
    """``simulate_ring_backward``'s counts from formulas: at step t device r receives
    the K/V of shard (r - t - 1) mod P (t < P-1) and the accumulator of the same shard
    (every t; at t = P-1 that is shard r itself, finished)."""
    N, P, H, H_kv, d, B = _check_dims(N, P, H, H_kv, d, B)
    causal = check_bool("causal", causal)
    n = shard_lengths(N, P, layout)
    nxt = np.roll(_ring.ring_holds(P), -1, axis=0)  # (t, r): shard arriving for t+1
    moving = (np.arange(P) < P - 1)[:, None]
    pairs = pairs_matrix(N, P, layout, causal)
    per_token = 2 * H_kv * d * B
    return BackwardCounts(
        pairs,
        FLOPS_PER_PAIR["backward"] * pairs * H * d * B,
        np.where(moving, n[nxt] * per_token, 0),
        n[nxt] * per_token,
        n,
    )


def step_bytes(dtype: str, backward: bool = False) -> int:
    """Bytes one ring step moves per K/V element: the input dtype's in the forward,
    plus the fp32 dK/dV accumulator's in the backward (``kernels.ring``)."""
    b = DTYPE_BYTES[_one_of("dtype", dtype, DTYPE_BYTES)]
    return b + ACC_BYTES if check_bool("backward", backward) else b


def pass_threshold(
    gpu: str,
    link: str,
    dtype: str,
    H: int,
    H_kv: int | None = None,
    work: float = 1.0,
    backward: bool = False,
) -> float:
    """``overlap_threshold`` for the forward or the backward ring: a step of shard
    length n computes FLOPS_PER_PAIR * work * n^2 H d and moves 2 n H_kv d
    ``step_bytes`` bytes, so n* = 2 H_kv step_bytes F / (FLOPS_PER_PAIR H BW work).
    The backward moves (b + 4) / b times the forward's bytes for 10 / 4 of its FLOPs.
    An ESTIMATE at peak rates."""
    forward = overlap_threshold(gpu, link, dtype, H, H_kv, work)
    if not check_bool("backward", backward):
        return forward
    ratio_bytes = step_bytes(dtype, True) / step_bytes(dtype)
    ratio_flops = FLOPS_PER_PAIR["backward"] / FLOPS_PER_PAIR["forward"]
    return forward * ratio_bytes / ratio_flops


def allgather_closed_form(
    N: int, P: int, H: int, d: int, H_kv: int | None = None, B: int = 1
) -> dict:
    """All-gather context parallelism (Llama 3's, PyTorch's default rotation): every
    device gathers all of K and V once, attends its own queries, and in the backward
    reduce-scatters dK/dV (fp32) back to their owners. Per device r (elements):

    * ``kv_received``: (N - n_r) 2 H_kv d B, the forward's all-gather (the ring
      receives the same, spread over P-1 steps);
    * ``dkv_received``: (N - n_r) 2 H_kv d B fp32, the reduce-scatter's partial sums
      of its own shard (the ring's accumulators bring N 2 H_kv d B: one more hop);
    * ``kv_held``: N 2 H_kv d B, the gathered K/V resident during attention (the ring
      holds at most three shards);
    * ``q_shard``: n_r H d B, for scale: with GQA the whole K/V is a small multiple of
      the local Q.
    The backward gathers K/V again (or keeps them): ``kv_received`` once more.
    """
    N, P, H, H_kv, d, B = _check_dims(N, P, H, H_kv, d, B)
    n = shard_lengths(N, P, "contiguous")
    per_token = 2 * H_kv * d * B
    return {
        "kv_received": (N - n) * per_token,
        "dkv_received": (N - n) * per_token,
        "kv_held": np.full(P, N * per_token, dtype=np.int64),
        "q_shard": n * H * d * B,
    }
