"""Multi-head Latent Attention (``model/attention=mla``), DeepSeek-V2's: keys and values
rebuilt from a small shared latent, which is all the decode cache holds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from llmlab.errors import ConfigError
from llmlab.model.attention import ATTENTION, Attention
from llmlab.model.cache import LatentCache
from llmlab.model.norm import normed
from llmlab.registry import Checked, width


@ATTENTION.register("mla")
class MultiHeadLatentAttention(Attention):
    """Multi-head Latent Attention (DeepSeek-V2, Liu et al. 2024, section 2.1).

    Keys and values are rebuilt from one shared latent c_kv = norm(W_DKV x) of ``kv_rank``
    dims; a separate ``rope_dim`` part carries position: each head's query has its own rotary
    part, and one rotary key is shared by all heads (decoupled RoPE, eq. 14-19). The cache
    holds only c_kv and the shared rotary key. Queries may be low-rank too (``q_rank``).

    With ``absorb`` (decoding), W_UK is folded into the query and W_UV into the output, so
    attention runs in the latent space without expanding the cached keys (section 2.1.2).
    """

    @dataclass
    class Config(Checked):
        kind: str = "mla"
        q_rank: Any = width(0, at_least=0)  # 0: no query compression
        kv_rank: Any = width(96)  # the shared latent's width; the cache holds kv_rank + rope_dim per token and layer
        rope_dim: Any = width(32)  # per-head rotary query dims, and the one shared rotary key's
        nope_dim: Any = width(64)  # per-head query/key dims without position
        v_dim: Any = width(64)  # per-head value dims
        absorb: bool = True  # decode in the latent space (W_UK into the query, W_UV into the output)

        def check(self, prefix: str) -> None:
            if self.rope_dim % 2:
                raise ConfigError(f"{prefix}.rope_dim: must be even (RoPE rotates pairs), got {self.rope_dim}")

    test_settings = {"q_rank": 12, "kv_rank": 16, "rope_dim": 4, "nope_dim": 8, "v_dim": 8}

    def __init__(self, cfg, d_model: int, n_heads: int, bias: bool = False, causal: bool = True):
        super().__init__(causal)
        self.cfg, self.n_heads = cfg, n_heads
        H, qk = n_heads, cfg.nope_dim + cfg.rope_dim
        self.qk_dim = qk
        if cfg.q_rank:
            self.q_down = nn.Linear(d_model, cfg.q_rank, bias=False)
            self.q_norm = nn.RMSNorm(cfg.q_rank, eps=1e-6)
            self.q_up = nn.Linear(cfg.q_rank, H * qk, bias=False)
        else:
            self.q_proj = nn.Linear(d_model, H * qk, bias=False)
        self.kv_down = nn.Linear(d_model, cfg.kv_rank + cfg.rope_dim, bias=False)  # [c_kv ; shared rotary key]
        self.kv_norm = nn.RMSNorm(cfg.kv_rank, eps=1e-6)
        self.kv_up = nn.Linear(cfg.kv_rank, H * (cfg.nope_dim + cfg.v_dim), bias=False)  # [W_UK ; W_UV] per head
        self.o_proj = nn.Linear(H * cfg.v_dim, d_model, bias=bias)

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        return (self.cfg.kv_rank + self.cfg.rope_dim) * dtype_bytes

    def caveat(self, d_model: int, max_seq_len: int) -> str | None:
        latent, mha = self.cfg.kv_rank + self.cfg.rope_dim, 2 * d_model
        if latent >= mha:
            return (f"mla caches attention.kv_rank + attention.rope_dim = {latent} values per token and layer, "
                    f"not fewer than mha's 2 x model.d_model = {mha}: at this width its latent saves no cache; "
                    f"lower attention.kv_rank (and rope_dim) to compare like with like")
        return None

    def flops_per_token(self, seq_len: int) -> int:
        return 6 * self.n_heads * seq_len * (self.qk_dim + self.cfg.v_dim)

    def new_cache(self, batch: int, max_len: int, device, dtype, slack: int = 0) -> LatentCache:
        return LatentCache(batch, max_len, self.cfg.kv_rank, self.cfg.rope_dim, device, dtype)

    def _split_up(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK (H, nope, kv_rank) and W_UV (H, v, kv_rank) from the stacked up-projection."""
        w = self.kv_up.weight.view(self.n_heads, self.cfg.nope_dim + self.cfg.v_dim, self.cfg.kv_rank)
        return w[:, :self.cfg.nope_dim], w[:, self.cfg.nope_dim:]

    def forward(self, x: torch.Tensor, pos, positions: torch.Tensor, cache: LatentCache | None = None,
                need_weights: bool = False, select=None):
        B, T, _ = x.shape
        H, c = self.n_heads, self.cfg
        q = self.q_up(normed(self.q_norm, self.q_down(x))) if c.q_rank else self.q_proj(x)
        q = q.view(B, T, H, self.qk_dim).transpose(1, 2)  # (B, H, T, nope + rope)
        q_nope, q_rope = q.split([c.nope_dim, c.rope_dim], dim=-1)
        q_rope = pos.rotate(q_rope)
        latent, k_rope = self.kv_down(x).split([c.kv_rank, c.rope_dim], dim=-1)
        latent = normed(self.kv_norm, latent)  # (B, T, kv_rank)
        k_rope = pos.rotate(k_rope[:, None])  # (B, 1, T, rope): one rotary key for all heads
        k_pos = positions
        if cache is not None:
            latent, k_rope, k_pos = cache.append(latent, k_rope)
        mask = None
        if select is not None:  # a sparse kind's pick of keys (see `Attention.forward`)
            (latent, k_rope), k_pos, mask = select((latent, k_rope), (1, 2), k_pos)
        scale = 1 / math.sqrt(self.qk_dim)
        Tk = latent.shape[1]
        if cache is not None and c.absorb and not need_weights:
            w_uk, w_uv = self._split_up()
            q_lat = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # W_UK folded into the query
            qa = torch.cat([q_lat, q_rope], dim=-1)  # (B, H, T, kv_rank + rope)
            ka = torch.cat([latent[:, None], k_rope], dim=-1).expand(B, H, Tk, c.kv_rank + c.rope_dim)
            va = latent[:, None].expand(B, H, Tk, c.kv_rank)
            o_lat, weights = self.sdpa(qa, ka, va, positions, k_pos, False, pos, scale, mask)
            y = torch.einsum("bhtr,hvr->bhtv", o_lat, w_uv)  # W_UV folded into the output
        else:
            kv = self.kv_up(latent).view(B, Tk, H, c.nope_dim + c.v_dim).transpose(1, 2)
            k_nope, v = kv.split([c.nope_dim, c.v_dim], dim=-1)
            k = torch.cat([k_nope, k_rope.expand(B, H, Tk, c.rope_dim)], dim=-1)
            y, weights = self.sdpa(torch.cat([q_nope, q_rope], dim=-1), k, v, positions, k_pos, need_weights, pos, scale,
                                   mask)
        y = y.transpose(1, 2).reshape(B, T, H * c.v_dim)
        return self.o_proj(y), weights
