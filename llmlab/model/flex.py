"""``data.doc_mask`` on CUDA: attention kept inside each document by PyTorch's flex attention.

A boolean (B, 1, T, T) mask sends ``scaled_dot_product_attention`` to a kernel that reads the
whole mask and computes every block of scores, including the blocks that lie wholly in
another document. Flex attention takes the mask as a rule (same document, causal, within the
window) and a block mask built from it once per forward, and skips the blocks the rule rules
out; compiled, it is the fused kernel for block-causal attention.

It is used where it pays and is available: CUDA tensors, a training forward (as many queries
as keys), no score bias (ALiBi) and no other key selection (DSA). Elsewhere the mask goes to
SDPA as before; both compute the same attention (the tests compare them on the CPU, where
flex attention runs unfused).
"""

from __future__ import annotations

import functools

import torch

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # an older PyTorch: SDPA with the mask
    create_block_mask = flex_attention = None

FORCE = False  # the tests set it to run the flex path on the CPU


def wanted(q: torch.Tensor) -> bool:
    return flex_attention is not None and (q.is_cuda or FORCE)


@functools.lru_cache(maxsize=None)
def _compiled():
    return torch.compile(flex_attention, dynamic=False)


def block_mask(documents: torch.Tensor, causal: bool, window: int | None):
    """The block mask of (B, T) document ids: a query sees the keys of its own document (at or
    before it, when ``causal``; no more than ``window`` back, when set)."""
    B, T = documents.shape

    def rule(b, h, q, k):
        keep = documents[b, q] == documents[b, k]
        if causal:
            keep = keep & (k <= q)
        if window is not None:
            keep = keep & (q - k < window)
        return keep

    return create_block_mask(rule, B, None, T, T, device=documents.device)


def attend(q, k, v, mask, scale: float | None, enable_gqa: bool = False) -> torch.Tensor:
    """Flex attention of q (B, H, T, D) over k, v (B, Hkv, T, D) under ``mask``."""
    run = _compiled() if q.is_cuda else flex_attention
    return run(q, k, v, block_mask=mask, scale=scale, enable_gqa=enable_gqa)
