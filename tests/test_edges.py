"""The edges (issue 23): no quiet answer and no obscure error.

* The NaN rule of hard and top-k attention, kernels (Triton interpreter) against the
  NumPy twins and an independent per-row reference: a NaN anywhere in q, k or v, at
  several N so it lands in different tiles, causal and not, argmax, sampled and top-k.
  A NaN score never reads as "no key" (-1 and a zero row).
* Every helper named in the issue either answers correctly or raises ValueError /
  TypeError whose message names the argument (Hypothesis over bad values, seeded).
"""

from __future__ import annotations

import json
import math
import time
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attention import deformable as adf
from attention import hard as ahard
from attention import memory, plots
from attention.explorers import live, static
from attention.plots import maps
from kernels import naive, runtime
from kernels.flash import tiles as ftiles
from kernels.hard import hard_attention, topk_attention
from kernels.hard import tiles as htiles
from kernels.timing import results

DEV = runtime.DEVICE
FAST = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SLOW = settings(FAST, max_examples=25)  # Triton interpreter


# --------------------------------------------------------------------------------------
# The NaN rule, against a reference written here row by row
# --------------------------------------------------------------------------------------


def ref_rows(q, k, causal, scale):
    """Per row: (visible keys, scaled scores as Python floats)."""
    n_q, n_k = q.shape[0], k.shape[0]
    rows = []
    for i in range(n_q):
        vis = [j for j in range(n_k) if not causal or j <= i + n_k - n_q]
        rows.append(
            (
                vis,
                [
                    math.fsum(q[i] * k[j]) * scale
                    if not (np.isnan(q[i]).any() or np.isnan(k[j]).any())
                    else math.nan
                    for j in vis
                ],
            )
        )
    return rows


@SLOW
@given(
    st.sampled_from([(5, 9), (40, 70), (70, 40), (65, 130), (130, 65)]),
    st.sampled_from(["q", "k", "v"]),
    st.booleans(),
    st.integers(0, 2**16),
    st.integers(1, 5),
)
def test_nan_rule_of_hard_and_topk_kernels(shape, where, causal, seed, topk):
    n_q, n_k = shape
    g = torch.Generator().manual_seed(seed)
    # small integers: every fp32 score is exact, so choices match the reference
    q = torch.randint(-3, 4, (1, 1, n_q, 16), generator=g).float()
    k = torch.randint(-3, 4, (1, 1, n_k, 16), generator=g).float()
    v = torch.randn(1, 1, n_k, 16, generator=g)
    t = {"q": q, "k": k, "v": v}[where]
    row = int(torch.randint(0, t.shape[2], (), generator=g))
    t[0, 0, row, int(torch.randint(0, 16, (), generator=g))] = float("nan")
    qn, kn, vn = (x[0, 0].numpy().astype(np.float64) for x in (q, k, v))
    rows = ref_rows(qn, kn, causal, 0.25)

    o, idx = hard_attention(
        q.to(DEV),
        k.to(DEV),
        v.to(DEV),
        causal=causal,
        softmax_scale=0.25,
        return_index=True,
    )
    o, idx = o[0, 0].cpu().numpy(), idx[0, 0].cpu().numpy()
    o_s, idx_s = hard_attention(
        q.to(DEV),
        k.to(DEV),
        v.to(DEV),
        causal=causal,
        softmax_scale=0.25,
        sample=True,
        seed=seed,
        return_index=True,
    )
    o_s, idx_s = o_s[0, 0].cpu().numpy(), idx_s[0, 0].cpu().numpy()
    o_k, idx_k = topk_attention(
        q.to(DEV),
        k.to(DEV),
        v.to(DEV),
        topk,
        causal=causal,
        softmax_scale=0.25,
        return_index=True,
    )
    o_k, idx_k = o_k[0, 0].cpu().numpy(), np.sort(idx_k[0, 0].cpu().numpy(), -1)
    for i, (vis, s) in enumerate(rows):
        nan = [j for j, x in zip(vis, s) if math.isnan(x)]
        if not vis:  # the empty row, and only it: 0 and -1
            assert idx[i] == idx_s[i] == -1 and np.all(o[i] == 0)
            assert np.all(idx_k[i] == -1) and np.all(o_k[i] == 0)
        elif nan:  # NaN in: NaN out, and the index names the first NaN key
            assert idx[i] == idx_s[i] == nan[0] and np.isnan(o[i]).all()
            assert np.isnan(o_s[i]).all() and np.isnan(o_k[i]).all()
            # top-k keeps the NaN keys first (as +inf), then the best finite scores
            order = sorted(
                zip(vis, s),
                key=lambda js: (-math.inf if math.isnan(js[1]) else -js[1], js[0]),
            )
            want = sorted(j for j, _ in order[:topk])
            assert idx_k[i][idx_k[i] >= 0].tolist() == want
        else:  # untouched by a NaN it does not see
            best = max(s)
            assert idx[i] == vis[s.index(best)]
            assert np.array_equal(o[i], vn[idx[i]].astype(np.float32), equal_nan=True)
            assert vis[0] <= idx_s[i] <= vis[-1]
            assert np.isnan(o_s[i]).any() == np.isnan(vn[idx_s[i]]).any()
    # the NumPy twins follow the same rule
    o_n, idx_n = ahard.hard_attention(
        qn, kn, vn, scale=0.25, causal=causal, return_index=True
    )
    assert np.array_equal(idx, idx_n)
    assert np.array_equal(np.isnan(o), np.isnan(o_n))
    s_n = ahard.attention_scores(qn, kn, 0.25, causal)
    assert np.array_equal(idx_k, np.sort(ahard.topk_index(s_n, topk), -1))
    o_kn = ahard.topk_attention(qn, kn, vn, topk, scale=0.25, causal=causal)
    assert np.array_equal(np.isnan(o_k), np.isnan(o_kn))
    _, idx_sn = ahard.stochastic_hard_attention(
        qn,
        kn,
        vn,
        np.random.default_rng(0),
        scale=0.25,
        causal=causal,
        return_index=True,
    )
    nan_rows = np.isnan(s_n).any(-1)
    assert np.array_equal(idx_sn[nan_rows], idx_s[nan_rows])


