"""Heads of a causal language model found by measurement: induction heads (Olsson et
al. 2022, "In-context Learning and Induction Heads"), previous-token heads and
attention sinks (Xiao et al. 2023, "Efficient Streaming Language Models with
Attention Sinks").

The probe is Olsson et al.'s: a sequence of random token ids repeated twice,

    x = (t_0, ..., t_{L-1}, t_0, ..., t_{L-1})        (2L ids, optionally after a BOS)

On the first copy the next token is unpredictable (loss near log |V| or worse: the
model is confidently wrong); on the second copy a model that can copy from its own
context predicts it. An *induction head* is the mechanism: at the second occurrence
of t_i it attends to the token *after* the first occurrence, t_{i+1}, and copies it.

Statistics of maps ``(L, H, N, N)`` (rows summing to 1, causal), each a mean over
query rows, one value per layer and head:

induction       mean weight from each second-copy query (position s + L + i) to the
                token after its earlier occurrence (position s + i + 1), where s is
                the first copy's start (1 after a BOS, else 0)
previous token  mean weight of rows 1..N-1 on the key just before, P[i, i - 1]
sink            mean weight of rows 1..N-1 on key 0, the first token (row 0 has only
                itself to see and is left out)
"""

from __future__ import annotations

import numpy as np

from attention.checks import check_int


def repeated_sequences(
    n_seq: int, length: int, seed: int, low: int, high: int, bos: int | None = None
) -> np.ndarray:
    """``n_seq`` sequences of ``length`` token ids, each repeated twice:
    (n_seq, 2 length) int64, or (n_seq, 1 + 2 length) with ``bos`` leading.

    The ids are drawn independently and uniformly from ``low .. high - 1``
    (``np.random.default_rng(seed).integers(low, high)``), with replacement."""
    n_seq, length = check_int("n_seq", n_seq, 1), check_int("length", length, 2)
    seed, low = check_int("seed", seed, 0), check_int("low", low, 0)
    high = check_int("high", high, 1)
    bos = None if bos is None else check_int("bos", bos, 0)
    if not low < high:
        raise ValueError(f"need 0 <= low < high, got low={low}, high={high}")
    first = np.random.default_rng(seed).integers(low, high, size=(n_seq, length))
    seqs = np.concatenate([first, first], axis=1)  # (n_seq, 2 length)
    if bos is not None:
        seqs = np.concatenate([np.full((n_seq, 1), bos), seqs], axis=1)
    return seqs.astype(np.int64)


def _maps(maps) -> np.ndarray:
    p = np.asarray(maps, dtype=np.float64)
    if p.ndim != 4 or p.shape[-1] != p.shape[-2] or p.shape[-1] < 2:
        raise ValueError(
            f"maps must be (layers, heads, N, N) with N >= 2, got {p.shape}"
        )
    return p


def induction_scores(maps, length: int) -> np.ndarray:
    """(layers, heads): the mean weight from each second-copy query to the token
    after that token's earlier occurrence. ``maps`` (layers, heads, N, N) of one
    repeated sequence whose two copies of ``length`` tokens are its last 2 length
    positions (anything before them, a BOS, is the start s = N - 2 length)."""
    p = _maps(maps)
    length = check_int("length", length, 1)
    n = p.shape[-1]
    start = n - 2 * length
    if length < 1 or start < 0:
        raise ValueError(f"maps of N = {n} hold no two copies of length {length}")
    queries = np.arange(start + length, n)  # the second copy
    keys = queries - length + 1  # the token after the earlier occurrence
    return p[..., queries, keys].mean(-1)


def previous_token_scores(maps) -> np.ndarray:
    """(layers, heads): the mean weight of rows 1..N-1 on the token just before."""
    p = _maps(maps)
    rows = np.arange(1, p.shape[-1])
    return p[..., rows, rows - 1].mean(-1)


def sink_scores(maps) -> np.ndarray:
    """(layers, heads): the mean weight of rows 1..N-1 on the first token (key 0)."""
    p = _maps(maps)
    return p[..., 1:, 0].mean(-1)


def copy_losses(losses, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-token losses (..., N - 1) of repeated sequences (``model.loss``: entry
    t is the loss of token t + 1) split into the two copies: (first, second), each
    (..., length - 1), the losses of tokens 1..L-1 of each copy. The first token of
    each copy is left out: nothing before it predicts it."""
    length = check_int("length", length, 2)
    loss = np.asarray(losses, dtype=np.float64)
    if loss.ndim < 1:
        raise ValueError("losses must have a last axis of N - 1 per-token losses")
    n = loss.shape[-1] + 1
    start = n - 2 * length
    if length < 2 or start < 0:
        raise ValueError(f"losses of N = {n} hold no two copies of length {length}")
    # token start + i (i = 1..L-1) has loss index start + i - 1
    first = loss[..., start : start + length - 1]
    second = loss[..., start + length : start + 2 * length - 1]
    return first, second


def measure(model, seqs, length: int) -> dict:
    """Every statistic over the rows of ``seqs`` (n_seq, N), one forward pass each:
    {"induction", "previous", "sink": (n_seq, layers, heads), "loss": (n_seq, N - 1)
    per-token losses in nats}."""
    length = check_int("length", length, 2)
    seqs = np.asarray(seqs)
    if seqs.ndim != 2 or seqs.shape[0] < 1:
        raise ValueError(f"seqs must be (n_seq, N) with n_seq >= 1, got {seqs.shape}")
    out: dict = {"induction": [], "previous": [], "sink": [], "loss": []}
    for ids in seqs:
        h, _, maps = model.forward(ids, weights=True)
        z = model.head(h)[:-1].astype(np.float64)  # (N - 1, vocab)
        m = z.max(-1)
        lse = m + np.log(np.exp(z - m[:, None]).sum(-1))
        out["loss"].append(lse - z[np.arange(len(ids) - 1), ids[1:]])
        out["induction"].append(induction_scores(maps, length))
        out["previous"].append(previous_token_scores(maps))
        out["sink"].append(sink_scores(maps))
    return {k: np.stack(v) for k, v in out.items()}


__all__ = [
    "copy_losses",
    "induction_scores",
    "measure",
    "previous_token_scores",
    "repeated_sequences",
    "sink_scores",
]
