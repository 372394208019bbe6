"""SmolLM2's attention through the book's Triton kernels: the prompt by
``kernels.flash.flash_attention`` (causal, GQA), each new token by
``kernels.decode.attention_with_kvcache`` over a paged KV cache (vLLM's
PagedAttention, flash-attn's call), everything else in NumPy (``smollm2``).

The cache is a pool of pages ``(n_layers, num_pages, page_size, H_kv, d)`` float32 on
the kernels' device (the Triton interpreter's CPU tensors without a GPU), one block
table for the sequence, shared by all layers (a page number means the same page in
every layer's pool, as in vLLM). The decode kernel does not append keys (flash-attn's
``k=``/``v=`` arguments are not part of it), so ``attend`` writes the new tokens' keys
and values into their pages first, token t at page ``table[t // page_size]``, slot
``t % page_size``, pages drawn from ``attention.decode.PageAllocator``; then the
kernel reads them through the block table with ``cache_seqlens`` = tokens so far.
"""

from __future__ import annotations

import math

import numpy as np

from attention.checks import check_int
from attention.decode import PageAllocator

#: Keys per page: the interpreter's key tile (16), so a tile is one page.
PAGE_SIZE = 16


class PagedKernelCache:
    """Keys and values of one sequence in pages, attended by the book's kernels.

    ``attend(layer, q, k, v)`` takes the n new tokens' q (1, H, n, d) and k, v
    (1, H_kv, n, d) (NumPy float32, RoPE applied) and returns (o (1, H, n, d), None):
    the first call of a layer (the prompt) runs ``flash_attention``, later ones
    ``attention_with_kvcache`` after writing k, v into the pages."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        capacity: int,
        page_size: int = PAGE_SIZE,
    ):
        import torch

        from kernels import runtime  # sets up the interpreter when there is no GPU

        n_layers = check_int("n_layers", n_layers, 1)
        n_kv_heads = check_int("n_kv_heads", n_kv_heads, 1)
        head_dim = check_int("head_dim", head_dim, 1)
        capacity = check_int("capacity", capacity, 1)
        page_size = check_int("page_size", page_size, 1)

        self.torch, self.device = torch, runtime.DEVICE
        self.page_size = page_size
        num_pages = math.ceil(capacity / page_size)
        self.pool = PageAllocator(num_pages)
        shape = (n_layers, num_pages, page_size, n_kv_heads, head_dim)
        self.k_pages = torch.zeros(shape, dtype=torch.float32, device=self.device)
        self.v_pages = torch.zeros(shape, dtype=torch.float32, device=self.device)
        self.table: list[int] = []  # logical page -> physical page
        self.length = 0  # tokens whose keys every layer holds

    def _write(self, layer: int, k, v) -> None:
        """Keys and values (1, H_kv, n, d) of positions length .. length + n - 1 into
        their pages (new pages from the pool when a page fills)."""
        n = k.shape[2]
        last = self.length + n - 1
        while len(self.table) <= last // self.page_size:
            self.table.append(self.pool.alloc())
        pos = np.arange(self.length, self.length + n)
        page = np.asarray(self.table)[pos // self.page_size]  # (n,) physical pages
        slot = pos % self.page_size
        for cache, new in ((self.k_pages, k), (self.v_pages, v)):
            rows = self._tensor(new[0].transpose(1, 0, 2))  # (n, H_kv, d)
            cache[layer, self._tensor(page), self._tensor(slot)] = rows

    def _tensor(self, x):
        return self.torch.from_numpy(np.ascontiguousarray(x)).to(self.device)

    def attend(self, layer: int, q, k, v, weights: bool = False):
        from kernels.decode import attention_with_kvcache
        from kernels.flash import flash_attention

        torch = self.torch
        self._write(layer, k, v)
        if self.length == 0:  # the prompt: causal attention over its own tokens
            o = flash_attention(
                self._tensor(q), self._tensor(k), self._tensor(v), causal=True
            )  # (1, H, n, d)
            return o.cpu().numpy(), None
        n = q.shape[2]
        seqlens = torch.tensor([self.length + n], dtype=torch.int32, device=self.device)
        table = torch.tensor([self.table], dtype=torch.int32, device=self.device)
        o = attention_with_kvcache(
            self._tensor(q.transpose(0, 2, 1, 3)),  # (1, n, H, d)
            self.k_pages[layer],  # (num_pages, page_size, H_kv, d)
            self.v_pages[layer],
            seqlens,
            table,
            causal=True,
        )  # (1, n, H, d)
        return o.cpu().numpy().transpose(0, 2, 1, 3), None  # (1, H, n, d)

    def advance(self, n: int) -> None:
        self.length += n


__all__ = ["PAGE_SIZE", "PagedKernelCache"]
