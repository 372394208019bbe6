"""Mask mods and score mods: ready-made ones, their combinations, and how a mod reaches
the kernel.

A mod is what PyTorch's FlexAttention calls it: ``mask_mod(b, h, q_idx, kv_idx) ->
bool`` and ``score_mod(score, b, h, q_idx, kv_idx) -> score`` (``score`` the scaled
score q.k * scale; q_idx, kv_idx absolute positions from 0). A user's own
``@triton.jit`` function with that signature is a mod as it is. The ready-made ones are
``Mod`` objects: a ``@triton.jit`` leaf with the extended signature ``(b, h, q_idx,
kv_idx, MI, MF, SI, SF)`` (score leaves take ``score`` first) plus the numbers and
tensors it reads (a window, a cap, document ids, slopes), and, for mask leaves, a
closed form that classifies whole tiles (``tiles``: which tiles hold some visible pair,
which hold only visible pairs) so ``create_block_mask`` never evaluates N^2 pairs.

What the kernel receives (``pack``): one generated ``@triton.jit`` function per mod
tree, ``fn(b, h, q_idx, kv_idx, MI, MF)`` (score: ``fn(score, b, h, q_idx, kv_idx, MI,
MF)``), which calls the leaves and combines them with ``&`` / ``|``, plus two small
tensors: ``MI`` (int32: every leaf's integer header, then its integer arrays) and
``MF`` (float32: the float header and arrays). The generated source depends only on the
tree's shape (which leaves, where their headers sit), never on N or on a window's
value, so one compiled kernel serves every length and parameter. Generated functions
are registered in ``linecache`` so Triton (and ``inspect``) can read their source.

Score mods and the backward: a ready-made score mod carries its exact derivative
d score'/d score (``grad``), and so does a user's mod wrapped by
``score_mod_with_grad(score_mod, grad)``. A user's bare score mod is differentiated by
a five-point difference in fp32 inside the backward kernels (four more calls of the
mod per score), step 2^-5 times the power of two of max(1, |score|, |mod(score) -
score|): what the mod adds sets the scale too, so a large bias is not lost to
rounding. It is exact up to rounding for mods affine in the score (biases: relative
position, ALiBi-like, ``score + 1000``: dq, dk within 4x PyTorch's own fp32 error);
for a curved mod (a user-written softcap at cap 2) the rounding of the mod's value
over the step leaves dq and dk about 13x PyTorch's fp32 error (4e-6 relative), against
1.5-2x with the derivative carried. ``tests/kernels/test_flex_user_grad.py`` measures
these.
"""

from __future__ import annotations

import itertools
import linecache
import numbers

import torch
import triton
import triton.language as tl

from ..common import check_int, check_tensor

__all__ = [
    "Mod",
    "alibi",
    "and_masks",
    "causal_mask",
    "dense_mask",
    "document_mask",
    "noop_mask",
    "or_masks",
    "pack",
    "prefix_lm",
    "score_mod_with_grad",
    "sliding_window",
    "softcap",
    "tanh",
]


# ------------------------------------------------------------------------------------
# The @triton.jit leaves. MI/MF: the int32/float32 buffers; SI/SF: this leaf's header
# offsets in them (baked into the generated caller).
# ------------------------------------------------------------------------------------
@triton.jit
def _causal_leaf(b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr):
    return q_idx >= kv_idx


@triton.jit
def _noop_leaf(b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr):
    return (q_idx >= 0) & (kv_idx >= 0)


@triton.jit
def _window_leaf(b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr):
    window = tl.load(MI + SI)
    diff = q_idx - kv_idx
    return (diff >= 0) & (diff < window)


@triton.jit
def _prefix_leaf(b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr):
    return (kv_idx < tl.load(MI + SI)) | (q_idx >= kv_idx)


@triton.jit
def _document_leaf(b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr):
    # header: batch stride of the ids (0 for one (N,) row), their length, their offset
    stride_b = tl.load(MI + SI)
    n = tl.load(MI + SI + 1)
    ids = MI + tl.load(MI + SI + 2) + b * stride_b
    doc_q = tl.load(ids + q_idx, mask=q_idx < n, other=-1)
    doc_k = tl.load(ids + kv_idx, mask=kv_idx < n, other=-2)
    return doc_q == doc_k


