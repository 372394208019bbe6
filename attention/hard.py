"""Soft vs hard attention in NumPy: argmax, sampled (Gumbel-max), top-k,
Gumbel-softmax with its straight-through estimator, and the REINFORCE
(score-function) gradient with a baseline.

Shapes follow ``attention.core``: q (..., N_q, d), k (..., N_k, d), v (..., N_k, d_v);
every function works for one head or for (B, H, N, d). Masks are boolean, True = may
attend; causal masks align bottom-right (query i sees keys j <= i + N_k - N_q).

The edge rules, the same as the kernels in ``kernels.hard``:

* a query row that sees no key (a mask, causal N_q > N_k, or N_k = 0) gets output 0 and
  index -1, never NaN; -1 means exactly that and nothing else;
* a NaN score ranks above every number, as in ``np.argmax`` and ``torch.argmax``: a row
  whose visible scores hold a NaN gets output NaN (its choice is undefined: soft
  attention's rule, a NaN in a row's inputs gives NaN in that row only), and its index
  names its first NaN key (sampling too); top-k keeps the NaN keys, ranked as +inf (so
  first, lowest index first, unless the row also holds +inf scores, which tie with
  them), and its weights are NaN. So a NaN in q reaches only that query's row, a NaN
  in k every row that sees that key, and a NaN in v only the rows that select (or keep)
  that value row.

The gradient estimators work on *logits* ``s`` of shape (..., N)
and a per-category loss ``f`` of shape (..., N) (the loss if position z is chosen),
so that the exact gradient of the expected loss, ``p * (f - <p, f>)``,
is available to measure bias and variance against.

Their HBM traffic (``"soft"``, ``"hard"``, ``"topk"``) is counted by
``attention.memory.selection``.
"""

from __future__ import annotations

import numpy as np

from .checks import as_real_array, check_bool, check_int, check_scale
from .core import (
    _check_qkv,
    attention_keep,
    scaled_dot_product_attention,
    softmax,
    weighted_sum,
)

# ---------------------------------------------------------------------------------
# Scores and the three forward passes
# ---------------------------------------------------------------------------------


def attention_scores(q, k, scale=None, causal=False, mask=None):
    """Scaled scores s = q k^T * scale,
    with -inf where a key is hidden. (..., N_q, N_k)."""
    q, k, _, _ = _check_qkv(q, k, k)
    causal = check_bool("causal", causal)
    scale = check_scale("scale", scale, q.shape[-1])
    s = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., N_q, N_k)
    keep = attention_keep(q.shape[-2], k.shape[-2], causal, mask, s.shape)
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    return s


def _check_v(v, s):
    """v (..., N_k, d_v) matching scores s (..., N_q, N_k)."""
    v = as_real_array("v", v, 2)
    if v.shape[-2] != s.shape[-1]:
        raise ValueError(
            f"v must be (..., N_k, d_v) with N_k={s.shape[-1]} keys, got {v.shape}"
        )
    try:
        np.broadcast_shapes(v.shape[:-2], s.shape[:-2])
    except ValueError:
        raise ValueError(
            f"v's leading dims {v.shape[:-2]} do not broadcast with the "
            f"scores' {s.shape[:-2]}"
        ) from None
    return v


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            "rng must be a numpy.random.Generator "
            "(np.random.default_rng(seed)), "
            f"got {type(rng).__name__}"
        )
    return rng


def soft_attention(q, k, v, scale=None, causal=False, mask=None, return_weights=False):
    """o = softmax(s) v: a weighted sum over *all* visible positions
    (``core`` does the work)."""
    return scaled_dot_product_attention(
        q, k, v, mask=mask, causal=causal, scale=scale, return_weights=return_weights
    )


def _check_index(idx, n: int, what: str) -> np.ndarray:
    """idx as an integer array with every entry -1 (none) or in 0..n-1."""
    idx = np.asarray(idx)
    if idx.dtype == np.bool_ or not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"idx must be an integer array, got dtype {idx.dtype}")
    if idx.size and (idx.min() < -1 or idx.max() >= n):
        raise ValueError(
            f"idx must be -1 (none) or in 0..{n - 1} ({what}), got "
            f"values in {idx.min()}..{idx.max()}"
        )
    return idx


