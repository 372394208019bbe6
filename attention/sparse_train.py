"""A small model trained both ways (chapter 8): dense attention against attention over
the key blocks MoBA's gate selects, on associative recall, at several budgets.

The task (``recall_batch``): N - 1 tokens, each a (key, value) pair (keys from a
vocabulary of ``n_keys``, values one of ``n_values`` classes), then a query token that
names one key. The query's key occurs exactly once before it (the needle, at a uniform
position); the answer is its value. Chance is 1 / ``n_values``.

The model (``RecallModel``): one attention layer of one head, nothing else. Token t
embeds as E_key[key_t] + E_value[value_t] (the query as E_key[key] + e_query); q =
W_q x_query, K = W_k X, V = W_v X; the answer's logits are W_o o. Dense, the query
attends to every token (it is the last: causal attention sees them all). Selected
(``topk`` = k), it reads only the k blocks of ``block_size`` keys that MoBA's gate
picks: block c scores q . mean(K[block c]), the query's own (last) block is always
chosen, the rest by score, ties to the lower block (``moba_keep``, equal to
``attention.sparse.select_blocks`` for the last query; tested). Softmax over the kept
keys only: the gradient reaches the weights of the chosen keys, never the choice
itself, which MoBA learns only through the keys and queries it shares with attention.

``train`` trains one model (Adam, fresh batches, seeded); ``evaluate`` gives accuracy
and the needle's hit rate (the share of queries whose chosen blocks hold the needle);
``run`` trains dense and selected models at every budget and evaluates the dense one
under selection too (trained dense, selected at inference). ``python -m
attention.sparse_train --record`` writes ``RECORD`` (config, seed, accuracies, the
command, date, wall time, torch version); ``load_record`` reads it. torch (CPU) is
imported only to train.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import time

import numpy as np

from .checks import check_int

__all__ = [
    "CONFIG",
    "RECORD",
    "evaluate",
    "load_record",
    "moba_keep",
    "recall_batch",
    "run",
    "train",
]

#: The recorded run: repository root / figures / data / sparse_train.json.
RECORD = pathlib.Path(__file__).resolve().parents[1] / "figures" / "data"
RECORD = RECORD / "sparse_train.json"

#: The recorded configuration (``run``'s defaults).
CONFIG = dict(
    n=256,  # tokens per sequence, the query last
    n_keys=64,
    n_values=16,
    d=64,
    block_size=16,
    budgets=[1, 2, 4, 8, 12],  # blocks per query (16 blocks in all)
    steps=2000,
    batch=64,
    lr=3e-3,
    n_test=2048,
)
RECORD_KEYS = ("config", "seed", "dense", "selected", "dense_selected", "command",
               "date", "wall_s", "versions")  # fmt: skip


def _check_config(cfg: dict) -> dict:
    out = dict(CONFIG, **cfg)
    unknown = set(cfg) - set(CONFIG)
    if unknown:
        raise ValueError(
            f"unknown config keys {sorted(unknown)}; known: {list(CONFIG)}"
        )
    for name in ("n", "n_keys", "n_values", "d", "block_size", "steps", "batch",
                 "n_test"):  # fmt: skip
        out[name] = check_int(name, out[name], 1 if name != "steps" else 0)
    if out["n_keys"] < 2:
        raise ValueError(
            f"n_keys must be >= 2 (a needle and others), got {out['n_keys']}"
        )
    if out["n"] < 2:
        raise ValueError(f"n must be >= 2 (a needle and the query), got {out['n']}")
    n_blocks = -(-out["n"] // out["block_size"])
    out["budgets"] = [check_int("budgets", k, 1) for k in out["budgets"]]
    if any(k > n_blocks for k in out["budgets"]):
        raise ValueError(
            f"budgets must be at most the {n_blocks} blocks, got {out['budgets']}"
        )
    if not (isinstance(out["lr"], (int, float)) and 0 < out["lr"] < 1):
        raise ValueError(f"lr must be a number in (0, 1), got {out['lr']!r}")
    return out


def recall_batch(batch: int, n: int, n_keys: int, n_values: int, rng) -> dict:
    """One batch of the task as int64 arrays: keys (batch, n), values (batch, n) (the
    query's key at position n - 1, its value there unused), needle (batch,) the
    position of the query's key among 0..n-2, target (batch,) its value."""
    batch = check_int("batch", batch, 1)
    n = check_int("n", n, 2)  # a needle and the query
    n_keys = check_int("n_keys", n_keys, 2)  # the query's key and the others'
    n_values = check_int("n_values", n_values, 1)
    keys = rng.integers(0, n_keys - 1, (batch, n))
    query = rng.integers(0, n_keys, batch)
    keys += keys >= query[:, None]  # every other token's key differs from the query's
    needle = rng.integers(0, n - 1, batch)
    rows = np.arange(batch)
    keys[rows, needle] = query
    keys[:, -1] = query
    values = rng.integers(0, n_values, (batch, n))
    return {"keys": keys, "values": values, "needle": needle,
            "target": values[rows, needle]}  # fmt: skip


def moba_keep(scores, block_size: int, topk: int | None):
    """The keys the last query reads, (B, N) bool (torch), from its dot products
    ``scores`` (B, N) = q . k_t: every key if ``topk`` is None, else the keys of the
    ``topk`` blocks of MoBA's gate. The gate's q . mean(k[block]) is the mean of the
    block's q . k_t (a mean of dot products is the dot product with the mean); the
    query's own (last) block first, then by score, ties to the lower block."""
    import torch

    if not isinstance(scores, torch.Tensor) or scores.ndim != 2:
        raise ValueError(
            f"scores must be a 2-D (B, N) torch tensor, got {type(scores).__name__} "
            f"of shape {tuple(getattr(scores, 'shape', ()))}"
        )
    block_size = check_int("block_size", block_size, 1)
    topk = _check_topk(topk)
    b, n = scores.shape
    if topk is None:
        return torch.ones(b, n, dtype=torch.bool)
    n_blocks = -(-n // block_size)
    pad = n_blocks * block_size - n
    sums = torch.nn.functional.pad(scores.detach(), (0, pad))
    counts = torch.full((n_blocks,), float(block_size))
    counts[-1] = block_size - pad
    gate = sums.reshape(b, n_blocks, block_size).sum(2) / counts
    # the own (last) block always, then the rest by score: a stable sort, descending,
    # puts NaN above every number and ties to the lower index (select_blocks' order)
    blocks = torch.zeros(b, n_blocks, dtype=torch.bool)
    blocks[:, -1] = True
    rest = torch.sort(gate[:, :-1], dim=1, descending=True, stable=True).indices
    blocks.scatter_(1, rest[:, : topk - 1], True)
    return blocks.repeat_interleave(block_size, dim=1)[:, :n]


def _check_topk(topk):
    """A budget: None (dense) or an int >= 1 (blocks per query)."""
    return None if topk is None else check_int("topk", topk, 1)


def _model(cfg, seed):
    import torch

    class RecallModel(torch.nn.Module):
        """One attention head over (key, value) tokens. A token's key and value are
        linear in its embedding E_key[a] + E_value[b], so q . k_t is a look-up in q's
        dot products with the projected tables (W_k E_key, W_k E_value), and o =
        sum_t p_t v_t sums p per key and per value before one product with the
        projected tables: a step costs O(B N), not O(B N d)."""

        def __init__(self):
            super().__init__()
            d = cfg["d"]
            self.key = torch.nn.Embedding(cfg["n_keys"], d)
            self.value = torch.nn.Embedding(cfg["n_values"], d)
            self.query = torch.nn.Parameter(torch.zeros(d))
            self.wq, self.wk, self.wv = (torch.nn.Linear(d, d, bias=False)
                                         for _ in range(3))  # fmt: skip
            self.wo = torch.nn.Linear(d, cfg["n_values"])

        def forward(self, keys, values, topk=None, return_keep=False):
            x_q = self.key(keys[:, -1]) + self.query  # the query token: no value
            ek, ev = self.key.weight, self.value.weight
            q = self.wq(x_q)  # (B, d)
            ks, vs = keys[:, :-1], values[:, :-1]  # the context before the query
            dots = torch.cat(
                [
                    (q @ self.wk(ek).T).gather(1, ks)
                    + (q @ self.wk(ev).T).gather(1, vs),
                    (q * self.wk(x_q)).sum(1, keepdim=True),
                ],
                dim=1,
            )  # (B, N): q . k_t
            keep = moba_keep(dots, cfg["block_size"], topk)
            s = dots.masked_fill(~keep, -torch.inf) / cfg["d"] ** 0.5
            p = torch.softmax(s, dim=1)
            pc = p[:, :-1]
            per_key = torch.zeros(len(q), len(ek)).scatter_add(1, ks, pc)
            per_value = torch.zeros(len(q), len(ev)).scatter_add(1, vs, pc)
            o = per_key @ self.wv(ek) + per_value @ self.wv(ev)
            o = o + p[:, -1:] * self.wv(x_q)
            logits = self.wo(o)
            return (logits, keep) if return_keep else logits

    torch.manual_seed(seed)
    return RecallModel()


def _one_thread():
    """Train and evaluate on one CPU thread: the tensors are small (O(B N)), and
    torch's threads only spin against each other on a shared machine."""
    import torch

    torch.set_num_threads(1)


def _tensors(batch):
    import torch

    return {name: torch.from_numpy(a) for name, a in batch.items()}


def train(cfg: dict | None = None, topk: int | None = None, seed: int = 0):
    """Train one model (``topk`` None: dense; else MoBA's ``topk`` blocks) for
    ``cfg["steps"]`` Adam steps on fresh batches; returns (model, losses)."""
    import torch

    cfg = _check_config(cfg or {})
    seed = check_int("seed", seed, 0)
    topk = _check_topk(topk)
    _one_thread()
    rng = np.random.default_rng(seed)
    model = _model(cfg, seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    losses = []
    for _ in range(cfg["steps"]):
        t = _tensors(recall_batch(cfg["batch"], cfg["n"], cfg["n_keys"],
                                  cfg["n_values"], rng))  # fmt: skip
        loss = torch.nn.functional.cross_entropy(
            model(t["keys"], t["values"], topk), t["target"]
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return model, losses


def evaluate(model, cfg: dict | None = None, topk: int | None = None, seed=10**6):
    """{"accuracy", "hit"} of ``model`` on ``cfg["n_test"]`` sequences of ``seed``
    (``run`` trains on ``seed`` and tests on 10**6 + ``seed``: never a batch it
    trained on); ``hit`` the share whose kept keys hold the needle (1 for dense)."""
    import torch

    cfg = _check_config(cfg or {})
    topk = _check_topk(topk)
    seed = check_int("seed", seed, 0)
    _one_thread()
    rng = np.random.default_rng(seed)
    t = _tensors(recall_batch(cfg["n_test"], cfg["n"], cfg["n_keys"],
                              cfg["n_values"], rng))  # fmt: skip
    with torch.no_grad():
        logits, keep = model(t["keys"], t["values"], topk, return_keep=True)
    rows = torch.arange(len(t["needle"]))
    return {
        "accuracy": float((logits.argmax(1) == t["target"]).float().mean()),
        "hit": float(keep[rows, t["needle"]].float().mean()),
    }


def run(cfg: dict | None = None, seed: int = 0, progress=None) -> dict:
    """Train dense and at every budget (one seed), evaluate each on the same test
    set, and the dense model under selection: the record without its provenance."""
    cfg = _check_config(cfg or {})
    seed = check_int("seed", seed, 0)
    test_seed = 10**6 + seed
    dense, _ = train(cfg, None, seed)
    out = {
        "config": cfg,
        "seed": seed,
        "dense": evaluate(dense, cfg, None, test_seed),
        "selected": {},
        "dense_selected": {},
    }
    for k in cfg["budgets"]:
        model, _ = train(cfg, k, seed)
        out["selected"][str(k)] = evaluate(model, cfg, k, test_seed)
        out["dense_selected"][str(k)] = evaluate(dense, cfg, k, test_seed)
        if progress is not None:
            progress(k, out)
    return out


def load_record(path=None) -> dict:
    """The recorded run (``RECORD`` unless ``path``) with its budgets as ints:
    {"config", "seed", "dense", "selected" {k: {"accuracy", "hit"}}, "dense_selected",
    "command", "date", "wall_s", "versions"}."""
    path = RECORD if path is None else pathlib.Path(path)
    rec = json.loads(path.read_text(encoding="utf-8"))
    missing = [k for k in RECORD_KEYS if k not in rec]
    if missing:
        raise ValueError(f"{path} is not a sparse_train record: missing {missing}")
    for key in ("selected", "dense_selected"):
        rec[key] = {int(k): v for k, v in rec[key].items()}
    return rec


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="python -m attention.sparse_train")
    parser.add_argument("--record", action="store_true", help=f"write {RECORD}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=CONFIG["steps"])
    args = parser.parse_args(argv)
    t0 = time.perf_counter()

    def say(k, out):
        acc = out["selected"][str(k)]["accuracy"]
        print(f"budget {k}: accuracy {acc:.3f} ({time.perf_counter() - t0:.0f} s)",
              flush=True)  # fmt: skip

    rec = run({"steps": args.steps}, args.seed, say)
    rec["command"] = (
        "python -m attention.sparse_train"
        + (" --record" if args.record else "")
        + (f" --seed {args.seed}" if args.seed else "")
        + (f" --steps {args.steps}" if args.steps != CONFIG["steps"] else "")
    )
    rec["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    rec["wall_s"] = round(time.perf_counter() - t0, 1)
    rec["versions"] = {"torch": torch.__version__, "numpy": np.__version__,
                       "python": platform.python_version(),
                       "threads": torch.get_num_threads()}  # fmt: skip
    print(f"dense: accuracy {rec['dense']['accuracy']:.3f}; wall {rec['wall_s']} s")
    if args.record:
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