@triton.jit
def _dense_leaf(b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr):
    # header: batch and head strides, rows, columns, offset of the 0/1 table
    stride_b = tl.load(MI + SI)
    stride_h = tl.load(MI + SI + 1)
    n_q = tl.load(MI + SI + 2)
    n_k = tl.load(MI + SI + 3)
    table = MI + tl.load(MI + SI + 4) + b * stride_b + h * stride_h
    inside = (q_idx < n_q) & (kv_idx < n_k)
    return tl.load(table + q_idx * n_k + kv_idx, mask=inside, other=0) != 0


@triton.jit
def tanh(x):
    """tanh in fp32 to a few ulps relative at every x, from one exp2 (no libdevice
    call: the interpreter runs it too), the softcap of flex's mods and of
    ``kernels.decode``: odd, and tanh|x| = (1 - t) / (1 + t) with t = e^(-2|x|) <= 1
    (+-1 at +-inf, no overflow); below |x| = 0.3, where 1 - t would cancel (a cap far
    above the scores), the series to x^9. NaN stays NaN."""
    a = tl.abs(x)
    t = tl.exp2(a * -2.8853900817779268)  # e^(-2|x|): 2 log2(e)
    far = (1.0 - t) / (1.0 + t)
    s = tl.minimum(a, 0.3)  # the series only where it is used (no overflow in s^2)
    s2 = s * s
    near = s * (1.0 + s2 * (-1 / 3 + s2 * (2 / 15 + s2 * (-17 / 315 + s2 * 62 / 2835))))
    y = tl.where(a < 0.3, near, far)
    return tl.where(x < 0, -y, y)


@triton.jit
def _softcap_leaf(
    score, b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr
):
    cap = tl.load(MF + SF)
    return cap * tanh(score / cap)


@triton.jit
def _softcap_grad(
    score, b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr
):
    # 1 - tanh^2 from the accurate tanh (the compiler shares it with the leaf's):
    # relative where the derivative is near 1, within 2^-23 where it is not (4t / (1 +
    # t)^2, relative there too, spilled registers in the backward on sm_80-90)
    t = tanh(score / tl.load(MF + SF))
    return 1.0 - t * t


@triton.jit
def _alibi_leaf(score, b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr):
    slope = tl.load(MF + tl.load(MI + SI) + h)
    return score + slope * (kv_idx - q_idx).to(tl.float32)


@triton.jit
def _one_grad(score, b, h, q_idx, kv_idx, MI, MF, SI: tl.constexpr, SF: tl.constexpr):
    return tl.full(score.shape, 1.0, tl.float32)


# ------------------------------------------------------------------------------------
# Tile classification (closed forms). Each takes the first and one-past-last position
# of every query tile (qlo, qhi: (nq, 1)) and key tile (klo, khi: (1, nk)), in range,
# and returns (some, every): bool tensors (Bm, nq, nk) or broadcastable, True where the
# tile may hold a visible pair / holds only visible pairs. "some" may over-approximate
# (a tile taken for partial is evaluated pair by pair), "every" never does.
# ------------------------------------------------------------------------------------
def _causal_tiles(qlo, qhi, klo, khi):
    return (qhi - 1 >= klo)[None], (qlo >= khi - 1)[None]


def _window_tiles(window):
    def tiles(qlo, qhi, klo, khi):
        lo, hi = qlo - (khi - 1), (qhi - 1) - klo  # the range of q_idx - kv_idx
        return ((hi >= 0) & (lo < window))[None], ((lo >= 0) & (hi < window))[None]

    return tiles


def _prefix_tiles(prefix):
    def tiles(qlo, qhi, klo, khi):
        some = (klo < prefix) | (qhi - 1 >= klo)
        return some[None], ((khi <= prefix) | (qlo >= khi - 1))[None]

    return tiles


def _block_reduce(x, edges, dim, op):
    """op (amin/amax/any/all) of x over the position ranges ``edges`` along ``dim``."""
    parts = [op(x.narrow(dim, a, b - a), dim=dim, keepdim=True) for a, b in edges]
    return torch.cat(parts, dim=dim)


