"""Block masks: which (query tile, key tile) pairs a mask lets the kernel skip.

``create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128)``
classifies every BLOCK_SIZE x BLOCK_SIZE tile of the Q_LEN x KV_LEN mask as empty (no
visible pair: never visited), full (every pair in range visible: visited without
evaluating the mask) or partial (visited, the mask evaluated pair by pair), and stores
the lists the kernels walk, as PyTorch's ``BlockMask`` does:

* kv side (forward, dQ): ``kv_num_blocks`` (B, H, nq) int32 and ``kv_indices`` (B, H,
  nq, nk) int32, the partial key tiles of each query tile in ascending order (entries
  past the count are padding), and ``full_kv_num_blocks`` / ``full_kv_indices`` for the
  full ones;
* q side (dK/dV): ``q_num_blocks`` (B, H, nk), ``q_indices`` (B, H, nk, nq),
  ``full_q_num_blocks``, ``full_q_indices``: the transposed lists.

B or H None means one entry broadcast over every batch / head. Ready-made mods are
classified from their closed forms (``Mod.tiles``: a handful of torch ops on
nq x nk tiles, never N^2 pairs); a user's own ``@triton.jit`` mask_mod, or a
combination holding one, by a small Triton kernel that evaluates the mod tile by tile
on the device (``_classify``: one program per tile; under the interpreter that is
Q_LEN x KV_LEN evaluations, fine at small N).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import runtime
from ..common import check_bool, check_device, check_int
from .mods import Mod, as_mod, noop_mask, pack

__all__ = ["BlockMask", "create_block_mask", "full_block_mask"]

EMPTY, PARTIAL, FULL = 0, 1, 2


@triton.jit
def _classify(
    STATE,
    MI,
    MF,
    n_b,
    n_h,
    Q_LEN,
    KV_LEN,
    NQ,
    NK,
    MASK_FN: tl.constexpr,
    SQ: tl.constexpr,
    SK: tl.constexpr,
):
    """STATE[b, h, i, j] = 0 (no visible pair), 1 (some), 2 (every pair in range)."""
    i = tl.program_id(0)
    j = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // n_h
    h = bh % n_h
    q_idx = i * SQ + tl.arange(0, SQ)
    kv_idx = j * SK + tl.arange(0, SK)
    inside = (q_idx[:, None] < Q_LEN) & (kv_idx[None, :] < KV_LEN)
    vis = MASK_FN(b, h, q_idx[:, None], kv_idx[None, :], MI, MF) & inside
    seen = tl.sum(tl.sum(vis.to(tl.int32), 1), 0)
    total = tl.sum(tl.sum(inside.to(tl.int32), 1), 0)
    state = tl.where(seen == 0, 0, tl.where(seen == total, 2, 1))
    tl.store(STATE + ((b * n_h + h) * NQ + i) * NK + j, state.to(tl.int8))


class BlockMask:
    """The tile lists of one mask (see the module docstring), with ``BLOCK_SIZE``
    (Q, KV), ``seq_lengths`` (Q_LEN, KV_LEN) and ``mask_mod`` (the mod the kernel
    evaluates in partial tiles)."""

    def __init__(self, state: torch.Tensor, block_size, seq_lengths, mask_mod: Mod):
        self.state = state  # (Bm, Hm, nq, nk) int8: EMPTY / PARTIAL / FULL
        self.BLOCK_SIZE = tuple(block_size)
        self.seq_lengths = tuple(seq_lengths)
        self.mask_mod = mask_mod
        #: whether any tile is partial (the NaN/inf launches run only then)
        self.has_partial = bool((state == PARTIAL).any())
        (
            self.kv_num_blocks,
            self.kv_indices,
            self.full_kv_num_blocks,
            self.full_kv_indices,
        ) = _lists(state)
        (
            self.q_num_blocks,
            self.q_indices,
            self.full_q_num_blocks,
            self.full_q_indices,
        ) = _lists(state.transpose(-1, -2))

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (*self.state.shape[:2], *self.seq_lengths)

    def to_dense(self) -> torch.Tensor:
        """(Bm, Hm, nq, nk) int32: 1 for a visited (partial or full) tile."""
        return (self.state != EMPTY).to(torch.int32)

    def sparsity(self, torch_formula: bool = False) -> float:
        """Percent of tiles skipped: 100 (1 - visited / tiles) over the (Bm, Hm, nq, nk)
        tiles, in [0, 100].

        PyTorch's ``BlockMask.sparsity`` counts each visited tile at its full
        BLOCK_SIZE area against the mask's elements instead, 100 (1 - visited BLOCK_Q
        BLOCK_KV / (Bm Hm Q_LEN KV_LEN)). The two agree when Q_LEN and KV_LEN are
        multiples of the block size; for ragged lengths torch's counts the padding of
        the last tiles as work and can go negative (causal at N = 100, blocks of
        128: 0% here, -63.84% in torch 2.13). ``torch_formula=True`` gives torch's
        number. ``and_masks`` tiles are classed conservatively here (module
        docstring of ``kernels.flex``), so a mask with them may read a lower
        sparsity than torch's, which evaluates every pair."""
        dense = self.to_dense()
        if check_bool("torch_formula", torch_formula):
            area = self.BLOCK_SIZE[0] * self.BLOCK_SIZE[1]
            elems = dense.shape[0] * dense.shape[1] * math.prod(self.seq_lengths)
            return 100.0 * (1.0 - dense.sum().item() * area / elems)
        return 100.0 * (1.0 - dense.sum().item() / dense.numel())

    def counts(self) -> dict[str, int]:
        """Number of empty, partial and full tiles (over Bm x Hm)."""
        return {
            name: int((self.state == v).sum())
            for name, v in (("empty", EMPTY), ("partial", PARTIAL), ("full", FULL))
        }

    def __repr__(self):
        c = self.counts()
        return (
            f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, "
            f"sparsity={self.sparsity():.2f}%, full={c['full']}, "
            f"partial={c['partial']}, mask_mod={self.mask_mod})"
        )


