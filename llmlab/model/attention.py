"""Attention variants (config group ``model/attention``, settings at ``attention.*``).

Training and generation run through `F.scaled_dot_product_attention`, which picks a
flash or memory-efficient kernel where the device has one. ``need_weights=True`` takes a
plain math path that also returns the attention weights, for analysis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llmlab.errors import ConfigError
from llmlab.model.cache import KVCache
from llmlab.registry import Registry

ATTENTION = Registry("attention")

# `enable_gqa` lets SDPA broadcast shared KV heads without copying them (torch >= 2.5).
_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool,
                   window: int | None = None) -> torch.Tensor | None:
    """Boolean (Tq, Tk) mask, True where a query may look at a key; None means all."""
    if not causal and window is None:
        return None
    diff = q_pos[:, None] - k_pos[None, :]  # (Tq, Tk): how far back the key is
    allowed = diff >= 0 if causal else torch.ones_like(diff, dtype=torch.bool)
    if window is not None:
        allowed = allowed & (diff < window)
    return allowed


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d) + mask) v, returning the weights too. q: (B, H, Tq, D)."""
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return (weights @ v.float()).to(q.dtype), weights


class GroupedQueryAttention(nn.Module):
    """Ainslie et al. 2023 (GQA): ``kv_heads`` key/value heads, each shared by a group of
    query heads. kv_heads = heads is multi-head attention, kv_heads = 1 multi-query."""

    @dataclass
    class Config:
        kind: str = "gqa"
        kv_heads: int = 2

        def check(self, prefix: str) -> None:
            if self.kv_heads < 1:
                raise ConfigError(f"{prefix}.kv_heads: must be >= 1, got {self.kv_heads}")

    def __init__(self, cfg, d_model: int, n_heads: int, bias: bool = False, causal: bool = True):
        super().__init__()
        kv_heads = self.kv_heads_for(cfg, n_heads)
        if n_heads % kv_heads:
            raise ConfigError(
                f"attention.kv_heads: {kv_heads} does not divide model.n_heads={n_heads}")
        if d_model % n_heads:
            raise ConfigError(f"model.n_heads: {n_heads} does not divide model.d_model={d_model}")
        self.cfg = cfg
        self.n_heads, self.kv_heads = n_heads, kv_heads
        self.head_dim = d_model // n_heads
        self.causal = causal
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.o_proj.residual_out = True

    @staticmethod
    def kv_heads_for(cfg, n_heads: int) -> int:
        return cfg.kv_heads

    # -- sizes -------------------------------------------------------------------------
    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.kv_heads * self.head_dim * dtype_bytes

    def flops_per_token(self, seq_len: int) -> int:
        """Score and value matmuls, forward + backward (PaLM appendix B: 12 H Dh T per layer)."""
        return 6 * self.n_heads * seq_len * (self.head_dim + self.head_dim)

    def new_cache(self, batch: int, max_len: int, device, dtype) -> KVCache:
        return KVCache(batch, self.kv_heads, max_len, self.head_dim, self.head_dim, device, dtype)

    # -- forward -----------------------------------------------------------------------
    def forward(self, x: torch.Tensor, rotary, positions: torch.Tensor, cache: KVCache | None = None,
                need_weights: bool = False):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotary.apply(q), rotary.apply(k)
        k_pos = positions
        if cache is not None:
            k, v, k_pos = cache.append(k, v)  # (B, Hkv, Tk, Dh)
        y, weights = self.attend(q, k, v, positions, k_pos, need_weights)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y), weights

    def window(self) -> int | None:
        return None

    def attend(self, q, k, v, q_pos, k_pos, need_weights: bool):
        window = self.window()
        if need_weights:
            group = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            return math_attention(q, k, v, attention_mask(q_pos, k_pos, self.causal, window))
        Tq, Tk = q.shape[2], k.shape[2]
        full_causal = self.causal and window is None
        is_causal, mask = False, None
        if full_causal and Tq == Tk:
            is_causal = True  # aligned square mask: the fused kernels take it as a flag
        elif full_causal and Tq == 1:
            pass  # one new query sees every cached key
        else:
            mask = attention_mask(q_pos, k_pos, self.causal, window)
        kwargs = {}
        if self.kv_heads != self.n_heads:
            if _SDPA_HAS_GQA:
                kwargs["enable_gqa"] = True
            else:
                group = self.n_heads // self.kv_heads
                k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, **kwargs)
        return y, None


@ATTENTION.register("gqa")
class GQA(GroupedQueryAttention):
    pass


@ATTENTION.register("mha")
class MHA(GroupedQueryAttention):
    """Vaswani et al. 2017: one key/value head per query head."""

    @dataclass
    class Config:
        kind: str = "mha"

    @staticmethod
    def kv_heads_for(cfg, n_heads: int) -> int:
        return n_heads


@ATTENTION.register("mqa")
class MQA(GroupedQueryAttention):
    """Shazeer 2019: a single key/value head shared by all query heads."""

    @dataclass
    class Config:
        kind: str = "mqa"

    @staticmethod
    def kv_heads_for(cfg, n_heads: int) -> int:
        return 1
