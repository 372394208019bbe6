"""Draw the landing page's chapter thumbnails: figures/thumb_ch<k>.png, one per chapter.

Each thumbnail is drawn by the same ``attention.plots`` function its chapter calls, from
the same ``attention`` computations, at a small size (360 x 270 px): chapter 1 a causal
self-attention map, chapter 2 the HBM traffic of standard attention, FlashAttention-1
and -2 with the compulsory traffic, chapter 3 hard (Gumbel-softmax) weights at a low
temperature, chapter 4 deformable sampling points over an image, chapter 5 decoding
against prefill on the roofline, chapter 6 the ring's schedule (each step's block
computed while the next K/V shard travels), chapter 7 the block mask of a causal
sliding window (full, partial and skipped tiles), chapter 8 the key blocks MoBA's gate
picks for each query, over a causal attention map. Run from the repository root:
``python figures/src/thumbnails.py``; intro.md shows the files it writes.
"""

from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import cbook  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from attention import core, deformable, hard, masks, memory, plots  # noqa: E402
from attention.plots import masks as mask_plots  # noqa: E402
from attention.plots import ring as ring_plots  # noqa: E402
from attention.plots import sparse as sparse_plots  # noqa: E402

OUT_DIR = ROOT / "figures"
SIZE = (3.6, 2.7)  # inches, at DPI: 360 x 270 px
DPI = 100


def _new():
    fig, ax = plt.subplots(figsize=SIZE)
    return fig, ax


def ch1():
    """A causal self-attention map of a short sentence (chapter 1's heatmap)."""
    rng = np.random.default_rng(0)
    tokens = "the cat sat on the mat".split()
    x = rng.standard_normal((len(tokens), 16))  # (n, d_model)
    w_q, w_k, w_v = (0.3 * rng.standard_normal((16, 8)) for _ in range(3))
    _, p = core.self_attention(x, w_q, w_k, w_v, causal=True, return_weights=True)
    fig, ax = _new()
    plots.attention_heatmap(
        p,
        q_labels=tokens,
        k_labels=tokens,
        ax=ax,
        mask=core.causal_mask(len(tokens)),
        colorbar=False,
    )
    ax.set_xlabel("")
    ax.set_ylabel("")
    return fig


def ch2():
    """HBM traffic of the three forward algorithms, compulsory ticks (chapter 2)."""
    N, d = 1024, 64
    algs = ["standard", "flash1", "flash2"]
    res = {a: memory.closed_form(a, N, d, Br=64, Bc=64) for a in algs}
    fig, ax = _new()
    plots.traffic_by_algorithm(
        res,
        bytes_per_elem=2,
        ax=ax,
        floor={a: memory.compulsory(a, N, d) for a in algs},
    )
    for leg in list(ax.artists) + [ax.get_legend()]:  # the legends: too small to read
        leg.remove()
    for t in list(ax.texts):
        t.remove()
    return fig


def ch3():
    """Gumbel-softmax weights at a low temperature: nearly one-hot rows (chapter 3)."""
    rng = np.random.default_rng(3)
    s = 1.5 * rng.standard_normal((8, 12))
    g = hard.gumbel(s.shape, rng)
    fig, ax = _new()
    plots.attention_heatmap(
        hard.gumbel_softmax(s, 0.3, noise=g), ax=ax, vmax=1.0, colorbar=False
    )
    ax.set_xlabel("")
    ax.set_ylabel("")
    return fig


def ch4():
    """A reference grid and its deformed points over an image (chapter 4)."""
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        photo = plt.imread(f)
    side = photo.shape[1]
    img = photo[:side, :side].astype(float).reshape(64, side // 64, 64, side // 64, 3)
    img = img.mean((1, 3)) / 255  # (64, 64, 3)
    ref = deformable.reference_grid(6, 6)  # (36, 2) normalised (x, y)
    rng = np.random.default_rng(4)
    toward = np.array([0.1, -0.25]) - ref  # pulled toward the face, with some noise
    points = np.clip(ref + 0.35 * toward + 0.05 * rng.standard_normal(ref.shape), -1, 1)
    fig, ax = _new()
    plots.deformable_points_plot(img, ref, points, ax=ax)
    ax.get_legend().remove()
    return fig


def ch5():
    """Decode against prefill on the roofline (chapter 5's figure)."""
    prefill = memory.matmul_flops("flash2", 4096, 128) / memory.compulsory(
        "flash2", 4096, 128
    ).bytes(2)
    points = {"decode": 1.0, "decode, GQA 8": 8.0, "prefill": prefill}
    fig, ax = _new()
    plots.decode_roofline_figure(points, ax=ax)
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    ax.set_title("")
    return fig


def ch6():
    """The ring schedule: compute and send per device and step (chapter 6's figure)."""
    fig, ax = _new()
    ring_plots.ring_schedule_figure(P=4, ax=ax)
    ax.set_title("")
    return fig


def ch7():
    """The block mask of a causal sliding window (chapter 7's figure)."""
    window = masks.and_masks(masks.causal_mask, masks.sliding_window(64))
    fig, ax = _new()
    mask_plots.block_mask_plot(masks.block_mask(window, 256, block_size=32), ax=ax)
    ax.set_title("")
    return fig


def ch8():
    """The blocks of 16 MoBA's gate picks per query (4 each) over a causal map of
    the sparse explorer's synthetic head (chapter 8's figure)."""
    from attention import sparse
    from attention.explorers.sparse import synthetic_qk

    q, k = synthetic_qk(256)  # (N, d)
    s = np.where(np.tri(256, dtype=bool), q @ k.T / np.sqrt(q.shape[1]), -np.inf)
    p = core.softmax(s, axis=-1)
    idx = sparse.select_blocks(q[None, None], k[None, None], 16, 4)[0, 0]
    fig, ax = _new()
    sparse_plots.chosen_blocks_figure(p, {"moba": idx}, 16, axes=[ax])
    ax.set(title="", xlabel="", ylabel="")
    return fig


def main(out_dir: pathlib.Path = OUT_DIR) -> list[pathlib.Path]:
    plots.use_book_style()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, draw in enumerate((ch1, ch2, ch3, ch4, ch5, ch6, ch7, ch8), start=1):
        fig = draw()
        fig.tight_layout(pad=0.3)
        path = out_dir / f"thumb_ch{k}.png"
        fig.savefig(path, dpi=DPI, metadata={"Software": None})
        plt.close(fig)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in main():
        print(p.relative_to(ROOT))
