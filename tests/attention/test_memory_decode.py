"""attention.memory.decode: one decode step of a batch, simulated tile by tile and in
closed form (equal in every field over random shapes), and what the counts say: the
whole cache is read once per step, intensity ~ the GQA group, splits add only the
merge, pages only a block-table entry each."""

import random

import pytest

from attention import memory
from attention.memory import decode as md

FIELDS = ("reads", "writes", "per_tensor", "sram_peak", "steps", "events")


def _draw(alg, rng):
    kw = dict(
        B=rng.randint(1, 3),
        H_kv=rng.randint(1, 3),
        N=rng.randint(1, 200),
        d=rng.randint(1, 24),
        group=rng.randint(1, 8),
        N_q=rng.randint(1, 16),
    )
    if alg == "decode_paged":
        kw["page_size"] = rng.randint(1, 64)
    else:
        kw["Bc"] = rng.randint(1, 96)
    if alg in ("decode_split", "decode_paged"):
        kw["n_splits"] = rng.randint(1, 12)
    return kw


@pytest.mark.parametrize("alg", md.DECODE)
def test_simulate_equals_closed_form_over_random_shapes(alg):
    rng = random.Random(sum(map(ord, alg)))
    for _ in range(60):
        kw = _draw(alg, rng)
        sim, form = memory.simulate(alg, **kw), memory.closed_form(alg, **kw)
        assert {f: getattr(sim, f) for f in FIELDS} == {
            f: getattr(form, f) for f in FIELDS
        }, kw
        assert sum(t.elems for t in sim.trace if t.op == "load") == sim.reads


@pytest.mark.parametrize("S", [1, 3, 7])
def test_split_kv_reads_the_cache_once_and_adds_only_the_merge(S):
    B, H_kv, N_k, d, group = 2, 4, 1000, 64, 8
    one = memory.closed_form("decode_split", B, H_kv, N_k, d, group=group)
    cut = memory.closed_form("decode_split", B, H_kv, N_k, d, group=group, n_splits=S)
    assert cut.per_tensor["K"] == cut.per_tensor["V"] == (B * H_kv * N_k * d, 0)
    R = group
    extra = memory.decode_bytes(cut, 2) - memory.decode_bytes(one, 2)
    used = sum(1 for t in memory.split_tiles(16, S) if t)  # ceil(1000 / 64) = 16
    q_extra = B * H_kv * (used - 1) * R * d * 2
    merge = B * H_kv * S * (R * d + R) * 4 * 2  # partials written and read, fp32
    assert extra == (merge + q_extra if S > 1 else 0)


def test_fa2_grid_reads_a_shared_kv_head_once_per_query_head():
    kw = dict(B=1, H_kv=8, N=4096, d=128)
    fa2 = memory.closed_form("decode_fa2", group=4, **kw)
    packed = memory.closed_form("decode_split", group=4, **kw)
    assert fa2.per_tensor["K"][0] == 4 * packed.per_tensor["K"][0]


def test_intensity_is_about_the_group_in_fp16():
    for group in (1, 4, 8):
        t = memory.closed_form("decode_split", 1, 8, 32768, 128, group=group)
        ai = memory.decode_flops(1, 8, 32768, 128, group=group) / memory.decode_bytes(t)
        assert group * 0.99 < ai <= group  # 4 group N d / (2 N d * 2 bytes + q, o)


def test_paged_adds_one_block_table_entry_per_page_and_program():
    B, H_kv, N_k, d, P = 3, 2, 1000, 64, 16
    paged = memory.closed_form("decode_paged", B, H_kv, N_k, d, page_size=P)
    split = memory.closed_form("decode_split", B, H_kv, N_k, d, Bc=P)
    assert paged.per_tensor["block_table"] == (B * H_kv * 63, 0)  # ceil(1000 / 16)
    assert memory.decode_bytes(paged) - memory.decode_bytes(split) == B * H_kv * 63 * 4


def test_naive_moves_the_scores_four_times():
    t = memory.closed_form("decode_naive", 1, 1, 5000, 64, group=1, N_q=1)
    assert t.per_tensor["S"] == t.per_tensor["P"] == (5000, 5000)


def test_split_tiles_and_grid_helpers():
    assert memory.split_tiles(5, 4) == [2, 2, 1, 0]
    assert memory.split_tiles(16, 1) == [16]
    assert sum(memory.split_tiles(37, 6)) == 37
    assert memory.grid_fill(32, 132) == pytest.approx(32 / 132)
    assert memory.grid_fill(264, 132) == 1.0
    assert memory.splits_to_fill(1, 32, 132) == 5  # 32 * 5 = 160 >= 132
    for bad, err in ((0, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(err, match="^programs"):
            memory.grid_fill(bad, 132)
        with pytest.raises(err, match="^n_splits"):
            memory.split_tiles(4, bad)


def test_models_kv_bytes_per_token():
    m = memory.MODELS
    assert m["Llama 2 7B"].kv_bytes_per_token(2) == 2 * 32 * 32 * 128 * 2  # 512 KiB
    llama2, llama3 = m["Llama 2 7B"], m["Llama 3 8B"]
    assert llama3.kv_bytes_per_token(2) * 4 == llama2.kv_bytes_per_token(2)
    assert m["Llama 3 70B"].group == 8 and m["Falcon 7B"].H_kv == 1
    for cfg in m.values():
        assert cfg.H_q % cfg.H_kv == 0 and cfg.layers > 0


def test_gpu_presets():
    g = memory.GPUS
    assert {"T4", "A100", "L4", "H100", "H200"} <= set(g)
    assert g["T4"].hbm_tbps == 0.32 and g["L4"].peak_tflops == 121.0
    for spec in g.values():  # decode's intensity (~1 FLOP/byte for MHA fp16) is far
        assert spec.ridge > 100  # below every preset's ridge point


def test_decode_bytes_sizes():
    t = memory.traffic({"K": (10, 0), "O_part": (3, 3), "block_table": (2, 0)})
    assert memory.decode_bytes(t, 2) == 20 + 24 + 8
    with pytest.raises(ValueError, match="^bytes_per_elem"):
        memory.decode_bytes(t, 0)