def _document_tiles(ids):
    def tiles(qlo, qhi, klo, khi):
        qe = list(zip(qlo[:, 0].tolist(), qhi[:, 0].tolist()))
        ke = list(zip(klo[0].tolist(), khi[0].tolist()))
        ids2 = ids.reshape(-1, ids.shape[-1]).to(torch.int64)
        qmin, qmax = _reduced_ranges(ids2, qe)  # (Bm, nq)
        kmin, kmax = _reduced_ranges(ids2, ke)  # (Bm, nk)
        some = (qmin[:, :, None] <= kmax[:, None]) & (kmin[:, None] <= qmax[:, :, None])
        every = (qmin == qmax)[:, :, None] & (kmin == kmax)[:, None]
        every = every & (qmin[:, :, None] == kmin[:, None])
        return some, every

    return tiles


def _reduced_ranges(ids2, edges):
    """(min, max) of each row of ids2 over each range in edges, vectorised when the
    ranges are equal blocks (the last may be shorter)."""
    return (
        _block_reduce(ids2, edges, 1, torch.amin),
        _block_reduce(ids2, edges, 1, torch.amax),
    )


def _dense_tiles(table):
    def tiles(qlo, qhi, klo, khi):
        t = table.reshape(-1, *table.shape[-2:]).bool()  # (B*H, N_q, N_k)
        qe = list(zip(qlo[:, 0].tolist(), qhi[:, 0].tolist()))
        ke = list(zip(klo[0].tolist(), khi[0].tolist()))
        rows_any = _block_reduce(t, qe, 1, torch.any)
        rows_all = _block_reduce(t, qe, 1, torch.all)
        return _block_reduce(rows_any, ke, 2, torch.any), _block_reduce(
            rows_all, ke, 2, torch.all
        )

    return tiles


# ------------------------------------------------------------------------------------
# Mod objects
# ------------------------------------------------------------------------------------
class Mod:
    """A mask or score mod: a ``@triton.jit`` leaf and what it carries, or an and/or
    of mask mods (``op`` "and"/"or", ``children``).

    ``fn``: the leaf; ``user``: True for a plain user function (torch's signature,
    called without the buffers). ``ints``/``floats``: the leaf's header values (an
    entry ``("array", i)`` is replaced by the offset of ``int_arrays[i]`` /
    ``float_arrays[i]`` in its buffer). ``tiles``: the closed-form tile classifier
    (None: evaluate the mod tile by tile on the device). ``grad``: a score leaf's
    derivative. ``batch``/``heads``: the batch size / head count the carried tensors
    fix (None: any).
    """

    def __init__(
        self,
        kind,
        name,
        fn=None,
        *,
        user=False,
        ints=(),
        floats=(),
        int_arrays=(),
        float_arrays=(),
        tiles=None,
        grad=None,
        op=None,
        children=(),
        batch=None,
        heads=None,
    ):
        self.kind, self.name, self.fn, self.user = kind, name, fn, user
        self.ints, self.floats = tuple(ints), tuple(floats)
        self.int_arrays, self.float_arrays = tuple(int_arrays), tuple(float_arrays)
        self.tiles, self.grad, self.op = tiles, grad, op
        self.children, self.batch, self.heads = tuple(children), batch, heads

    def __repr__(self):
        if self.op:
            return f"{self.op}_masks({', '.join(map(repr, self.children))})"
        return self.name

    def leaves(self):
        if self.op:
            return [leaf for c in self.children for leaf in c.leaves()]
        return [self]


def as_mod(mod, kind: str, name: str) -> Mod | None:
    """A Mod from a Mod, a user's @triton.jit function, or None (TypeError naming
    ``name`` otherwise)."""
    if mod is None or isinstance(mod, Mod):
        if isinstance(mod, Mod) and mod.kind != kind:
            raise TypeError(
                f"{name} must be a {kind} mod, got the {mod.kind} mod {mod}"
            )
        return mod
    if isinstance(mod, triton.runtime.JITFunction) or hasattr(mod, "arg_names"):
        fn_name = getattr(getattr(mod, "fn", mod), "__name__", "mod")
        return Mod(kind, fn_name, mod, user=True)
    raise TypeError(
        f"{name} must be a @triton.jit function, a kernels.flex mod or None, "
        f"got {type(mod).__name__}"
    )


