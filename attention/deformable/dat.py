"""DAT (Xia et al. 2022) in NumPy: the offset network, DAT's deformable relative
position bias, the layer itself (``dat_attention``) and the project-then-sample twin of
the fused kernel (``deformable_attention``)."""

from __future__ import annotations

import math

import numpy as np

from ..checks import as_real_array, check_bool, check_int, check_scale
from ..core import (
    merge_heads,
    scaled_dot_product_attention,
    softmax,
    split_heads,
    weighted_sum,
)
from .sampling import bilinear_sample, bilinear_sample_pixels, reference_grid, to_pixels

# --------------------------------------------------------------------------------------
# The offset network: depthwise conv (stride r) -> [LayerNorm] -> GELU -> 1x1 conv to 2
# -> tanh * range
# --------------------------------------------------------------------------------------


def depthwise_conv2d(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    stride: int = 1,
    padding: int = 0,
) -> np.ndarray:
    """Depthwise 2-D convolution (cross-correlation, like torch): one k x k filter per
    channel.

    x: (B, C, H, W); weight: (C, k, k); bias: (C,). Returns (B, C, H_o, W_o) with
    H_o = (H + 2*padding - k) // stride + 1.
    """
    x, weight = as_real_array("x", x), as_real_array("weight", weight)
    if x.ndim != 4:
        raise ValueError(f"x must be (B, C, H, W), got shape {x.shape}")
    if weight.ndim != 3:
        raise ValueError(f"weight must be (C, k, k), got shape {weight.shape}")
    stride, padding = check_int("stride", stride, 1), check_int("padding", padding, 0)
    b, c, h, w = x.shape
    k = weight.shape[-1]
    if weight.shape != (c, k, k):
        raise ValueError(
            f"weight must be (C, k, k) = ({c}, {k}, {k}), got {weight.shape}"
        )
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    h_o = (h + 2 * padding - k) // stride + 1
    w_o = (w + 2 * padding - k) // stride + 1
    out = np.zeros((b, c, h_o, w_o), dtype=np.result_type(x, weight))
    for i in range(k):  # one shifted, strided view of the input per filter tap
        for j in range(k):
            patch = xp[
                :, :, i : i + stride * h_o : stride, j : j + stride * w_o : stride
            ]
            out += weight[None, :, i, j, None, None] * patch  # (B, C, H_o, W_o)
    if bias is not None:
        out += bias[None, :, None, None]
    return out


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU(x) = x * Phi(x), with the exact Gaussian CDF (torch's default)."""
    return 0.5 * x * (1.0 + _erf(np.asarray(x, dtype=np.float64) / math.sqrt(2.0)))


#: torch.nn.LayerNorm's default epsilon, which DAT's offset network uses.
LAYER_NORM_EPS = 1e-5


def channel_layer_norm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = LAYER_NORM_EPS
) -> np.ndarray:
    """LayerNorm over the channel axis of a channels-first map x: (B, C, H, W).

    Each position's C channels are normalised to mean 0 and (biased) variance 1, then
    scaled by ``weight`` (C,) and shifted by ``bias`` (C,): DAT's ``LayerNormProxy``
    (``nn.LayerNorm(C)`` applied channels-last).
    """
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    return y * weight[None, :, None, None] + bias[None, :, None, None]


def init_offset_params(
    channels: int,
    kernel_size: int,
    rng: np.random.Generator,
    scale: float = 1.0,
    layer_norm: bool = False,
) -> dict:
    """Weights of the offset network for ``channels`` channels per offset group.

    With ``layer_norm`` the network gets DAT's LayerNorm between the depthwise
    convolution and the GELU (``ln_w`` = 1, ``ln_b`` = 0, torch's initialisation).
    """
    channels = check_int("channels", channels, 1)
    kernel_size = check_int("kernel_size", kernel_size, 1)
    fan = kernel_size * kernel_size
    p = {
        "w_dw": rng.normal(
            0, scale / math.sqrt(fan), (channels, kernel_size, kernel_size)
        ),
        "b_dw": np.zeros(channels),
        "w_pw": rng.normal(0, scale / math.sqrt(channels), (2, channels)),
    }
    if check_bool("layer_norm", layer_norm):
        p.update(ln_w=np.ones(channels), ln_b=np.zeros(channels))
    return p