def gather_rows(v, idx):
    """o[..., i, :] = v[..., idx[..., i], :],
    and 0 where idx is -1.  v (..., N_k, d_v)."""
    v = as_real_array("v", v, 2)
    idx = _check_index(idx, v.shape[-2], f"v has {v.shape[-2]} rows")
    if v.shape[-2] == 0:  # no key: every row is empty
        return np.zeros(
            np.broadcast_shapes(idx.shape, v.shape[:-2] + (1,)) + v.shape[-1:]
        )
    safe = np.where(idx < 0, 0, idx)
    o = np.take_along_axis(v, safe[..., None], axis=-2)  # (..., N_q, d_v)
    return np.where(idx[..., None] < 0, 0.0, o)


def argmax_index(s):
    """Row argmax of scores (..., N); ties go to the lowest index; -1 for an all -inf
    (or empty) row only. A NaN ranks above every number (``np.argmax``'s and
    ``torch.argmax``'s rule): a row with a NaN gets the index of its first NaN."""
    s = as_real_array("s", s, 1)
    if s.shape[-1] == 0:
        return np.full(s.shape[:-1], -1, dtype=np.int64)
    # np.argmax returns the first maximum (lowest index wins), or the first NaN
    idx = np.argmax(s, axis=-1)
    m = np.take_along_axis(s, idx[..., None], -1)[..., 0]
    return np.where(np.isneginf(m), -1, idx)


def hard_attention(q, k, v, scale=None, causal=False, mask=None, return_index=False):
    """o[i] = v[argmax_j s_ij]: one position per query, a discrete choice.

    Equivalent to soft attention with the one-hot weights ``one_hot(idx, N_k)``.
    """
    s = attention_scores(q, k, scale, causal, mask)  # (..., N_q, N_k)
    v = _check_v(v, s)
    idx = argmax_index(s)  # (..., N_q)
    o = _nan_rows(gather_rows(v, idx), s)  # (..., N_q, d_v)
    return (o, idx) if check_bool("return_index", return_index) else o


def _nan_rows(o, s):
    """NaN in every output row whose scores hold a NaN (its choice is undefined)."""
    return np.where(np.isnan(s).any(axis=-1)[..., None], np.nan, o)


def one_hot(idx, n):
    """(..., N_q) int -> (..., N_q, n) float one-hot rows;
    an index of -1 gives a zero row (any other index outside 0..n-1: ValueError)."""
    n = check_int("n", n, 0)
    idx = _check_index(idx, n, f"n = {n}")
    return (idx[..., None] == np.arange(n)).astype(float)


def sample_index(p, rng):
    """One sample per row from the categorical distribution p (..., N) by inverse CDF;
    -1 if p = 0 (nothing to draw). A row with a NaN draws its first NaN position (the
    Gumbel-max trick's answer: log p + g is NaN there and NaN ranks first)."""
    p = as_real_array("p", p, 1).astype(float)
    _check_rng(rng)
    if p.shape[-1] == 0:
        raise ValueError(f"p must have at least one category, got shape {p.shape}")
    if np.any(p < 0):
        raise ValueError("p must be non-negative (probabilities)")
    nan_row = np.isnan(p).any(axis=-1)
    nan_at = np.argmax(np.isnan(p), axis=-1)  # the first NaN of a NaN row
    p = np.where(nan_row[..., None], 0.0, p)
    c = np.cumsum(p, axis=-1)  # (..., N)
    total = c[..., -1:]
    u = rng.random(p.shape[:-1] + (1,)) * total
    idx = np.minimum((c <= u).sum(axis=-1), p.shape[-1] - 1)
    # never land on a zero-probability position (guards against round-off at the ends)
    idx = np.where(
        np.take_along_axis(p, idx[..., None], -1)[..., 0] > 0,
        idx,
        np.argmax(p > 0, axis=-1),
    )
    return np.where(nan_row, nan_at, np.where(total[..., 0] > 0, idx, -1))


def stochastic_hard_attention(
    q, k, v, rng, scale=None, causal=False, mask=None, return_index=False
):
    """Stochastic hard attention (Show, Attend and Tell): z_i ~ softmax(s_i), o_i =
    v[z_i]; a row with a +inf score draws its first +inf key, as ``argmax_index``."""
    _check_rng(rng)
    s = attention_scores(q, k, scale, causal, mask)
    v = _check_v(v, s)
    p = softmax(s, axis=-1)  # (..., N_q, N_k); NaN and +inf rows are NaN
    # the kernel's Gumbel-max answer, read from s (softmax makes the whole row NaN): a
    # NaN row draws its first NaN key; a row with a +inf score its first +inf key (s + g
    # is +inf there, above every finite draw), as argmax_index picks them
    fixed = np.isnan(s).any(axis=-1) | np.isposinf(s).any(axis=-1)
    idx = np.where(
        fixed,
        argmax_index(s),
        sample_index(np.where(fixed[..., None], 0.0, p), rng),
    )  # (..., N_q)
    o = _nan_rows(gather_rows(v, idx), s)
    return (o, idx) if check_bool("return_index", return_index) else o


