"""A GGUF file's byte-level BPE tokenizer (GPT-2's scheme, SmolLM2's vocabulary), built
with the ``tokenizers`` library from the vocabulary and merges in the file's metadata.

A GGUF holds no ``tokenizer.json``: it stores ``tokenizer.ggml.tokens`` (the vocabulary,
id = index), ``tokenizer.ggml.merges`` (``"a b"`` strings, best rank first) and
``tokenizer.ggml.token_type`` (1 normal, 3 control, 4 user-defined). The tokenizer is
the one ``transformers`` builds from the same metadata (``AutoTokenizer.from_pretrained
(folder, gguf_file=...)``; ``transformers.integrations.gguf.gguf_tokenizer_mapping``),
rebuilt here without transformers:

1. text is split at the control tokens written in it (``<|im_start|>`` ...), which
   become their own ids (special, never merged);
2. each remaining piece is pre-tokenized by GPT-2's regex (``tokenizers``' ByteLevel)
   ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|``
   ``\\s+``
   and its UTF-8 bytes spelled in GPT-2's bytes-to-unicode alphabet (a space is
   ``Ġ``, a newline ``Ċ``; ``ByteLevel(add_prefix_space=False)``);
3. BPE merges each word's symbols by rank.

No BOS and no EOS are added (the file says ``add_bos_token = False``). Decoding maps the
alphabet back to bytes, control tokens included as text.

The file names its pre-tokenizer ``smollm``; llama.cpp splits digits one by one for
it, and ``transformers`` (which has no entry for the name) uses GPT-2's regex above. The
vocabulary has no merge of two digits, so both give one token per digit; what is held
exactly is transformers' tokenizer (tests/attention/test_smollm2.py).
"""

from __future__ import annotations

import functools

#: ``tokenizer.ggml.token_type`` of a control token (llama.cpp's LLAMA_TOKEN_TYPE).
CONTROL = 3
USER_DEFINED = 4


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: the 188 printable Latin-1 bytes map
    to themselves, the other 68 to U+0100 onward in byte order (space 0x20 -> ``Ġ``
    U+0120, newline 0x0A -> ``Ċ`` U+010A)."""
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer(tokens, merges, token_types):
    """A ``tokenizers.Tokenizer`` from a GGUF's vocabulary ``tokens`` (list of str),
    ``merges`` (list of ``"a b"``) and ``token_types`` (list of int), as transformers'
    ``byte_level_tokenizer`` and ``add_gguf_special_tokens`` build it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    spell = bytes_to_unicode()
    alphabet = set(spell.values())
    vocab = {}
    for i, t in enumerate(tokens):
        # a token already in the byte alphabet is kept; any other is spelled in it
        key = t if set(t) <= alphabet else "".join(spell[b] for b in t.encode())
        vocab[key] = i
    pairs = [tuple(m.split(" ")) for m in merges]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, token_types)
        if kind == CONTROL and set(t) <= alphabet
    ]
    tok.add_special_tokens(control)
    user = [
        AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, token_types)
        if kind == USER_DEFINED and t in vocab
    ]
    if user:
        tok.add_tokens(user)
    return tok


__all__ = ["CONTROL", "USER_DEFINED", "build_tokenizer", "bytes_to_unicode"]