def test_nan_key_reaches_only_the_rows_that_see_it():
    # the case: one NaN key changed every row to -1; now only rows that see it
    # (causal: rows >= its position) are NaN, with that key as their index
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 96, 16, generator=g) for _ in range(3))
    k[0, 0, 70, 5] = float("nan")
    q, k, v = q.to(DEV), k.to(DEV), v.to(DEV)
    o, idx = hard_attention(q, k, v, causal=True, return_index=True)
    o, idx = o.cpu(), idx.cpu()
    nan_rows = torch.isnan(o[0, 0]).any(-1)
    assert torch.equal(nan_rows, torch.arange(96) >= 70)
    assert torch.all(idx[0, 0, 70:] == 70) and torch.all(idx[0, 0, :70] >= 0)
    o_k, idx_k = topk_attention(q, k, v, 4, causal=True, return_index=True)
    o_k, idx_k = o_k.cpu(), idx_k.cpu()
    assert torch.equal(torch.isnan(o_k[0, 0]).any(-1), torch.arange(96) >= 70)
    assert torch.all((idx_k[0, 0, 70:] == 70).any(-1))
    assert torch.all(idx_k[0, 0, 3:] >= 0)  # rows 0-2 see fewer than 4 keys


def test_numpy_twins_nan_and_empty_rules():
    assert ahard.argmax_index(np.array([1.0, np.nan, 2.0, np.nan])) == 1
    assert ahard.argmax_index(np.array([-np.inf, -np.inf])) == -1
    p = np.array([[0.5, np.nan, 0.5], [0.0, 0.0, 0.0]])
    assert ahard.sample_index(p, np.random.default_rng(0)).tolist() == [1, -1]
    assert ahard.topk_index(np.array([1.0, np.nan, 3.0]), 2).tolist() == [1, 2]
    y = ahard.gumbel_softmax(
        np.array([[0.0, np.nan], [0.0, 1.0]]),
        0.5,
        rng=np.random.default_rng(0),
        hard=True,
    )
    assert np.isnan(y[0]).all() and y[1].sum() == 1
    # N_k = 0: every row is empty, on both sides
    o, idx = ahard.hard_attention(
        np.ones((3, 2)), np.ones((0, 2)), np.ones((0, 4)), return_index=True
    )
    assert o.shape == (3, 4) and np.all(o == 0) and np.all(idx == -1)
    q = torch.ones(1, 1, 3, 16, device=DEV)
    o, idx = hard_attention(q, q[:, :, :0], q[:, :, :0], return_index=True)
    assert torch.all(o == 0) and torch.all(idx == -1)
    o, idx = topk_attention(q, q[:, :, :0], q[:, :, :0], 2, return_index=True)
    assert torch.all(o == 0) and idx.shape == (1, 1, 3, 2) and torch.all(idx == -1)