def topk_index(s, topk):
    """Indices of the ``topk`` largest scores per row, by score (desc) then index (asc).

    (..., N_q, N_k) -> (..., N_q, topk); slots beyond the number of visible keys are -1.
    A NaN score ranks as +inf (the kernel's rule; ``torch.topk`` also puts NaN first):
    a row with NaN scores keeps those keys first.
    """
    s = as_real_array("s", s, 1)
    topk = check_int("topk", topk, 1)
    n_k = s.shape[-1]
    kk = min(topk, n_k)
    rank = np.where(np.isnan(s), np.inf, s)
    # stable: ties keep lowest index
    order = np.argsort(-rank, axis=-1, kind="stable")[..., :kk]
    visible = np.take_along_axis(rank, order, -1) > -np.inf  # +inf scores are kept
    idx = np.where(visible, order, -1)
    if kk < topk:  # pad to topk slots
        pad = -np.ones(idx.shape[:-1] + (topk - kk,), dtype=idx.dtype)
        idx = np.concatenate([idx, pad], axis=-1)
    return idx


def topk_weights(s, topk):
    """Softmax over the ``topk`` largest scores of each row,
    0 elsewhere.  (..., N_q, N_k)."""
    s = as_real_array("s", s, 1)
    idx = topk_index(s, topk)  # (..., N_q, topk)
    keep = one_hot(idx, s.shape[-1]).sum(axis=-2) > 0  # (..., N_q, N_k)
    return np.where(
        np.isnan(s).any(axis=-1, keepdims=True), np.nan, softmax(s, axis=-1, mask=keep)
    )


def topk_attention(
    q, k, v, topk, scale=None, causal=False, mask=None, return_weights=False
):
    """o = softmax over the k best scores of each row, times V:
    k rows of V per query."""
    topk = check_int("topk", topk, 1)
    s = attention_scores(q, k, scale, causal, mask)
    v = _check_v(v, s)
    p = topk_weights(s, topk)  # (..., N_q, N_k); NaN rows NaN
    keep = p > 0  # the kept keys: every other value row is selected out, never 0 * NaN
    # (..., N_q, d_v)
    o = _nan_rows(weighted_sum(np.where(np.isnan(p), 0.0, p), v, keep), s)
    return (o, p) if check_bool("return_weights", return_weights) else o


# ---------------------------------------------------------------------------------
# Gradients: the softmax Jacobian, Gumbel noise, relaxations and estimators
# ---------------------------------------------------------------------------------


def softmax_jacobian(p):
    """J[a, b] = dp_a / ds_b = p_a (delta_ab - p_b) for one row p (N,) -> (N, N).

    Every entry is nonzero where p is: each position's score moves every weight.
    """
    p = as_real_array("p", p).astype(float)
    if p.ndim != 1:
        raise ValueError(
            f"p must be one row (N,), got shape {p.shape}; use "
            f"softmax_backward for batches"
        )
    return np.diag(p) - np.outer(p, p)


def softmax_backward(p, grad_p):
    """Vector-Jacobian product of softmax: dL/ds = p *
    (dL/dp - <p, dL/dp>).  (..., N)."""
    p, grad_p = as_real_array("p", p, 1), as_real_array("grad_p", grad_p, 1)
    if p.shape != grad_p.shape:
        raise ValueError(
            f"p and grad_p must have one shape, got {p.shape} and {grad_p.shape}"
        )
    return p * (grad_p - (p * grad_p).sum(axis=-1, keepdims=True))


def gumbel(shape, rng):
    """Standard Gumbel noise g = -log(-log U), U ~ Uniform(0, 1)."""
    u = _check_rng(rng).random(shape)
    u = np.clip(u, np.finfo(float).tiny, 1.0)  # U = 0 would give g = -inf
    return -np.log(-np.log(u))


def gumbel_max_sample(logits, rng):
    """argmax(logits + Gumbel noise):
    an exact sample from softmax(logits).  (..., N) -> (...)."""
    logits = as_real_array("logits", logits, 1).astype(float)
    return argmax_index(logits + gumbel(logits.shape, rng))