def offset_network(
    q_map: np.ndarray, params: dict, stride: int, offset_range: float
) -> np.ndarray:
    """Predict one offset per reference point from the queries of one offset group.

    q_map: (B', C_g, H, W) queries of a group, channels first. A depthwise k x k conv
    with stride r (padding k // 2) pools each r x r neighbourhood, then (when ``params``
    holds ``ln_w`` and ``ln_b``, as DAT's network does) a LayerNorm over the channels,
    GELU, a 1x1 conv to 2 channels (dx, dy), and ``tanh * offset_range`` bounds the
    offsets (in normalised units). Returns (B', H_r, W_r, 2) with H_r = ceil(H / r).
    """
    k = params["w_dw"].shape[-1]
    hid = depthwise_conv2d(q_map, params["w_dw"], params["b_dw"], stride, k // 2)
    if "ln_w" in params:
        hid = channel_layer_norm(hid, params["ln_w"], params["ln_b"])
    raw = np.einsum("oc,bchw->bhwo", params["w_pw"], gelu(hid))  # (B', H_r, W_r, 2)
    return np.tanh(raw) * offset_range


# --------------------------------------------------------------------------------------
# DAT's deformable relative position bias
# --------------------------------------------------------------------------------------


def init_rpb_table(
    n_heads: int, height: int, width: int, rng: np.random.Generator, std: float = 0.01
) -> np.ndarray:
    """A relative position bias table (n_heads, 2H - 1, 2W - 1) for an H x W query map,
    drawn like DAT's (``trunc_normal_(std=0.01)``, whose cut at +-2 is +-200 std)."""
    n_heads = check_int("n_heads", n_heads, 1)
    shape = (
        n_heads,
        2 * check_int("height", height, 1) - 1,
        2 * check_int("width", width, 1) - 1,
    )
    return np.clip(rng.normal(0.0, std, shape), -2.0, 2.0)


def relative_position_bias(
    rpb_table: np.ndarray,
    points: np.ndarray,
    height: int,
    width: int,
    align_corners: bool = False,
) -> np.ndarray:
    """DAT's deformable relative position bias for every (query, sample) pair.

    rpb_table: (n_heads, 2H - 1, 2W - 1), one learnable table per head for an H x W
    query map; points: (B, G, N_s, 2) normalised (x, y) sampling points, the points of
    group g serving heads g * n_heads/G ... (g + 1) * n_heads/G - 1. Returns
    (B, n_heads, H * W, N_s), queries row-major.

    The displacement of sample n from query (i, j) is measured in pixels of the map,
    in the same ``align_corners`` convention that sampled the keys:
    ``(dx, dy) = (j, i) - to_pixels(point_n)``. Entry ``[h, H - 1 + dy, W - 1 + dx]``
    of the table is the bias of an integer displacement; a fractional one is read
    bilinearly between the four nearest entries, and a corner beyond the table reads 0
    (zero padding, as DAT's ``grid_sample``). With ``align_corners=True`` this is DAT's
    code exactly: ``grid_sample(table, (q - p) / 2, align_corners=True)`` with q the
    query's normalised position ``2 j / (W - 1) - 1`` maps the normalised displacement
    to table column ``(q - p) (W - 1) / 2 + W - 1``, which is ``dx + W - 1``.
    """
    table = as_real_array("rpb_table", rpb_table)
    points = as_real_array("points", points)
    height, width = check_int("height", height, 1), check_int("width", width, 1)
    if table.ndim != 3 or table.shape[1:] != (2 * height - 1, 2 * width - 1):
        raise ValueError(
            f"rpb_table must be (n_heads, 2H - 1, 2W - 1) = (n_heads, "
            f"{2 * height - 1}, {2 * width - 1}) for an "
            f"{height} x {width} map, got shape {table.shape}"
        )
    n_h = table.shape[0]
    if (
        points.ndim != 4
        or points.shape[-1] != 2
        or points.shape[1] < 1
        or n_h % points.shape[1]
    ):
        raise ValueError(
            f"points must be (B, G, N_s, 2) with G dividing the table's "
            f"n_heads={n_h}, got shape {points.shape}"
        )
    b, g, n_s, _ = points.shape
    h_g, n_q = n_h // g, height * width
    rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    query = np.stack([cols, rows], axis=-1).reshape(n_q, 2).astype(np.float64)
    sample = to_pixels(points, height, width, align_corners)  # (B, G, N_s, 2)
    disp = query[None, None, :, None] - sample[:, :, None]  # (B, G, HW, N_s, 2)
    at = disp + np.array([width - 1.0, height - 1.0])  # table pixel (column, row)
    # group g's h_g tables, channels-last: (B*G, 2H-1, 2W-1, h_g)
    tab = table.reshape(g, h_g, 2 * height - 1, 2 * width - 1).transpose(0, 2, 3, 1)
    tab = np.broadcast_to(tab[None], (b,) + tab.shape).reshape((b * g,) + tab.shape[1:])
    bias = bilinear_sample_pixels(tab, at.reshape(b * g, n_q * n_s, 2))  # (B*G, ., h_g)
    bias = bias.reshape(b, g, n_q, n_s, h_g).transpose(0, 1, 4, 2, 3)
    return bias.reshape(b, n_h, n_q, n_s)  # (B, n_heads, HW, N_s)


def _biased_attention(q, k, v, bias):
    """softmax(q k^T / sqrt(d) + bias) v, computed as ``scaled_dot_product_attention``
    computes it (a zero bias gives the same numbers)."""
    s = (q @ np.swapaxes(k, -1, -2)) * check_scale("scale", None, q.shape[-1]) + bias
    p = softmax(s, axis=-1)
    return weighted_sum(p, v), p


# --------------------------------------------------------------------------------------
# DAT: deformable attention over sampled keys and values
# --------------------------------------------------------------------------------------


def init_dat_params(
    d_model: int,
    n_groups: int,
    kernel_size: int,
    rng: np.random.Generator,
    layer_norm: bool = False,
) -> dict:
    """Projections W_q, W_k, W_v, W_o (d_model x d_model) and the shared offset
    network (with DAT's LayerNorm when ``layer_norm``)."""
    d_model, n_groups = (
        check_int("d_model", d_model, 1),
        check_int("n_groups", n_groups, 1),
    )
    if d_model % n_groups:
        raise ValueError(
            f"n_groups must divide d_model, got d_model={d_model} and "
            f"n_groups={n_groups}"
        )
    s = 1.0 / math.sqrt(d_model)
    p = {n: rng.normal(0, s, (d_model, d_model)) for n in ("w_q", "w_k", "w_v", "w_o")}
    p["offset"] = init_offset_params(
        d_model // n_groups, kernel_size, rng, layer_norm=layer_norm
    )
    return p


def dat_attention(
    x: np.ndarray,
    params: dict,
    n_heads: int,
    n_groups: int,
    stride: int,
    offset_range: float,
    align_corners: bool = False,
    return_all: bool = False,
    rpb_table: np.ndarray | None = None,
):
    """DAT's deformable multi-head attention on a feature map x: (B, H, W, C).

    1. q = x W_q for every position.
    2. reference points: the centres of an H_r x W_r grid (H_r = ceil(H / r) for the
       odd kernel sizes DAT uses).
    3. offsets from the queries of each group: Δp = offset_network(q_g) (with DAT's
       LayerNorm when the offset parameters hold one, see ``init_offset_params``).
    4. deformed points p + Δp.
    5. sample x at them (bilinear, per group of C / G channels), then k̃ = x̃ W_k,
       ṽ = x̃ W_v.
    6. multi-head attention of every query over the N_s = H_r W_r sampled keys, then
       W_o. With ``rpb_table`` (n_heads, 2H - 1, 2W - 1) the logits get DAT's deformable
       relative position bias before the softmax (``relative_position_bias``); without
       it (the default) the layer is DAT without its position bias.

    Returns the output (B, H, W, C), or with ``return_all`` a dict of every
    intermediate (``bias`` is None without a table).
    """
    x = as_real_array("x", x)
    if x.ndim != 4:
        raise ValueError(f"x must be a feature map (B, H, W, C), got shape {x.shape}")
    n_heads = check_int("n_heads", n_heads, 1)
    n_groups = check_int("n_groups", n_groups, 1)
    stride = check_int("stride", stride, 1)
    align_corners = check_bool("align_corners", align_corners)
    return_all = check_bool("return_all", return_all)
    b, h, w, c = x.shape
    g, n_h = n_groups, n_heads
    if c % n_h or c % g or n_h % g:
        raise ValueError(
            f"C={c} must divide by n_heads={n_h} and n_groups={g}, "
            f"and n_heads by n_groups"
        )
    if rpb_table is not None and np.shape(rpb_table)[:1] != (n_h,):
        raise ValueError(
            f"rpb_table must be (n_heads, 2H - 1, 2W - 1) with "
            f"n_heads={n_h}, got shape {np.shape(rpb_table)}"
        )
    c_g = c // g
    q = x @ params["w_q"]  # (B, H, W, C)
    q_g = q.reshape(b, h, w, g, c_g).transpose(0, 3, 4, 1, 2).reshape(b * g, c_g, h, w)
    offsets = offset_network(q_g, params["offset"], stride, offset_range)
    h_r, w_r = offsets.shape[1:3]  # offsets: (B*G, H_r, W_r, 2)
    n_s = h_r * w_r
    ref = reference_grid(h_r, w_r)  # (N_s, 2)
    points = ref[None] + offsets.reshape(b * g, n_s, 2)  # (B*G, N_s, 2)
    x_g = x.reshape(b, h, w, g, c_g).transpose(0, 3, 1, 2, 4).reshape(b * g, h, w, c_g)
    x_s = bilinear_sample(x_g, points, align_corners)  # (B*G, N_s, C_g)
    x_s = x_s.reshape(b, g, n_s, c_g).transpose(0, 2, 1, 3).reshape(b, n_s, c)
    k, v = x_s @ params["w_k"], x_s @ params["w_v"]  # (B, N_s, C)
    qh = split_heads(q.reshape(b, h * w, c), n_h)  # (B, n_heads, H*W, d)
    kh, vh = split_heads(k, n_h), split_heads(v, n_h)  # (B, n_heads, N_s, d)
    bias = None
    if rpb_table is None:
        o, p = scaled_dot_product_attention(qh, kh, vh, return_weights=True)
    else:
        bias = relative_position_bias(
            rpb_table, points.reshape(b, g, n_s, 2), h, w, align_corners
        )  # (B, n_heads, H*W, N_s)
        o, p = _biased_attention(qh, kh, vh, bias)
    out = (merge_heads(o) @ params["w_o"]).reshape(b, h, w, c)  # (B, H, W, C)
    if not return_all:
        return out
    return {
        "q": q,
        "offsets": offsets,
        "reference": ref,
        "points": points.reshape(b, g, n_s, 2),
        "x_sampled": x_s,
        "k": k,
        "v": v,
        "bias": bias,
        "weights": p,
        "o": o,
        "out": out,
    }


def deformable_attention(
    q: np.ndarray,
    k_map: np.ndarray,
    v_map: np.ndarray,
    points: np.ndarray,
    scale: float | None = None,
    align_corners: bool = True,
    return_weights: bool = False,
):
    """Attention of q over keys and values bilinearly sampled from projected maps.

    q: (B, H, N_q, d); k_map, v_map: (B, H, H_f, W_f, d); points: (B, G, N_s, 2) in
    [-1, 1], shared by the H / G heads of each group. The NumPy twin of the fused
    kernel, which has no attention bias: with one offset group this is DAT without its
    relative position bias.
    """
    q, k_map, v_map = (
        as_real_array(n, t) for n, t in (("q", q), ("k_map", k_map), ("v_map", v_map))
    )
    points = as_real_array("points", points)
    align_corners = check_bool("align_corners", align_corners)
    if q.ndim != 4:
        raise ValueError(f"q must be (B, H, N_q, d), got shape {q.shape}")
    b, n_h, n_q, d = q.shape
    if k_map.ndim != 5 or k_map.shape[:2] != (b, n_h) or k_map.shape[-1] != d:
        raise ValueError(
            f"k_map must be (B, H, H_f, W_f, d) with B={b}, H={n_h}, "
            f"d={d}, got shape {k_map.shape}"
        )
    if v_map.ndim != 5 or v_map.shape[:4] != k_map.shape[:4]:
        raise ValueError(
            f"v_map must be (B, H, H_f, W_f, d_v) = {k_map.shape[:4]} + "
            f"(d_v,), got shape {v_map.shape}"
        )
    if (
        points.ndim != 4
        or points.shape[0] != b
        or points.shape[-1] != 2
        or points.shape[1] < 1
        or n_h % points.shape[1]
    ):
        raise ValueError(
            f"points must be (B, G, N_s, 2) with B={b} and G dividing "
            f"H={n_h}, got shape {points.shape}"
        )
    g, n_s = points.shape[1:3]
    h_f, w_f = k_map.shape[2:4]
    pts = np.repeat(points, n_h // g, axis=1).reshape(b * n_h, n_s, 2)  # (B*H, N_s, 2)
    k = bilinear_sample(k_map.reshape(b * n_h, h_f, w_f, d), pts, align_corners)
    v = bilinear_sample(v_map.reshape(b * n_h, h_f, w_f, -1), pts, align_corners)
    k = k.reshape(b, n_h, n_s, d)  # (B, H, N_s, d)
    v = v.reshape(b, n_h, n_s, -1)  # (B, H, N_s, d)
    return scaled_dot_product_attention(
        q, k, v, scale=scale, return_weights=return_weights
    )