# --------------------------------------------------------------------------------------
# Bad arguments: ValueError / TypeError naming the argument
# --------------------------------------------------------------------------------------

RNG = np.random.default_rng(0)
T = torch.ones(1, 2, 4, 8)
BAD = [
    # (call, the name the message must hold)
    (lambda: ahard.gather_rows(np.ones((3, 2)), np.array([-2, 0])), "idx"),
    (lambda: ahard.gather_rows(np.ones((3, 2)), np.array([3])), "idx"),
    (lambda: ahard.one_hot(np.array([3]), 3), "idx"),
    (lambda: ahard.one_hot(np.array([-2]), 3), "idx"),
    (lambda: ahard.train_retrieval("soft", steps=1, lr=math.nan), "lr"),
    (lambda: ahard.train_retrieval("soft", steps=1, lr=-0.1), "lr"),
    (lambda: ahard.train_retrieval("gumbel-st", steps=1, tau=0.0), "tau"),
    (lambda: ahard.gumbel_softmax(np.zeros(3), math.nan, rng=RNG), "tau"),
    (
        lambda: maps.gumbel_softmax_figure(np.zeros((2, 3)), np.zeros((2, 3)), tau=0.0),
        "tau",
    ),
    (lambda: maps.gumbel_softmax_figure(np.zeros((0, 3)), np.zeros((0, 3))), "scores"),
    (lambda: maps.gumbel_softmax_figure(np.zeros((2, 3)), np.zeros((3, 2))), "noise"),
    (lambda: memory.cdiv(-5, 2), "a"),
    (lambda: memory.cdiv(5, 0), "b"),
    (lambda: memory.blocks(-1, 4), "n"),
    (lambda: memory.traffic({"Q": (-1, 2)}), "per_tensor"),
    (lambda: memory.Traffic(reads=-1, writes=0, per_tensor={}), "reads"),
    (lambda: memory.closed_form("flash2", 64, 16).bytes(-2), "bytes_per_elem"),
    (lambda: memory.roofline_ms(-1.0, 10.0, "H100"), "flops"),
    (lambda: memory.roofline_ms(1.0, math.nan, "H100"), "hbm_bytes"),
    (lambda: memory.roofline_ms(1.0, 1.0, "B300"), "gpu"),
    (lambda: memory.arithmetic_intensity(1.0, -4.0), "hbm_bytes"),
    (lambda: memory.matmul_flops("flash2", -4, 16), "N"),
    (lambda: memory.HBMSim().release(1), "release"),
    (lambda: ftiles.configs("nope", (9, 0), 64), "kernel"),
    (lambda: ftiles.configs("fwd", (9, 0), 0), "head_dim"),
    (lambda: ftiles.configs("fwd", (9, 0), 512), "head_dim"),
    (lambda: ftiles.block_d(0), "head_dim"),
    (lambda: ftiles.block_d(2.5), "head_dim"),
    (lambda: ftiles.arch_class("sm90"), "capability"),
    (lambda: htiles.configs("nope", (9, 0), 64), "kind"),
    (lambda: htiles.configs("hard", (9, 0), -1), "head_dim"),
    (lambda: htiles.configs("hard", (9, 0), 256), "head_dim"),
    (lambda: htiles.configs("topk", (9, 0), 64, topk=0), "topk"),
    (lambda: naive.repeat_kv(T, 0), "group"),
    (lambda: naive.repeat_kv(T, -1), "group"),
    (lambda: naive.causal_mask(-1, 3), "n_q"),
    (lambda: naive.naive_attention(T, T.double(), T), "dtype"),
    (lambda: naive.naive_hard_attention(T, T, T.half()), "dtype"),
    (lambda: adf.level_start_index(np.zeros((0, 2), int)), "spatial_shapes"),
    (lambda: adf.init_offset_params(4, 0, RNG), "kernel_size"),
    (lambda: adf.init_dat_params(8, 0, 3, RNG), "n_groups"),
    (lambda: adf.init_dat_params(8, 3, 3, RNG), "n_groups"),
    (lambda: adf.init_msda_params(8, 2, 0, 2, RNG), "n_levels"),
    (
        lambda: adf.msda_sampling(
            np.zeros((1, 2, 8)),
            np.zeros((1, 2, 2)),
            adf.init_msda_params(8, 2, 3, 2, RNG),
            [[4, 4]] * 2,
            2,
            2,
        ),
        "levels",
    ),
    (lambda: plots.traffic_bars({}), "per_tensor"),
    (lambda: plots.traffic_by_algorithm({}), "results"),
    (lambda: plots.naive_traffic_vs_length([]), "ns"),
    (lambda: plots.roofline_bars({}), "estimates"),
    (lambda: plots.memory_hierarchy_plot([]), "levels"),
    (lambda: plots.attention_heatmap(np.zeros((0, 3))), "weights"),
    (lambda: plots.mask_heatmap(np.ones(3, bool)), "mask"),
    (lambda: plots.human_bytes(-1), "n"),
    (lambda: plots.power_law_fit([1, 2, 3], [1, 2]), "x and y"),
    (lambda: static.tile_size_explorer(N=1000), "N"),
    (lambda: static.tile_size_explorer(dtype="int4"), "dtype"),
    (lambda: static.topk_traffic_explorer(k=7), "k"),
    (lambda: static.temperature_explorer(tau=0.3), "tau"),
    (lambda: static.deformable_traffic_explorer(side=50), "side"),
    (lambda: live.tile_size_explorer(d=48), "d"),
    (lambda: live.naive_traffic_explorer(dtype="int4"), "dtype"),
    (lambda: live.topk_traffic_explorer(k=0), "k"),
    (lambda: live.deformable_traffic_explorer(n_levels=9), "n_levels"),
    (lambda: live.temperature_explorer(tau=100.0), "tau"),
]


