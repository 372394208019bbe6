"""What the simulator leaves out: the L2 cache.
Compulsory traffic and when L2 absorbs the rest.

The simulator charges every re-read of a K or V block to HBM. On a GPU the query-block
programs of one head run at about the same time, so after the first program has pulled
a K/V block into L2 (40 MB on an A100, 50 MB on an H100/H200) the others mostly hit it
there. Two counts bound what HBM really sees:

* the simulated count (``closed_form``): every re-read misses, as if there were no L2;
* the compulsory count (``compulsory``): each tensor crosses HBM once, as if L2 held
  everything that is reused. No schedule can move less.

``kv_fits_in_l2`` states the policy that decides which bound a kernel is near: the K and
V of every head in flight at once (the heads whose query blocks share the GPU's SMs)
must fit in L2 together. With that policy, the FlashAttention-2 forward at the shapes
models use is near the compulsory count, and its arithmetic intensity is far above every
GPU's ridge point: it is compute-bound (the FlashAttention-2 paper measures up to about
73% of the A100's peak). The simulated count stays the right one for the SRAM story: it
is what the tiles themselves must load.
"""

from __future__ import annotations

from .roofline import GPUS, GPUSpec
from .sim import Traffic, cdiv, check_count, traffic

_FORWARD = ("standard", "flash1", "flash2")
_BACKWARD = ("standard_bwd", "flash2_bwd", "flash2_bwd_split")


def compulsory(algorithm: str, N: int, d: int, N_k: int | None = None) -> Traffic:
    """Each input read once and each output written once, in elements (one head).

    Forward (``standard``, ``flash1``, ``flash2``): Q (N d), K and V (N_k d) in, O (N d)
    out, and the log-sum-exp L (N) that a training forward keeps for its backward.
    Backward (``standard_bwd``, ``flash2_bwd``, ``flash2_bwd_split``): Q, K, V, O, dO
    and L in, dQ, dK and dV out. Nothing of size N x N_k crosses: that is what the cache
    model removes, and what FlashAttention removes from the standard algorithm.
    """
    N, d = check_count("N", N), check_count("d", d)
    n_k = N if N_k is None else check_count("N_k", N_k)
    if algorithm in _FORWARD:
        per = {
            "Q": (N * d, 0),
            "K": (n_k * d, 0),
            "V": (n_k * d, 0),
            "O": (0, N * d),
            "L": (0, N),
        }
    elif algorithm in _BACKWARD:
        per = {
            "Q": (N * d, 0),
            "K": (n_k * d, 0),
            "V": (n_k * d, 0),
            "O": (N * d, 0),
            "dO": (N * d, 0),
            "L": (N, 0),
            "dQ": (0, N * d),
            "dK": (0, n_k * d),
            "dV": (0, n_k * d),
        }
    else:
        known = sorted(_FORWARD + _BACKWARD)
        raise ValueError(
            f"no compulsory-traffic model for {algorithm!r}; known: {known}"
        )
    return traffic(per)


def heads_in_flight(
    N: int, Br: int, gpu: str | GPUSpec, programs_per_sm: int = 1
) -> int:
    """Heads whose query-block programs occupy the GPU at once: SMs x programs per SM
    spread over ceil(N / Br) programs per head (at least one head)."""
    spec = GPUS[gpu] if isinstance(gpu, str) else gpu
    N, Br = check_count("N", N), check_count("Br", Br)
    per_head = cdiv(N, Br)
    return max(
        1, cdiv(spec.sms * check_count("programs_per_sm", programs_per_sm), per_head)
    )


def kv_fits_in_l2(
    N: int,
    d: int,
    Br: int,
    gpu: str | GPUSpec,
    bytes_per_elem: int = 2,
    N_k: int | None = None,
    programs_per_sm: int = 1,
) -> bool:
    """The stated L2 policy: re-reads of K and V hit L2 when the K and V of every head
    in flight fit in it together (2 N_k d elements per head)."""
    spec = GPUS[gpu] if isinstance(gpu, str) else gpu
    n_k = N if N_k is None else check_count("N_k", N_k)
    need = heads_in_flight(N, Br, spec, programs_per_sm) * 2 * n_k * d * bytes_per_elem
    return need <= spec.l2_mb * 1e6
