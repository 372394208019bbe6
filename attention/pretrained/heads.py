"""Kinds of attention heads, found by measurement (Clark et al. 2019, "What does BERT
look at? An Analysis of BERT's Attention").

For each sentence and head the statistics below are means over the query rows of the
(N, N) map; ``head_stats`` averages them over the sentences given. ``head_types``
names a head by the first rule of ``TYPES`` its statistics meet, with the thresholds of
``THRESHOLDS`` (stated, not fitted):

previous / next / self  at least half of a word's weight, on average, on the token
                        just before / just after / itself (rows of [CLS] and [SEP]
                        left out: they have no "previous word")
[SEP] / [CLS]           at least half of every row's weight, on average, on that
                        special token: Clark et al.'s "no-op" heads, which park weight
                        where it changes little (chapter 7's attention sinks)
punctuation             at least half on the sentence's punctuation tokens
broad                   mean row entropy at least 0.75 of the uniform row's, log2 N:
                        the weight spread over most of the sentence
mixed                   none of these
"""

from __future__ import annotations

import string

import numpy as np

#: Head types in the order their rules are tried.
TYPES = ("previous", "next", "self", "[SEP]", "[CLS]", "punctuation", "broad", "mixed")
#: The statistic each rule reads and the value it must reach.
THRESHOLDS = {
    "previous": ("prev", 0.5),
    "next": ("next", 0.5),
    "self": ("self", 0.5),
    "[SEP]": ("sep", 0.5),
    "[CLS]": ("cls", 0.5),
    "punctuation": ("punct", 0.5),
    "broad": ("norm_entropy", 0.75),
}
STATS = ("entropy", "norm_entropy", "cls", "sep", "punct", "prev", "next", "self")


def token_classes(tokens) -> dict:
    """Boolean masks over the tokens: ``cls``, ``sep``, ``punct`` (every character
    punctuation) and ``word`` (the rest)."""
    t = list(tokens)
    cls = np.array([x == "[CLS]" for x in t])
    sep = np.array([x == "[SEP]" for x in t])
    punct = np.array(
        [
            bool(x) and all(c in string.punctuation for c in x) and not (c or s)
            for x, c, s in zip(t, cls, sep)
        ]
    )
    return {"cls": cls, "sep": sep, "punct": punct, "word": ~(cls | sep | punct)}


def sentence_stats(maps: np.ndarray, tokens) -> dict:
    """The statistics of one sentence's maps (L, H, N, N): {name: (L, H)}."""
    p = np.asarray(maps, dtype=np.float64)
    n = p.shape[-1]
    if p.ndim != 4 or p.shape[-2] != n or len(tokens) != n:
        raise ValueError(
            f"maps must be (L, H, N, N) with N = len(tokens) = {len(tokens)}, got "
            f"{p.shape}"
        )
    c = token_classes(tokens)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(p > 0, p * np.log2(p), 0.0).sum(-1)  # (L, H, N) bits
    inner = ~(c["cls"] | c["sep"])  # rows of real tokens
    rows = np.flatnonzero(inner)
    i = np.arange(n)
    return {
        "entropy": ent.mean(-1),
        "norm_entropy": ent.mean(-1) / np.log2(n),
        "cls": p[..., c["cls"]].sum(-1).mean(-1),
        "sep": p[..., c["sep"]].sum(-1).mean(-1),
        "punct": p[..., c["punct"]].sum(-1).mean(-1),
        "prev": p[..., rows, rows - 1].mean(-1),
        "next": p[..., rows, np.minimum(rows + 1, n - 1)].mean(-1),
        "self": p[..., i[inner], i[inner]].mean(-1),
    }


def head_stats(model, sentences) -> dict:
    """``sentence_stats`` of ``model.attentions(s)`` averaged over ``sentences``:
    {name: (L, H)} for every name in ``STATS``."""
    if isinstance(sentences, str) or not len(sentences):
        raise ValueError("sentences must be a non-empty list of strings")
    per = [sentence_stats(model.attentions(s), model.tokens(s)) for s in sentences]
    return {k: np.mean([s[k] for s in per], axis=0) for k in STATS}


def head_types(stats: dict, thresholds: dict | None = None) -> np.ndarray:
    """(L, H) array of type names: the first rule of ``TYPES`` met, else "mixed"."""
    thresholds = THRESHOLDS if thresholds is None else thresholds
    shape = np.shape(stats["entropy"])
    out = np.full(shape, "mixed", dtype=object)
    done = np.zeros(shape, dtype=bool)
    for kind in TYPES[:-1]:
        stat, at = thresholds[kind]
        hit = (np.asarray(stats[stat]) >= at) & ~done
        out[hit] = kind
        done |= hit
    return out


def layer_mass(stats: dict) -> dict:
    """Per layer, the mean over heads of the mass on [CLS], [SEP] and punctuation:
    {"[CLS]": (L,), "[SEP]": (L,), "punctuation": (L,)}."""
    return {
        "[CLS]": np.mean(stats["cls"], -1),
        "[SEP]": np.mean(stats["sep"], -1),
        "punctuation": np.mean(stats["punct"], -1),
    }


__all__ = [
    "STATS",
    "THRESHOLDS",
    "TYPES",
    "head_stats",
    "head_types",
    "layer_mass",
    "sentence_stats",
    "token_classes",
]
