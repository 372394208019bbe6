"""Coordinates and bilinear sampling: reference grids, the normalised <-> pixel maps of
both ``align_corners`` conventions, bilinear interpolation with zero padding, and its
gradient with respect to the map and to the points."""

from __future__ import annotations

import numpy as np

from ..checks import as_real_array, check_bool, check_int

#: Bilinear interpolation reads the four neighbouring pixels of every sample.
CORNERS = 4


# --------------------------------------------------------------------------------------
# Coordinates
# --------------------------------------------------------------------------------------


def reference_grid(h_r: int, w_r: int) -> np.ndarray:
    """Centres of an ``h_r x w_r`` grid of cells covering [-1, 1]^2, as (x, y),
    row-major.

    Returns ``(h_r * w_r, 2)``. With ``align_corners=False`` on a map of
    ``r*h_r x r*w_r`` pixels, cell (i, j) is the centre of the r x r block of pixels it
    stands for.
    """
    h_r, w_r = check_int("h_r", h_r, 1), check_int("w_r", w_r, 1)
    ys = (2.0 * np.arange(h_r) + 1.0) / h_r - 1.0
    xs = (2.0 * np.arange(w_r) + 1.0) / w_r - 1.0
    gy, gx = np.meshgrid(ys, xs, indexing="ij")  # (h_r, w_r) each
    return np.stack([gx, gy], axis=-1).reshape(h_r * w_r, 2)  # (N_s, 2)


def _size(height: int, width: int) -> np.ndarray:
    return np.array(
        [check_int("width", width, 1), check_int("height", height, 1)], dtype=np.float64
    )


def to_pixels(
    points: np.ndarray, height: int, width: int, align_corners: bool = False
) -> np.ndarray:
    """Normalised (x, y) in [-1, 1] -> pixel coordinates (column, row), floats.

    With ``align_corners`` the corners -1 and 1 are the centres of the first and last
    pixels; on a size-1 axis both are its single pixel, at coordinate 0."""
    p = _as_points(points)
    size = _size(height, width)
    if check_bool("align_corners", align_corners):
        return (p + 1.0) / 2.0 * (size - 1.0)
    return ((p + 1.0) * size - 1.0) / 2.0


def to_normalized(
    pixels: np.ndarray, height: int, width: int, align_corners: bool = False
) -> np.ndarray:
    """Pixel coordinates (column, row) -> normalised (x, y); the inverse of
    ``to_pixels`` (which, with ``align_corners`` on a size-1 axis, maps every point
    to pixel 0: there the single pixel's centre is taken as coordinate 0, the middle
    of [-1, 1], rather than dividing by zero)."""
    p = _as_points(pixels, "pixels")
    size = _size(height, width)
    if check_bool("align_corners", align_corners):
        span = np.where(size > 1.0, size - 1.0, 1.0)
        return np.where(size > 1.0, 2.0 * p / span - 1.0, 0.0 * p)
    return (2.0 * p + 1.0) / size - 1.0


def pixel_scale(height: int, width: int, align_corners: bool = False) -> np.ndarray:
    """d(pixel)/d(normalised) for (x, y): the chain-rule factor of every point
    gradient."""
    size = _size(height, width)
    if check_bool("align_corners", align_corners):
        return (size - 1.0) / 2.0
    return size / 2.0


def _as_points(points, name="points"):
    p = as_real_array(name, points, 1).astype(np.float64)
    if p.shape[-1] != 2:
        raise ValueError(f"{name} must be (..., 2) as (x, y), got shape {p.shape}")
    return p


# --------------------------------------------------------------------------------------
# Bilinear interpolation, from scratch, and its gradient
# --------------------------------------------------------------------------------------


def _pixel_corners(px: np.ndarray, height: int, width: int) -> dict:
    """The four corners of bilinear samples at pixel coordinates px (..., 2) as
    (column, row); see ``bilinear_corners``. Also returns the fractional parts."""
    bad = ~np.isfinite(px).all(axis=-1)  # a NaN/inf point: NaN weights, no index
    px = np.where(bad[..., None], 0.0, px)
    x, y = px[..., 0], px[..., 1]
    x0, y0 = np.floor(x), np.floor(y)
    lx, ly = x - x0, y - y0  # fractional parts: weight of the right / lower neighbour
    hx, hy = 1.0 - lx, 1.0 - ly
    cols = np.stack([x0, x0 + 1, x0, x0 + 1], axis=-1)  # (..., 4)
    rows = np.stack([y0, y0, y0 + 1, y0 + 1], axis=-1)  # (..., 4)
    valid = (cols >= 0) & (cols <= width - 1) & (rows >= 0) & (rows <= height - 1)
    weight = np.stack([hy * hx, hy * lx, ly * hx, ly * lx], axis=-1) * valid
    index = np.clip(rows, 0, height - 1) * width + np.clip(cols, 0, width - 1)
    weight = np.where(bad[..., None], np.nan, weight)
    return {
        "index": index.astype(np.int64),
        "valid": valid,
        "weight": weight,
        "bad": bad,
        "lx": lx,
        "ly": ly,
        "hx": hx,
        "hy": hy,
    }