_LEAF_NAMES = {
    _causal_leaf: "causal",
    _noop_leaf: "noop",
    _window_leaf: "window",
    _prefix_leaf: "prefix",
    _document_leaf: "document",
    _dense_leaf: "dense",
    _softcap_leaf: "softcap",
    _softcap_grad: "softcap_grad",
    _alibi_leaf: "alibi",
    _one_grad: "one_grad",
}

causal_mask = Mod("mask", "causal_mask", _causal_leaf, tiles=_causal_tiles)
causal_mask.__doc__ = "q_idx >= kv_idx (torch's convention: top-left aligned)."
noop_mask = Mod(
    "mask",
    "noop_mask",
    _noop_leaf,
    tiles=lambda qlo, qhi, klo, khi: (torch.ones_like(qlo >= klo)[None],) * 2,
)
noop_mask.__doc__ = "Every pair visible (dense attention through the block mask)."


def sliding_window(window) -> Mod:
    """Causal sliding window: 0 <= q_idx - kv_idx < window (Mistral's 4,096, Gemma's
    local layers, gpt-oss's 128)."""
    window = check_int("window", window, 1)
    return Mod(
        "mask",
        f"sliding_window({window})",
        _window_leaf,
        ints=(window,),
        tiles=_window_tiles(window),
    )


def prefix_lm(prefix_length) -> Mod:
    """Prefix LM: kv_idx < prefix_length (the prefix is seen both ways) or causal."""
    prefix = check_int("prefix_length", prefix_length, 0)
    return Mod(
        "mask",
        f"prefix_lm({prefix})",
        _prefix_leaf,
        ints=(prefix,),
        tiles=_prefix_tiles(prefix),
    )


def document_mask(document_ids) -> Mod:
    """Packed sequences: a query sees a key iff both carry the same document id.
    ``document_ids``: (N,) or (B, N) integers (any order; sorted runs classify tiles
    exactly, other orders conservatively). Combine with ``causal_mask`` by
    ``and_masks``."""
    ids = check_tensor("document_ids", document_ids)
    if ids.ndim not in (1, 2) or ids.shape[-1] < 1:
        raise ValueError(
            f"document_ids must be (N,) or (B, N) with N >= 1, got shape "
            f"{tuple(ids.shape)}"
        )
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"document_ids must hold integers, got dtype {ids.dtype}")
    ids = ids.detach()
    if ids.numel() and (int(ids.min()) < -(2**31) + 2 or int(ids.max()) >= 2**31):
        raise ValueError("document_ids must fit int32 (and be > -2**31 + 2)")
    n = ids.shape[-1]
    return Mod(
        "mask",
        f"document_mask(N={n})",
        _document_leaf,
        ints=(n if ids.ndim == 2 else 0, n, ("array", 0)),
        int_arrays=(ids.to(torch.int32).reshape(-1),),
        tiles=_document_tiles(ids.cpu()),  # classified on the host: O(N) work
        batch=ids.shape[0] if ids.ndim == 2 else None,
    )


def dense_mask(mask) -> Mod:
    """A mask given as a table: ``mask`` (Q_LEN, KV_LEN), (H, Q_LEN, KV_LEN) or (B, H,
    Q_LEN, KV_LEN) bool; True = visible. For masks with no closed form (random block
    patterns, masks read from data); it costs Q_LEN x KV_LEN int32 on the device."""
    t = check_tensor("mask", mask)
    if t.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {t.dtype}")
    if t.ndim not in (2, 3, 4):
        raise ValueError(
            f"mask must be (Q_LEN, KV_LEN), (H, Q_LEN, KV_LEN) or "
            f"(B, H, Q_LEN, KV_LEN), got shape {tuple(t.shape)}"
        )
    t4 = t.detach().reshape((1,) * (4 - t.ndim) + tuple(t.shape))
    B, H, n_q, n_k = t4.shape
    return Mod(
        "mask",
        f"dense_mask({tuple(t.shape)})",
        _dense_leaf,
        ints=(
            H * n_q * n_k if B > 1 else 0,
            n_q * n_k if H > 1 else 0,
            n_q,
            n_k,
            ("array", 0),
        ),
        int_arrays=(t4.to(torch.int32).reshape(-1),),
        tiles=_dense_tiles(t4.cpu()),
        batch=B if B > 1 else None,
        heads=H if H > 1 else None,
    )