def _lists(state: torch.Tensor):
    """Counts and ascending index lists of the partial and full tiles along the last
    axis: (num (..., n) int32, idx (..., n, m) int32) twice."""
    out = []
    m = state.shape[-1]
    cols = torch.arange(m, device=state.device)
    for kind in (PARTIAL, FULL):
        hit = state == kind
        num = hit.sum(-1).to(torch.int32)
        # listed tiles first, in ascending order; the rest padding (column m - 1 ...)
        key = torch.where(hit, cols, cols + m)
        idx = torch.sort(key, dim=-1).values % m
        out += [num.contiguous(), idx.to(torch.int32).contiguous()]
    return out


def _check_block_size(block_size) -> tuple[int, int]:
    sizes = block_size if isinstance(block_size, (tuple, list)) else (block_size,) * 2
    if len(sizes) != 2:
        raise ValueError(f"BLOCK_SIZE must be an int or a pair, got {block_size!r}")
    for s in sizes:
        s = check_int("BLOCK_SIZE", s, 16)
        if s & (s - 1):
            raise ValueError(
                f"BLOCK_SIZE must be a power of two >= 16, got {block_size}"
            )
    return int(sizes[0]), int(sizes[1])


def _closed_form(mod: Mod, qlo, qhi, klo, khi):
    """(some, every) of a mod tree from its leaves' closed forms (None if a leaf has
    none). and: every = all, some = all (an over-approximation); or: any of both."""
    if mod.op:
        parts = [_closed_form(c, qlo, qhi, klo, khi) for c in mod.children]
        if any(p is None for p in parts):
            return None
        some, every = parts[0]
        for s, e in parts[1:]:
            if mod.op == "and":
                some, every = some & s, every & e
            else:
                some, every = some | s, every | e
        return some, every
    if mod.tiles is None:
        return None
    return tuple(_leaf_4d(mod, x) for x in mod.tiles(qlo, qhi, klo, khi))


def _leaf_4d(leaf: Mod, x) -> torch.Tensor:
    """A leaf's (lead, nq, nk) classification as (Bl, Hl, nq, nk), Bl the batch and Hl
    the heads its tensors carry (1 where none), so an and/or of a per-batch and a
    per-head mod broadcasts as torch broadcasts them."""
    x = torch.as_tensor(x)
    while x.ndim < 3:
        x = x[None]
    bl = leaf.batch or 1
    hl = (leaf.heads if leaf.kind == "mask" else None) or 1
    if x.shape[0] == bl * hl:
        return x.reshape(bl, hl, *x.shape[1:])
    return x.reshape(x.shape[0], 1, *x.shape[1:])


def _extent(mod: Mod, attr: str):
    sizes = {getattr(leaf, attr) for leaf in mod.leaves()} - {None}
    return sizes


