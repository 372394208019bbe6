"""Soft, hard (argmax) and top-k attention forwards, tile by tile and in closed form.

The HBM traffic of chapter 3's three selections, registered as ``"soft"``
(streaming soft attention, FlashAttention-style), ``"hard"`` (argmax, one row of V
per query) and ``"topk"`` (k rows of V per query); the math is ``attention.hard``.
"""

from __future__ import annotations

from .sim import HBMSim, blocks, cdiv, fit_tiles, register, traffic

# All three stream K block by block past a Q block held in SRAM (one pass, S never
# written to HBM). Soft attention must also stream *every* row of V; hard and top-k
# attention know which rows they need only after the pass over K, and then read just
# those: 1 (hard) or k (top-k) rows of V per query.


def _simulate_soft(N, d, Br=64, Bc=64, M=None, N_k=None, keep_trace=True):
    """Streaming soft attention (FlashAttention forward): Q block in SRAM,
    K and V streamed."""
    n_k = N if N_k is None else N_k
    sim = HBMSim(M, keep_trace)
    for i, br in enumerate(blocks(N, Br)):
        sim.step = i
        sim.hold(br * d + br * d + 2 * br, "Q block, O accumulator, m and l")
        sim.load("Q", br * d, (i,))
        for j, bc in enumerate(blocks(n_k, Bc)):
            sim.hold(2 * bc * d + br * bc, "K, V and S tiles")
            sim.load("K", bc * d, (j,))
            sim.load("V", bc * d, (j,))
            sim.release(2 * bc * d + br * bc)
        sim.store("O", br * d, (i,))
        sim.release(2 * br * d + 2 * br)
    return sim.result()


def _closed_soft(N, d, Br=64, Bc=64, M=None, N_k=None, keep_trace=True):
    n_k = N if N_k is None else N_k
    br, bc = min(Br, N), min(Bc, n_k)
    peak = fit_tiles(
        "soft",
        {
            "the loop over K, V": {
                "Q_i, O_i": 2 * br * d,
                "m_i, l_i": 2 * br,
                "K_j, V_j": 2 * bc * d,
                "S_ij": br * bc,
            }
        },
        M,
    )
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    return traffic(
        {
            "Q": (N * d, 0),
            "K": (t_r * n_k * d, 0),
            "V": (t_r * n_k * d, 0),
            "O": (0, N * d),
        },
        peak,
        steps=t_r,
        events=2 * t_r * t_c + 2 * t_r,
    )


def _simulate_select(N, d, rows, Br, Bc, M, N_k, keep_trace, write_lse):
    """Shared by hard and top-k: stream K for the selection,
    then gather ``rows`` rows of V."""
    n_k = N if N_k is None else N_k
    kk = min(rows, n_k)
    sim = HBMSim(M, keep_trace)
    for i, br in enumerate(blocks(N, Br)):
        sim.step = i
        sim.hold(br * d + 2 * br * kk, "Q block and the running (score, index) buffer")
        sim.load("Q", br * d, (i,))
        for j, bc in enumerate(blocks(n_k, Bc)):
            sim.hold(bc * d + br * bc, "K and S tiles")
            sim.load("K", bc * d, (j,))
            sim.release(bc * d + br * bc)
        sim.hold(br * d, "the O accumulator")
        for r in range(kk):  # one gathered row of V per query and kept slot
            sim.load("V", br * d, (i, r))
        sim.store("O", br * d, (i,))
        sim.store("idx", br * kk, (i,))
        if write_lse:
            sim.store("L", br, (i,))
        sim.release(2 * br * d + 2 * br * kk)
    return sim.result()


def _closed_select(name, N, d, rows, Br, Bc, M, N_k, write_lse):
    n_k = N if N_k is None else N_k
    kk = min(rows, n_k)
    br, bc = min(Br, N), min(Bc, n_k)
    kept = {"Q_i": br * d, "the (score, index) buffer": 2 * br * kk}
    peak = fit_tiles(
        name,
        {
            "the pass over K": {**kept, "K_j": bc * d, "S_ij": br * bc},
            "the gather of V": {**kept, "O_i": br * d},
        },
        M,
    )
    t_r, t_c = cdiv(N, Br), cdiv(n_k, Bc)
    per = {
        "Q": (N * d, 0),
        "K": (t_r * n_k * d, 0),
        "V": (N * kk * d, 0),
        "O": (0, N * d),
        "idx": (0, N * kk),
    }
    if write_lse:
        per["L"] = (0, N)
    return traffic(
        per, peak, steps=t_r, events=t_r * t_c + t_r * (3 + kk + bool(write_lse))
    )


def _simulate_hard(N, d, Br=64, Bc=64, M=None, N_k=None, keep_trace=True):
    """Hard (argmax) attention: stream K, keep (max, argmax) per row,
    read one row of V."""
    return _simulate_select(N, d, 1, Br, Bc, M, N_k, keep_trace, write_lse=False)


def _closed_hard(N, d, Br=64, Bc=64, M=None, N_k=None, keep_trace=True):
    return _closed_select("hard", N, d, 1, Br, Bc, M, N_k, write_lse=False)


def _simulate_topk(N, d, k=8, Br=64, Bc=64, M=None, N_k=None, keep_trace=True):
    """Top-k attention: stream K, keep the k best (score, index) per row,
    read k rows of V.

    Writes O, the kept indices and the log-sum-exp (what the backward needs).
    """
    return _simulate_select(N, d, k, Br, Bc, M, N_k, keep_trace, write_lse=True)


def _closed_topk(N, d, k=8, Br=64, Bc=64, M=None, N_k=None, keep_trace=True):
    return _closed_select("topk", N, d, k, Br, Bc, M, N_k, write_lse=True)


register("soft", _simulate_soft, _closed_soft)
register("hard", _simulate_hard, _closed_hard)
register("topk", _simulate_topk, _closed_topk)