def gumbel_softmax(logits, tau, rng=None, noise=None, hard=False):
    """The Gumbel-softmax (Concrete) relaxation y = softmax((logits + g) / tau).

    tau -> 0 gives the one-hot Gumbel-max sample, tau -> inf the uniform distribution.
    With ``hard=True`` the forward value is that one-hot sample (the straight-through
    estimator then back-propagates through the soft y: see ``straight_through_grad``).
    Pass ``noise`` to reuse a Gumbel draw (e.g. to sweep tau on the same sample).
    """
    tau = check_scale("tau", tau, 1)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    hard = check_bool("hard", hard)
    logits = as_real_array("logits", logits, 1).astype(float)
    if noise is None:
        g = gumbel(logits.shape, rng)
    else:
        g = as_real_array("noise", noise)
        if g.shape != logits.shape:
            raise ValueError(
                f"noise must have logits' shape {logits.shape}, got {g.shape}"
            )
    y = softmax((logits + g) / tau, axis=-1)
    if hard:  # a NaN row stays NaN (its one-hot is undefined)
        return np.where(
            np.isnan(y).any(axis=-1, keepdims=True),
            np.nan,
            one_hot(argmax_index(y), logits.shape[-1]),
        )
    return y


def straight_through_grad(y_soft, grad_y, tau):
    """Straight-through Gumbel-softmax: the forward used one_hot(argmax y),
    the backward pretends it used y = softmax((s + g)/tau):  dL/ds = (1/tau) y *
    (dL/dy - <y, dL/dy>).

    A biased estimate of the gradient of E[L]: it uses dL/dy at the *sampled* one-hot.
    """
    tau = check_scale("tau", tau, 1)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    return softmax_backward(y_soft, grad_y) / tau


def expected_loss_grad(logits, f):
    """Exact gradient of E_{z ~ softmax(logits)}[f(z)] w.r.t.
    the logits: p * (f - <p, f>).

    ``f`` (..., N) is the loss incurred when position z is chosen.
    """
    logits = as_real_array("logits", logits, 1).astype(float)
    p = softmax(logits, axis=-1)
    try:
        f = np.broadcast_to(as_real_array("f", f).astype(float), logits.shape)
    except ValueError:
        raise ValueError(
            f"f must broadcast to logits' shape {logits.shape}, got {np.shape(f)}"
        ) from None
    return softmax_backward(p, f)


def reinforce_grad(logits, f, rng, n_samples=1, baseline=None, return_samples=False):
    """REINFORCE / score-function estimates of d E[f(z)] / d
    logits, z ~ softmax(logits).

    g = (f(z) - b) * d log p(z) / d logits = (f(z) - b) * (one_hot(z) - p).

    ``baseline``: None (b = 0), a number or array broadcastable to (...) (any b that
    does not depend on z keeps the estimate unbiased), or ``"loo"``: the leave-one-out
    mean of the other n_samples - 1 draws' losses (unbiased too; needs n_samples >= 2).
    Returns (n_samples, ..., N): one estimate per draw; average over axis 0 to use them.
    With ``return_samples`` also the drawn positions z (n_samples, ...).
    """
    logits = as_real_array("logits", logits, 1).astype(float)
    try:
        f = np.broadcast_to(as_real_array("f", f).astype(float), logits.shape)
    except ValueError:
        raise ValueError(
            f"f must broadcast to logits' shape {logits.shape}, got {np.shape(f)}"
        ) from None
    n_samples = check_int("n_samples", n_samples, 1)
    _check_rng(rng)
    return_samples = check_bool("return_samples", return_samples)
    p = softmax(logits, axis=-1)  # (..., N)
    n = logits.shape[-1]
    z = np.stack([sample_index(p, rng) for _ in range(n_samples)])  # (S, ...)
    fz = np.take_along_axis(
        np.broadcast_to(f, (n_samples,) + f.shape), z[..., None], -1
    )[..., 0]
    if baseline is None:
        b = 0.0
    elif isinstance(baseline, str):
        if baseline != "loo":
            raise ValueError(
                f"baseline must be None, a number or 'loo', got {baseline!r}"
            )
        if n_samples < 2:
            raise ValueError("the leave-one-out baseline needs n_samples >= 2")
        b = (fz.sum(axis=0, keepdims=True) - fz) / (n_samples - 1)  # (S, ...)
    else:
        b = np.asarray(baseline, dtype=float)
    score = one_hot(z, n) - p  # (S, ..., N): d log p(z) / d logits
    g = (fz - b)[..., None] * score
    return (g, z) if return_samples else g