def create_block_mask(
    mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128
) -> BlockMask:
    """The BlockMask of ``mask_mod`` (a kernels.flex mask mod or a user's
    ``@triton.jit`` ``(b, h, q_idx, kv_idx) -> bool``) over Q_LEN x KV_LEN, for batch
    size B and H heads (None: broadcast, one entry). ``BLOCK_SIZE``: a power of two >=
    16, or a (Q, KV) pair of them. ``device``: where the lists live (default: the
    kernels' device)."""
    mod = as_mod(mask_mod, "mask", "mask_mod")
    if mod is None:
        mod = noop_mask
    Bm = 1 if B is None else check_int("B", B, 1)
    Hm = 1 if H is None else check_int("H", H, 1)
    for what, sizes in (
        ("batch", _extent(mod, "batch")),
        ("heads", {lf.heads for lf in mod.leaves() if lf.kind == "mask"} - {None}),
    ):
        if len(sizes - {1}) > 1:
            raise ValueError(
                f"mask_mod combines mods of different {what} sizes "
                f"{sorted(sizes)}; each must be 1 or the same"
            )
    Q_LEN = check_int("Q_LEN", Q_LEN, 1)
    KV_LEN = check_int("KV_LEN", KV_LEN, 1)
    SQ, SK = _check_block_size(BLOCK_SIZE)
    device = check_device("device", runtime.DEVICE if device is None else device)
    for leaf in mod.leaves():
        if leaf.batch is not None and B is not None and leaf.batch not in (1, Bm):
            raise ValueError(
                f"B={B} does not match the {leaf} mod's batch {leaf.batch}"
            )
        if leaf.heads is not None and leaf.kind == "mask" and H is not None:
            if leaf.heads != Hm:
                raise ValueError(f"H={H} does not match the {leaf} mod's heads")
        if leaf.name.startswith("document_mask") and leaf.ints[1] < max(Q_LEN, KV_LEN):
            raise ValueError(
                f"document_ids has length {leaf.ints[1]}, shorter than "
                f"Q_LEN={Q_LEN} / KV_LEN={KV_LEN}"
            )
        if leaf.name.startswith("dense_mask") and tuple(leaf.ints[2:4]) != (
            Q_LEN,
            KV_LEN,
        ):
            raise ValueError(
                f"mask is {tuple(leaf.ints[2:4])} (Q, KV), but Q_LEN={Q_LEN}, "
                f"KV_LEN={KV_LEN}"
            )
    # batch/head extents fixed by carried tensors when B / H are None
    if B is None and _extent(mod, "batch"):
        Bm = max(_extent(mod, "batch"))
    if H is None and {lf.heads for lf in mod.leaves() if lf.kind == "mask"} - {None}:
        Hm = max({lf.heads for lf in mod.leaves() if lf.kind == "mask"} - {None})
    nq, nk = triton.cdiv(Q_LEN, SQ), triton.cdiv(KV_LEN, SK)
    qlo = (torch.arange(nq) * SQ)[:, None]
    qhi = torch.clamp(qlo + SQ, max=Q_LEN)
    klo = (torch.arange(nk) * SK)[None, :]
    khi = torch.clamp(klo + SK, max=KV_LEN)
    cf = _closed_form(mod, qlo, qhi, klo, khi)
    if cf is not None:
        some, every = (torch.as_tensor(x) for x in cf)
        state = torch.where(every, FULL, torch.where(some, PARTIAL, EMPTY))
        # (Bm or 1, Hm or 1, nq, nk) -> (Bm, Hm, nq, nk)
        state = state.to(torch.int8).expand(Bm, Hm, nq, nk)
        state = state.contiguous().to(device)
    else:
        fn, mi, mf = pack(mod, device)
        state = torch.empty((Bm, Hm, nq, nk), dtype=torch.int8, device=device)
        _classify[(nq, nk, Bm * Hm)](
            state, mi, mf, Bm, Hm, Q_LEN, KV_LEN, nq, nk, MASK_FN=fn, SQ=SQ, SK=SK
        )
    return BlockMask(state, (SQ, SK), (Q_LEN, KV_LEN), mod)


def full_block_mask(Q_LEN: int, KV_LEN: int, device, BLOCK_SIZE=128) -> BlockMask:
    """Every tile full: dense attention (what ``block_mask=None`` means)."""
    SQ, SK = _check_block_size(BLOCK_SIZE)
    nq, nk = triton.cdiv(Q_LEN, SQ), triton.cdiv(KV_LEN, SK)
    state = torch.full((1, 1, nq, nk), FULL, dtype=torch.int8, device=device)
    return BlockMask(state, (SQ, SK), (Q_LEN, KV_LEN), noop_mask)