def bilinear_corners(
    points: np.ndarray, height: int, width: int, align_corners: bool = False
):
    """The four corners a bilinear sample reads, their weights and the weights'
    derivatives.

    points: (..., 2) normalised (x, y). Returns a dict of arrays with a trailing corner
    axis of 4, ordered (y0, x0), (y0, x1), (y1, x0), (y1, x1):

    * ``index``: flat pixel index ``row * width + col`` (clipped into the map; use
      ``valid``),
    * ``valid``: the corner lies inside the map (zero padding: invalid corners read 0),
    * ``weight``: bilinear weight, 0 for invalid corners,
    * ``dweight_dx`` / ``dweight_dy``: derivative of ``weight`` w.r.t. the *normalised*
      x / y.
    """
    px = to_pixels(points, height, width, align_corners)  # (..., 2)
    cor = _pixel_corners(px, height, width)
    valid, lx, ly, hx, hy = (cor[k] for k in ("valid", "lx", "ly", "hx", "hy"))
    sx, sy = pixel_scale(height, width, align_corners)
    dwdx = np.stack([-hy, hy, -ly, ly], axis=-1) * valid * sx
    dwdy = np.stack([-hx, -lx, hx, lx], axis=-1) * valid * sy
    nan4 = cor["bad"][..., None]
    dwdx, dwdy = np.where(nan4, np.nan, dwdx), np.where(nan4, np.nan, dwdy)
    return {
        "index": cor["index"],
        "valid": valid,
        "weight": cor["weight"],
        "dweight_dx": dwdx,
        "dweight_dy": dwdy,
    }


def _check_map_points(feat, points, name="points"):
    feat, points = as_real_array("feat", feat), as_real_array(name, points)
    if feat.ndim != 4:
        raise ValueError(f"feat must be (B, H_f, W_f, C), got shape {feat.shape}")
    if points.ndim != 3 or points.shape[-1] != 2 or points.shape[0] != feat.shape[0]:
        raise ValueError(
            f"{name} must be (B, N, 2) with B={feat.shape[0]}, got shape {points.shape}"
        )
    if min(feat.shape[1:3]) < 1:
        raise ValueError(
            f"feat must be a non-empty map (B, H_f >= 1, W_f >= 1, C), "
            f"got shape {feat.shape}"
        )
    return feat, points


def _gather_sum(feat: np.ndarray, cor: dict) -> np.ndarray:
    b, h, w, c = feat.shape
    flat = feat.reshape(b, h * w, c)  # (B, H_f*W_f, C)
    idx = cor["index"][..., None]  # (B, N, 4, 1)
    gathered = np.take_along_axis(flat[:, None], idx, axis=2)  # (B, N, 4, C)
    return np.einsum("bnk,bnkc->bnc", cor["weight"], gathered)  # (B, N, C)


def bilinear_sample(feat: np.ndarray, points: np.ndarray, align_corners: bool = False):
    """Sample a channels-last map at real-valued points, with zero padding.

    feat: (B, H_f, W_f, C); points: (B, N, 2) normalised (x, y). Returns (B, N, C).
    Equal to ``grid_sample(feat.permute(0, 3, 1, 2), points[:, None], "bilinear",
    "zeros", align_corners)`` up to a transpose.
    """
    feat, points = _check_map_points(feat, points)
    h, w = feat.shape[1:3]
    return _gather_sum(feat, bilinear_corners(points, h, w, align_corners))


def bilinear_sample_pixels(feat: np.ndarray, pixels: np.ndarray) -> np.ndarray:
    """``bilinear_sample`` at pixel coordinates: pixels (B, N, 2) as (column, row).

    An integer position reads exactly that pixel (no round trip through normalised
    coordinates); a corner outside the map reads 0. DAT's relative position bias looks
    its table up this way.
    """
    feat, pixels = _check_map_points(feat, pixels, "pixels")
    h, w = feat.shape[1:3]
    return _gather_sum(feat, _pixel_corners(pixels.astype(np.float64), h, w))


def bilinear_sample_backward(
    feat: np.ndarray,
    points: np.ndarray,
    grad_out: np.ndarray,
    align_corners: bool = False,
):
    """Gradients of ``sum(grad_out * bilinear_sample(feat, points))``.

    Returns ``(grad_feat (B, H_f, W_f, C), grad_points (B, N, 2))``. The value gradient
    scatters each output gradient back to its four corners with the bilinear weights;
    the point gradient is sum_corners d(weight)/d(point) * <feat[corner], grad_out>.
    """
    feat, points = _check_map_points(feat, points)
    grad_out = as_real_array("grad_out", grad_out)
    b, h, w, c = feat.shape
    if grad_out.shape != (b, points.shape[1], c):
        raise ValueError(
            f"grad_out must be (B, N, C) = {(b, points.shape[1], c)}, "
            f"got shape {grad_out.shape}"
        )
    cor = bilinear_corners(points, h, w, align_corners)  # (B, N, 4)
    flat = feat.reshape(b, h * w, c)  # (B, H_f*W_f, C)
    idx = cor["index"][..., None]  # (B, N, 4, 1)
    gathered = np.take_along_axis(flat[:, None], idx, axis=2)  # (B, N, 4, C)
    dot = np.einsum("bnkc,bnc->bnk", gathered, grad_out)  # <feat[corner], grad_out>
    grad_points = np.stack(
        [(cor["dweight_dx"] * dot).sum(-1), (cor["dweight_dy"] * dot).sum(-1)], axis=-1
    )  # (B, N, 2)
    grad_flat = np.zeros_like(flat, dtype=np.result_type(feat, grad_out))
    contrib = cor["weight"][..., None] * grad_out[:, :, None, :]  # (B, N, 4, C)
    for bi in range(b):
        np.add.at(
            grad_flat[bi], cor["index"][bi].reshape(-1), contrib[bi].reshape(-1, c)
        )
    return grad_flat.reshape(b, h, w, c), grad_points