# ---------------------------------------------------------------------------------
# A small task where the right answer is to attend to ONE position: retrieval.
# Each example has N keys k_j (random vectors) with values v_j; the query is a noisy
# copy of one key, x = k_t + noise, and the target is its value v_t. The only
# parameter is W (d, d): scores s_j = (x W) . k_j. With W = 0 attention is uniform;
# a large multiple of the identity attends to the matching key.
# ---------------------------------------------------------------------------------

METHODS = ("soft", "argmax", "reinforce", "reinforce+baseline", "gumbel-st", "topk")


def retrieval_task(n_examples, n_keys=16, d=16, d_v=8, noise=0.5, rng=None):
    """x (n, d), keys (n, N, d), values (n, N, d_v), target (n,) int."""
    n_examples = check_int("n_examples", n_examples, 1)
    n_keys, d, d_v = (
        check_int("n_keys", n_keys, 1),
        check_int("d", d, 1),
        check_int("d_v", d_v, 1),
    )
    rng = np.random.default_rng(0) if rng is None else _check_rng(rng)
    keys = rng.standard_normal((n_examples, n_keys, d)) / np.sqrt(d)  # (n, N, d)
    values = rng.standard_normal((n_examples, n_keys, d_v))  # (n, N, d_v)
    target = rng.integers(0, n_keys, n_examples)
    x = keys[np.arange(n_examples), target] + noise * rng.standard_normal(
        (n_examples, d)
    ) / np.sqrt(d)
    return {"x": x, "keys": keys, "values": values, "target": target}


def retrieval_scores(W, task):
    """s[b, j] = (x_b W) . k_bj.  (n, N)."""
    return np.einsum("bd,de,bje->bj", task["x"], W, task["keys"])


def retrieval_losses(task):
    """f[b, z] = ||v_bz - v_bt||^2: the loss if example b attends
    (hard) to key z.  (n, N)."""
    v, t = task["values"], task["target"]
    return ((v - v[np.arange(len(t)), t][:, None, :]) ** 2).sum(-1)


def retrieval_score_grad(method, s, task, rng, tau=1.0, topk=4, baseline=0.0):
    """Gradient of the batch-mean loss w.r.t. the scores s (n, N), as each method
    estimates it, and the loss the method sees.

    soft       L = ||sum_j p_j v_j - v_t||^2, exact gradient through the softmax.
    argmax     o = v[argmax s]: the gradient is exactly zero (piecewise constant).
    reinforce  z ~ p, L = f(z); (f(z) - b) (one_hot(z) - p), with ``baseline`` b.
    gumbel-st  z = argmax(s + g), L = f(z); backward through y = softmax((s + g)/tau).
    topk       soft attention restricted to the ``topk`` best scores.
    """
    n, N = s.shape
    v, t = task["values"], task["target"]
    v_t = v[np.arange(n), t]  # (n, d_v)
    if method in ("soft", "topk"):
        p = softmax(s, axis=-1) if method == "soft" else topk_weights(s, topk)  # (n, N)
        o = np.einsum("bj,bjd->bd", p, v)
        grad_o = 2 * (o - v_t) / n
        grad_p = np.einsum("bd,bjd->bj", grad_o, v)
        return softmax_backward(p, grad_p), float(((o - v_t) ** 2).sum(-1).mean())
    f = retrieval_losses(task)  # (n, N)
    if method == "argmax":
        z = argmax_index(s)
        return np.zeros_like(s), float(f[np.arange(n), z].mean())
    if method in ("reinforce", "reinforce+baseline"):
        b = baseline if method == "reinforce+baseline" else 0.0
        g, z = reinforce_grad(s, f, rng, baseline=b, return_samples=True)
        return g[0] / n, float(f[np.arange(n), z[0]].mean())
    if method == "gumbel-st":
        g_noise = gumbel(s.shape, rng)
        y = softmax((s + g_noise) / tau, axis=-1)  # (n, N) the relaxed sample
        z = argmax_index(y)  # the forward uses the hard sample
        o = v[np.arange(n), z]
        grad_y = np.einsum("bd,bjd->bj", 2 * (o - v_t) / n, v)  # dL/dy at the one-hot
        return straight_through_grad(y, grad_y, tau), float(f[np.arange(n), z].mean())
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def retrieval_W_grad(grad_s, task):
    """Chain rule through s = (x W) . k:  dL/dW = sum_b x_b^T (sum_j dL/ds_bj k_bj).

    Returns (d, d)."""
    return np.einsum("bd,bj,bje->de", task["x"], grad_s, task["keys"])