def _combine(op, mods):
    if not mods:
        raise ValueError(f"{op}_masks needs at least one mask mod")
    parts = [as_mod(m, "mask", f"{op}_masks argument {i}") for i, m in enumerate(mods)]
    if any(p is None for p in parts):
        raise TypeError(f"{op}_masks takes mask mods, got None")
    return Mod("mask", op, op=op, children=parts)


def and_masks(*mask_mods) -> Mod:
    """A pair is visible iff every mod says so (e.g. causal & document)."""
    return _combine("and", mask_mods)


def or_masks(*mask_mods) -> Mod:
    """A pair is visible iff some mod says so."""
    return _combine("or", mask_mods)


def softcap(cap) -> Mod:
    """Gemma 2's logit softcap: score -> cap * tanh(score / cap), cap > 0."""
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real):
        raise TypeError(f"cap must be a real number, got {type(cap).__name__}")
    if not (float(cap) > 0 and float(cap) < float("inf")):
        raise ValueError(f"cap must be finite and > 0, got {cap}")
    return Mod(
        "score",
        f"softcap({cap})",
        _softcap_leaf,
        floats=(float(cap),),
        grad=_softcap_grad,
    )


def score_mod_with_grad(score_mod, grad) -> Mod:
    """A user's score mod that carries its exact derivative, as the ready-made ones
    do: ``score_mod(score, b, h, q_idx, kv_idx)`` and ``grad(score, b, h, q_idx,
    kv_idx)`` = d score_mod / d score, both ``@triton.jit`` with torch's signature.
    The backward then calls ``grad`` instead of taking a five-point difference (whose
    fp32 rounding puts dq and dk of a curved mod at ~13x PyTorch's own fp32 error: see
    the module's docstring). ``grad`` is trusted, not checked: a wrong derivative
    gives wrong gradients."""
    for name, fn in (("score_mod", score_mod), ("grad", grad)):
        if not (isinstance(fn, triton.runtime.JITFunction) or hasattr(fn, "arg_names")):
            raise TypeError(
                f"{name} must be a @triton.jit function, got {type(fn).__name__}"
            )
        args = list(getattr(fn, "arg_names", []))
        if len(args) != 5:
            got = ", ".join(args)
            raise TypeError(
                f"{name} must take (score, b, h, q_idx, kv_idx), got ({got})"
            )
    fn_name = getattr(getattr(score_mod, "fn", score_mod), "__name__", "mod")
    return Mod("score", f"{fn_name} (with its grad)", score_mod, user=True, grad=grad)


def alibi(slopes) -> Mod:
    """ALiBi: score -> score + slopes[h] * (kv_idx - q_idx); ``slopes`` (H_q,) real."""
    s = check_tensor("slopes", slopes)
    if s.ndim != 1 or s.numel() < 1:
        raise ValueError(f"slopes must be (H,) with H >= 1, got shape {tuple(s.shape)}")
    if not s.dtype.is_floating_point:
        raise TypeError(f"slopes must be floating point, got dtype {s.dtype}")
    return Mod(
        "score",
        f"alibi(H={s.numel()})",
        _alibi_leaf,
        ints=(("array", 0),),
        float_arrays=(s.detach().to(torch.float32),),
        grad=_one_grad,
        heads=s.numel(),
    )


# ------------------------------------------------------------------------------------
# Packing: the generated caller and the buffers
# ------------------------------------------------------------------------------------
_GENERATED: dict[tuple, object] = {}
_COUNTER = itertools.count()


def _layout(mod: Mod):
    """Header offsets (SI, SF) per leaf, and the header lengths."""
    si = sf = 0
    offsets = []
    for leaf in mod.leaves():
        offsets.append((si, sf))
        si += len(leaf.ints)
        sf += len(leaf.floats)
    return offsets, si, sf