@pytest.mark.parametrize(
    "call,name", BAD, ids=[f"{i}-{n}" for i, (_, n) in enumerate(BAD)]
)
def test_bad_arguments_name_themselves(call, name):
    with pytest.raises((ValueError, TypeError), match=name):
        call()


@FAST
@given(
    st.one_of(
        st.integers(-(10**6), 10**6),
        st.floats(allow_nan=True),
        st.sampled_from(["64", None, True, (9, 0), [8]]),
    ),
    st.sampled_from(
        [
            "cdiv",
            "blocks",
            "block_d",
            "repeat_kv",
            "causal_mask",
            "one_hot",
            "arch_class",
            "roofline",
            "tiles",
        ]
    ),
)
def test_helpers_answer_or_refuse_by_name(value, helper):
    # whatever the value: a correct answer, or ValueError/TypeError naming the argument
    calls = {
        "cdiv": (
            lambda: memory.cdiv(value, 3),
            "a",
            lambda r: r == -(-value // 3) and value >= 0,
        ),
        "blocks": (
            lambda: memory.blocks(7, value),
            "b",
            lambda r: sum(r) == 7 and max(r) <= value,
        ),
        "block_d": (
            lambda: ftiles.block_d(value),
            "head_dim",
            lambda r: r >= max(16, value) and r & (r - 1) == 0,
        ),
        "repeat_kv": (
            lambda: naive.repeat_kv(T, value),
            "group",
            lambda r: r.shape[1] == 2 * value,
        ),
        "causal_mask": (
            lambda: naive.causal_mask(
                value % 50
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0
                else value,
                4,
            ),
            "n_q",
            lambda r: r.shape[1] == 4,
        ),
        "one_hot": (
            lambda: ahard.one_hot(np.array([value]), 5),
            "idx",
            lambda r: r.sum() == (value >= 0),
        ),
        "arch_class": (
            lambda: ftiles.arch_class(value),
            "capability",
            lambda r: r in ftiles.ARCHS,
        ),
        "roofline": (
            lambda: memory.roofline_ms(value, 1.0, "H100"),
            "flops",
            lambda r: r >= 0 and math.isfinite(r),
        ),
        "tiles": (
            lambda: htiles.configs("hard", (9, 0), value),
            "head_dim",
            lambda r: len(r) > 0 and 1 <= value <= htiles.MAX_HEAD_DIM,
        ),
    }
    call, name, ok = calls[helper]
    try:
        r = call()
    except (ValueError, TypeError) as err:
        assert name in str(err), str(err)
    else:
        assert ok(r), (helper, value, r)


# --------------------------------------------------------------------------------------
# Degenerate geometry, the simulator's budget, the results loader
# --------------------------------------------------------------------------------------


@FAST
@given(st.floats(-3, 3), st.integers(1, 5), st.booleans())
def test_normalised_coordinates_on_any_map(x, size, align):
    p = np.array([[x, -x]])
    px = adf.to_pixels(p, size, size, align_corners=align)
    back = adf.to_normalized(px, size, size, align_corners=align)
    assert np.all(np.isfinite(back))
    if align and size == 1:  # the single pixel's centre: pixel 0, coordinate 0
        assert np.all(px == 0) and np.all(back == 0)
    else:
        assert np.allclose(back, p, atol=1e-12)


def test_simulator_refuses_a_million_at_once_naming_closed_form():
    import attention.deformable  # noqa: F401  (registers dat, msda, ...)

    t0 = time.perf_counter()
    for args in (
        ("flash2", 10**6, 64),
        ("dat", 1000, 1000, 64),
        ("dat-unfused", 1000, 1000, 64),
        ("hard", 10**6, 64),
    ):
        with pytest.raises(ValueError, match=r"closed_form"):
            memory.simulate(*args, keep_trace=False)
    assert time.perf_counter() - t0 < 1.0  # refused before simulating anything


def test_corrupt_results_file_is_skipped_with_a_warning(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps({"date": "2026-01-01", "x": 1}))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = results.load_results(tmp_path)
    assert out == [{"date": "2026-01-01", "x": 1}]
    text = " ".join(str(w.message) for w in caught)
    assert "broken.json" in text and "list.json" in text


def test_nan_rows_send_nan_to_the_value_row_they_point_at():
    # a NaN score row's output is NaN by the rule (not v[idx]): its gradient reaches
    # v at its index (the NaN key) as NaN, as soft attention's NaN P does; the other
    # rows' gradients stay finite and exact (dv[j] = sum of dO over rows choosing j)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 40, 16, generator=g) for _ in range(3))
    k[0, 0, 30, 2] = float("nan")
    q, k, v = q.to(DEV), k.to(DEV), v.to(DEV).requires_grad_(True)
    o, idx = hard_attention(q, k, v, causal=True, return_index=True)
    do = torch.randn(o.shape, generator=g).to(DEV)
    (dv,) = torch.autograd.grad(o, v, do)
    dv, idx, do = dv.cpu(), idx.cpu(), do.cpu()
    assert torch.isnan(dv[0, 0, 30]).all()
    clean = idx[0, 0, :30]  # rows 0-29 do not see key 30
    want = torch.zeros(40, 16).index_add_(0, clean, do[0, 0, :30])
    rows = torch.ones(40, dtype=torch.bool)
    rows[30] = False
    torch.testing.assert_close(dv[0, 0, rows], want[rows])


def test_tile_explorer_refuses_an_unknown_algorithm_by_name():
    from attention.plots import schedule

    with pytest.raises(ValueError, match="algorithm"):
        schedule.tile_explorer_figure(algorithm="flash3")