def retrieval_accuracy(W, task):
    """Fraction of examples whose highest score is the target key."""
    return float((argmax_index(retrieval_scores(W, task)) == task["target"]).mean())


def train_retrieval(
    method,
    steps=300,
    batch=32,
    lr=0.05,
    n_keys=16,
    d=16,
    tau=1.0,
    topk=4,
    seed=0,
    eval_every=10,
    progress=None,
):
    """Train W with Adam on fresh batches: {"step", "accuracy", "loss"} lists, "W".

    ``accuracy`` is hard retrieval accuracy (argmax of the scores) on a fixed test set,
    the same yardstick for every method. ``reinforce+baseline`` uses a running mean of
    past losses as its baseline (independent of the current sample, so still unbiased).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    steps, batch = check_int("steps", steps, 0), check_int("batch", batch, 1)
    eval_every = check_int("eval_every", eval_every, 1)
    lr = check_scale("lr", lr, 1)  # a NaN rate would train to chance without a word
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    tau = check_scale("tau", tau, 1)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    topk = check_int("topk", topk, 1)
    rng = np.random.default_rng(seed)
    test = retrieval_task(512, n_keys, d, rng=np.random.default_rng(10_000 + seed))
    W = np.zeros((d, d))
    m, u = np.zeros_like(W), np.zeros_like(W)
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    baseline, out = None, {"step": [], "accuracy": [], "loss": []}
    for step in range(steps + 1):
        if step % eval_every == 0:
            out["step"].append(step)
            out["accuracy"].append(retrieval_accuracy(W, test))
        if step == steps:
            break
        task = retrieval_task(batch, n_keys, d, rng=rng)
        s = retrieval_scores(W, task)
        b = 0.0 if baseline is None else baseline
        grad_s, loss = retrieval_score_grad(
            method, s, task, rng, tau=tau, topk=topk, baseline=b
        )
        baseline = loss if baseline is None else 0.9 * baseline + 0.1 * loss
        out["loss"].append(loss)
        gW = retrieval_W_grad(grad_s, task)
        m = beta1 * m + (1 - beta1) * gW
        u = beta2 * u + (1 - beta2) * gW**2
        W = W - lr * (m / (1 - beta1 ** (step + 1))) / (
            np.sqrt(u / (1 - beta2 ** (step + 1))) + eps
        )
        if progress is not None:
            progress.update(1)
    return {**out, "W": W}  # the trained (d, d) matrix too


def estimator_stats(W, task, n_draws=500, rng=None, tau=1.0, topk=4, methods=METHODS):
    """Each method's gradient dL/dW measured against the exact gradient of the expected
    hard loss E_{z ~ softmax(s)}[f(z)] on one batch (``task``), over ``n_draws`` draws.

    Returns {method: {"rel_bias", "rel_bias_se", "rel_std"}}: ||E[g] - g*|| / ||g*||,
    its standard error (from the per-draw spread), and sqrt(E||g - E[g]||^2) / ||g*||.
    Deterministic methods (soft, argmax, top-k) have rel_std 0; their bias says how far
    the gradient of *their* objective is from that of the expected hard loss.
    ``reinforce+baseline`` uses the constant baseline b = mean_b E_p[f] of this batch.
    """
    rng = np.random.default_rng(0) if rng is None else _check_rng(rng)
    n_draws = check_int("n_draws", n_draws, 1)
    n = len(task["target"])
    s = retrieval_scores(W, task)
    f = retrieval_losses(task)
    exact = retrieval_W_grad(expected_loss_grad(s, f) / n, task)
    b = float((softmax(s, axis=-1) * f).sum(-1).mean())
    scale = np.linalg.norm(exact)
    out = {}
    for method in methods:
        draws = 1 if method in ("soft", "argmax", "topk") else n_draws
        g = np.stack(
            [
                retrieval_W_grad(
                    retrieval_score_grad(
                        method, s, task, rng, tau=tau, topk=topk, baseline=b
                    )[0],
                    task,
                )
                for _ in range(draws)
            ]
        )  # (draws, d, d)
        mean = g.mean(axis=0)
        var = ((g - mean) ** 2).sum(axis=(1, 2)).mean() if draws > 1 else 0.0
        out[method] = {
            "rel_bias": float(np.linalg.norm(mean - exact) / scale),
            "rel_bias_se": float(np.sqrt(var / draws) / scale),
            "rel_std": float(np.sqrt(var) / scale),
        }
    return out