def _expr(mod, offsets, args, it):
    if mod.op:
        sym = " & " if mod.op == "and" else " | "
        return "(" + sym.join(_expr(c, offsets, args, it) for c in mod.children) + ")"
    i = next(it)
    name = f"leaf{i}"
    if mod.user:
        return f"{name}({args})"
    si, sf = offsets[i]
    return f"{name}({args}, MI, MF, {si}, {sf})"


def _generate(mod: Mod, grad: bool = False):
    """The generated @triton.jit caller of a mod tree (cached by the tree's shape)."""
    leaves = mod.leaves()
    offsets, _, _ = _layout(mod)
    fns = [(leaf.grad if grad else leaf.fn) for leaf in leaves]
    key = (mod.kind, grad, _shape_key(mod), tuple(id(f) for f in fns))
    if key in _GENERATED:
        return _GENERATED[key]
    if mod.kind == "mask":
        params, args = "b, h, q_idx, kv_idx", "b, h, q_idx, kv_idx"
    else:
        params, args = "score, b, h, q_idx, kv_idx", "score, b, h, q_idx, kv_idx"
    body = _expr(mod, offsets, args, iter(range(len(leaves))))
    name = f"_flex_{mod.kind}{'_grad' if grad else ''}_{next(_COUNTER)}"
    src = f"def {name}({params}, MI, MF):\n    return {body}\n"
    filename = f"<kernels.flex generated {name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace = {f"leaf{i}": f for i, f in enumerate(fns)}
    namespace.update(tl=tl, triton=triton)
    exec(compile(src, filename, "exec"), namespace)
    fn = triton.jit(namespace[name])
    _GENERATED[key] = fn
    return fn


def _shape_key(mod):
    if mod.op:
        return (mod.op, tuple(_shape_key(c) for c in mod.children))
    return (mod.user, len(mod.ints), len(mod.floats))


def pack(mod: Mod, device) -> tuple:
    """(fn, MI, MF[, grad_fn]) for the kernel: the generated caller, the int32 and
    float32 buffers (at least one element each, on ``device``) and, for a score mod,
    the generated derivative (None when a leaf is a user's function: the backward
    then takes a central difference). Cached on the Mod per device (a call does not
    copy the buffers to the device again)."""
    device = torch.device(device)
    cache = mod.__dict__.setdefault("_packs", {})
    if device not in cache:
        cache[device] = _pack(mod, device)
    return cache[device]


def _pack(mod: Mod, device) -> tuple:
    offsets, ni, nf = _layout(mod)
    ints, floats = [], []
    iarr, farr = [], []
    for leaf in mod.leaves():
        base_i = [ni + sum(a.numel() for a in iarr)]
        base_f = [nf + sum(a.numel() for a in farr)]
        for a in leaf.int_arrays:
            base_i.append(base_i[-1] + a.numel())
        for a in leaf.float_arrays:
            base_f.append(base_f[-1] + a.numel())
        for v in leaf.ints:
            if isinstance(v, tuple):  # ("array", j): the j-th array's offset
                arrays_base = base_f if leaf.float_arrays else base_i
                ints.append(arrays_base[v[1]])
            else:
                ints.append(int(v))
        floats.extend(float(v) for v in leaf.floats)
        iarr.extend(leaf.int_arrays)
        farr.extend(leaf.float_arrays)
    mi = torch.cat([torch.tensor(ints, dtype=torch.int32)] + [a.cpu() for a in iarr])
    mf = torch.cat(
        [torch.tensor(floats, dtype=torch.float32)] + [a.cpu() for a in farr]
    )
    if mi.numel() == 0:
        mi = torch.zeros(1, dtype=torch.int32)
    if mf.numel() == 0:
        mf = torch.zeros(1, dtype=torch.float32)
    fn = _generate(mod)
    out = (fn, mi.to(device), mf.to(device))
    if mod.kind == "score":
        numeric = any(leaf.grad is None for leaf in mod.leaves())
        grad = None if numeric else _generate(mod, True)
        out = out + (grad,)
    return out
