"""Attention variants (config group ``model/attention``, settings at ``attention.*``).

Training and generation run through `F.scaled_dot_product_attention`, which picks a
flash or memory-efficient kernel where the device has one. ``need_weights=True`` takes a
plain math path that also returns the attention weights, for analysis.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmlab.errors import ConfigError
from llmlab.model import flex, ring
from llmlab.model.cache import KVCache, RollingKVCache
from llmlab.model.ring import ring_attention
from llmlab.model.config import ATTENTION
from llmlab.registry import bounded, width
from llmlab.model.norm import normed
from llmlab.model.position import PositionView, RotaryAngles

# position schemes whose view of a pass rotates queries and keys, or leaves them, and biases no
# score: a decoded token may take `GroupedQueryAttention.decode_token` under them
INLINE_VIEWS = (PositionView, RotaryAngles)

# `enable_gqa` lets SDPA broadcast shared KV heads without copying them (torch >= 2.5).
_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def decode_backends(device: torch.device) -> list | None:
    """The SDPA backends decoding may use on ``device``; None leaves PyTorch's choice alone.

    On CUDA, SDPA prefers cuDNN's fused attention for bf16 on Hopper, which builds an execution
    plan for every new key length. Decoding meets a new length at every step, so in a fresh
    process each token paid for a plan: ``llmlab sample`` of the 4-layer ``tiny`` model in bf16
    on an H100 gave 19 tokens/s, against 148 in fp32; with cuDNN left out, 177 to 274. Flash
    and memory-efficient attention take any length as it comes. Training keeps cuDNN, where
    the shapes repeat and it is the fastest."""
    if device.type != "cuda":
        return None
    from torch.nn.attention import SDPBackend
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_attention(device: torch.device):
    """A context in which SDPA uses only ``decode_backends(device)`` (see there)."""
    backends = decode_backends(device)
    if backends is None:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel
    return sdpa_kernel(backends)


_REDUCED = (torch.bfloat16, torch.float16)


def fused_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention``, except on the CPU in bf16 or fp16 (``precision=bf16``
    autocasts the projections to bf16), where the scores are computed in fp32 and the result is
    cast back. PyTorch's CPU flash kernel is much slower in bf16 than in fp32: 5.5 against 0.77
    ms for the backward of one layer at nanoGPT's shakespeare-char shapes (batch 12, 4 heads,
    64 positions of 32 dims; torch 2.14.1, AVX-512 BF16), which took the bf16 matmuls' 2x back
    and more. The attention core is a small part of the arithmetic; fp32 there is also what a
    GPU's kernels accumulate in. Decoding under CPU autocast keeps its cache in fp32
    (`llmlab.model.cache.cache_dtype`), so one query meets fp32 keys and only it is cast;
    one query with keys in its own reduced dtype (a model whose parameters are bf16) keeps
    the bf16 kernel, where casting the whole cache at every step costs about what it saves."""
    same = q.dtype == k.dtype == v.dtype
    if q.device.type != "cpu" or (same and (q.dtype not in _REDUCED or q.shape[-2] == 1)):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.is_floating_point():
        kwargs["attn_mask"] = mask.float()
    with torch.autocast("cpu", enabled=False):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs).to(q.dtype)


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool,
                   window: int | None = None) -> torch.Tensor | None:
    """Boolean (Tq, Tk) mask, True where a query may look at a key; None means all. Keys picked
    per sequence (``k_pos`` (B, Tk), as a sparse kind gathers them) give (B, Tq, Tk)."""
    if not causal and window is None:
        return None
    diff = q_pos[:, None] - k_pos[..., None, :]  # (Tq, Tk) or (B, Tq, Tk): how far back the key is
    if causal:
        allowed = diff >= 0
        return allowed & (diff < window) if window is not None else allowed
    return diff.abs() < window


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   scale: float | None = None, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + bias, masked) v, returning the weights too. q: (B, H, Tq, D);
    scale defaults to 1 / sqrt(D); bias (H, Tq, Tk) or None."""
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return (weights @ v.float()).to(q.dtype), weights


class Attention(nn.Module):
    """What every attention kind provides. Built as ``cls(cfg, d_model, n_heads, bias=,
    causal=)``. Shapes: ``x`` (B, T, d_model); ``pos`` the position scheme's `PositionView`
    for this pass (it rotates queries and keys, and may bias the scores; `sdpa` asks it);
    ``positions`` (T,) absolute positions of x's tokens; ``cache`` the kind's own decode cache
    (`new_cache`) or None. ``forward`` returns (B, T, d_model) and, with ``need_weights``, the
    weights (B, H, T, Tk), else None.

    A kind subclasses this (or `GroupedQueryAttention`, whose forward is three seams:
    `project`, `rotate`, `attend`) and registers with ``@ATTENTION.register(name)``; its Config
    is nested in it, or an option declared in `llmlab.model.config`. A kind can be one file in
    this package."""

    #: settings that keep a test model small (tests build every registered kind with them)
    test_settings: dict = {}
    #: a factor on the scores' 1/sqrt(D) scale (muP sets it; see `Transformer`)
    score_mult: float = 1.0
    #: the name its auxiliary losses are logged under (``indexer/kl``); None: it has none
    aux_name: str | None = None
    #: trains with the sequence split across ranks (``train.context_parallel``): its training
    #: forward attends through `sdpa` with no mask but the causal one
    context_parallel: bool = True
    #: a decoded token takes the kind's own one-pass path (`GroupedQueryAttention.decode_token`)
    decodes_inline: bool = False

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, x: torch.Tensor, pos, positions: torch.Tensor, cache=None,
                need_weights: bool = False, select=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``select``, from a sparse kind that wraps this one (dsa): called once the cache has
        its keys, as ``select(tensors, seq_dims, k_pos)`` with this kind's cached tensors and the
        axis of each that runs over positions; returns them (gathered, or as they were), their
        positions and a (B, Tq, Tk) mask of the keys each query may see, or None."""
        raise NotImplementedError

    def at_step(self, step: int) -> None:
        """The training step about to run (a kind whose training has phases reads it)."""

    def take_aux(self) -> dict[str, torch.Tensor]:
        """Auxiliary losses and metrics of the last forward (``weighted``: added to the loss),
        logged under ``aux_name``."""
        return {}

    def new_cache(self, batch: int, max_len: int, device, dtype, slack: int = 0):
        """A decode cache for ``max_len`` positions (``slack``: how far it may be rolled back)."""
        raise NotImplementedError

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        raise NotImplementedError

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs of the score and value matmuls per token (weights are counted apart)."""
        raise NotImplementedError

    def residual_projections(self) -> list[nn.Linear]:
        """The projections that write into the residual stream (their init is scaled down)."""
        return [self.o_proj]

    def window(self) -> int | None:
        """How many positions back a query sees (None: all)."""
        return None

    def key_mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """(Tq, Tk) True where a query sees a key (None: every key); for analysis."""
        return attention_mask(q_pos, k_pos, self.causal, self.window())

    def caveat(self, d_model: int, max_seq_len: int) -> str | None:
        """Why this kind, at these sizes, does not show what its name promises in a comparison
        (None: nothing to say). Printed at the start of a run and marked in reports."""
        return None

    def sdpa(self, q, k, v, q_pos, k_pos, need_weights: bool, pos, scale: float | None = None,
             select: torch.Tensor | None = None, **kwargs):
        """Attention of q (B, H, Tq, D) over k, v (B, H or Hkv, Tk, D) under this kind's mask
        and the position scheme's score bias, if any: the fused kernels where they can (an
        aligned causal mask as a flag, one new query with no mask at all), the math path with
        weights where asked. ``select`` (B, Tq, Tk), from a sparse kind (dsa): the keys each
        query may see besides; ``k_pos`` (B, Tk) where it gathered keys per sequence."""
        Tq, Tk = q.shape[2], k.shape[2]
        if self.score_mult != 1.0:  # muP: 1/D where the standard parametrization has 1/sqrt(D)
            scale = (scale if scale is not None else 1 / math.sqrt(q.shape[-1])) * self.score_mult
        shard = ring.active()
        if shard is not None:  # train.context_parallel: this rank's slice of queries, keys and values
            return ring_attention(q, k, v, shard.group, scale, self.causal), None
        window = self.window()
        bias = pos.bias(q_pos, k_pos, q.shape[1])  # (H, Tq, Tk), (B, H, Tq, Tk) or None
        if pos.documents is not None:  # data.doc_mask: a query sees the keys of its own document only
            if (bias is None and select is None and not need_weights and Tq == Tk == pos.documents.shape[1]
                    and flex.wanted(q)):  # the block-sparse kernel on CUDA (`llmlab.model.flex`)
                return flex.attend(q, k, v, pos.block_mask(self.causal, window), scale,
                                   kwargs.get("enable_gqa", False)), None
            same = pos.same_document(q_pos, k_pos)
            select = same if select is None else select & same
        if (not need_weights and bias is None and select is None and self.causal and window is None
                and (Tq == Tk or Tq == 1)):
            # the fused kernels' own cases, with no mask to build: the aligned square mask as a
            # flag, or one new query that sees every cached key (each decoded token)
            return fused_sdpa(q, k, v, is_causal=Tq == Tk and Tq > 1, scale=scale, **kwargs), None
        mask = attention_mask(q_pos, k_pos, self.causal, window)
        if select is not None:
            mask = select if mask is None else mask & select
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]  # (B, 1, Tq, Tk): the same keys for every head
        if need_weights:
            return math_attention(q, k, v, mask, scale, bias)
        if bias is not None:  # the mask goes into the bias: -inf where a query may not look
            mask = bias.to(q.dtype) if mask is None else bias.to(q.dtype).masked_fill(~mask, float("-inf"))
        y = fused_sdpa(q, k, v, attn_mask=mask, scale=scale, **kwargs)
        return y, None


class GroupedQueryAttention(Attention):
    """Ainslie et al. 2023 (GQA): ``kv_heads`` key/value heads, each shared by a group of
    query heads. kv_heads = heads is multi-head attention, kv_heads = 1 multi-query."""

    def __init__(self, cfg, d_model: int, n_heads: int, bias: bool = False, causal: bool = True):
        super().__init__(causal)
        kv_heads = self.kv_heads_for(cfg, n_heads)
        if n_heads % kv_heads:
            raise ConfigError(
                f"attention.kv_heads: {kv_heads} does not divide model.n_heads={n_heads}")
        if d_model % n_heads:
            raise ConfigError(f"model.n_heads: {n_heads} does not divide model.d_model={d_model}")
        self.cfg = cfg
        self.n_heads, self.kv_heads = n_heads, kv_heads
        self.head_dim = d_model // n_heads
        # q, k and v in one matmul: rows [0, H Dh) are the queries, then Hkv Dh of keys, then values
        self.qkv_proj = nn.Linear(d_model, (n_heads + 2 * kv_heads) * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.decodes_inline = self.inline_decoding()

    @staticmethod
    def kv_heads_for(cfg, n_heads: int) -> int:
        return cfg.kv_heads

    # -- sizes -------------------------------------------------------------------------
    def qkv_sizes(self) -> list[int]:
        """Output widths of q, k and v inside ``qkv_proj``."""
        return [self.n_heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.kv_heads * self.head_dim * dtype_bytes

    def flops_per_token(self, seq_len: int) -> int:
        """Score and value matmuls, forward + backward (PaLM appendix B: 12 H Dh T per layer)."""
        return 6 * self.n_heads * seq_len * (self.head_dim + self.head_dim)

    def new_cache(self, batch: int, max_len: int, device, dtype, slack: int = 0) -> KVCache:
        return KVCache(batch, self.kv_heads, max_len, self.head_dim, self.head_dim, device, dtype)

    # -- forward: project, rotate, (cache), attend, merge --------------------------------
    def forward(self, x: torch.Tensor, pos, positions: torch.Tensor, cache: KVCache | None = None,
                need_weights: bool = False, select=None):
        B, T, _ = x.shape
        if T == 1 and type(cache) is KVCache and self.decodes_inline and type(pos) in INLINE_VIEWS and not (
                need_weights or select is not None or ring.active() is not None):
            return self.decode_token(x, pos, cache), None
        q, k, v = self.project(x)
        q, k = self.rotate(q, k, pos)
        k_pos = positions
        if cache is not None:
            k, v, k_pos = cache.append(k, v)  # (B, Hkv, Tk, Dh)
        mask = None
        if select is not None:  # a sparse kind's pick of keys (see `Attention.forward`)
            (k, v), k_pos, mask = select((k, v), (2, 2), k_pos)
        y, weights = self.attend(q, k, v, positions, k_pos, need_weights, pos, mask)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y), weights

    def inline_decoding(self) -> bool:
        """Whether a decoded token may take `decode_token` (`decodes_inline`): this class keeps
        every seam of this one (`project`, `rotate`, `attend`, `sdpa`, `forward`) and attends
        causally to every cached key, and SDPA shares key heads itself where there are fewer."""
        cls, owner = type(self), self.inline_owner()
        return (self.causal and self.window() is None and (self.kv_heads == self.n_heads or _SDPA_HAS_GQA)
                and all(getattr(cls, name) is getattr(owner, name)
                        for name in ("forward", "project", "rotate", "attend", "sdpa", "decode_heads")))

    @staticmethod
    def inline_owner() -> type:
        """The class whose seams `decode_token` computes (a kind that changes `project` or
        `rotate` keeps the path by naming itself here and doing the same in `decode_heads`)."""
        return GroupedQueryAttention

    def decode_heads(self, qk: torch.Tensor) -> torch.Tensor:
        """A decoded token's queries and keys (B, 1, H + Hkv, Dh) before they are rotated:
        here as projected."""
        return qk

    def decode_token(self, x: torch.Tensor, pos, cache: KVCache) -> torch.Tensor:
        """One new token (B, 1, d) of each sequence: what `forward` computes, in fewer
        operations (decoding a small model is mostly a fixed cost per operation). The heads
        stay in the projection's layout (B, 1, heads, Dh), which for one position is (B,
        heads, 1, Dh) as views, so queries and keys are rotated in one pass, and keys and
        values go into the cache from there."""
        B = x.shape[0]
        H, Hkv, D = self.n_heads, self.kv_heads, self.head_dim
        qkv = self.qkv_proj(x).view(B, 1, H + 2 * Hkv, D)
        qk = pos.rotate(self.decode_heads(qkv[:, :, :H + Hkv]))  # the same angles for every head at one position
        k, v, _ = cache.append(qk[:, :, H:].transpose(1, 2), qkv[:, :, H + Hkv:].transpose(1, 2))
        scale = None if self.score_mult == 1.0 else self.score_mult / math.sqrt(D)  # as `sdpa` scales
        y = fused_sdpa(qk[:, :, :H].transpose(1, 2), k, v, attn_mask=cache.visible(),
                       scale=scale, **({"enable_gqa": True} if Hkv != H else {}))
        return self.o_proj(y.transpose(1, 2).reshape(B, 1, H * D))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, d) -> q (B, H, T, Dh), k and v (B, Hkv, T, Dh)."""
        B, T, _ = x.shape
        q, k, v = self.qkv_proj(x).split(self.qkv_sizes(), dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos) -> tuple[torch.Tensor, torch.Tensor]:
        """Position into q and k (before they are cached)."""
        return pos.rotate(q), pos.rotate(k)

    def attend(self, q, k, v, q_pos, k_pos, need_weights: bool, pos, select: torch.Tensor | None = None):
        """q (B, H, Tq, Dh) over k, v (B, Hkv, Tk, Dh) -> (B, H, Tq, Dh), weights or None."""
        kwargs = {}
        if self.kv_heads != self.n_heads:
            if _SDPA_HAS_GQA and not need_weights:
                kwargs["enable_gqa"] = True  # SDPA broadcasts the shared heads without copies
            else:
                group = self.n_heads // self.kv_heads
                k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return self.sdpa(q, k, v, q_pos, k_pos, need_weights, pos, select=select, **kwargs)


@ATTENTION.register("gqa")
class GQA(GroupedQueryAttention):
    """Grouped-query attention (Ainslie et al. 2023): kv_heads key/value heads, each shared by
    n_heads / kv_heads query heads."""


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


@ATTENTION.register("swa")
class SlidingWindowAttention(GroupedQueryAttention):
    """Causal attention to the last ``window`` positions only (Child et al. 2019; Beltagy et
    al. 2020, Longformer; Mistral 7B). Works with any ``kv_heads`` (null: one per head). The
    decode cache is a rolling buffer of ``window`` positions, so its memory stays bounded."""

    @dataclass
    class Config:
        kind: str = "swa"
        window: Any = width(64, relative_to=("max_seq_len", "d_model"))  # positions each query sees, itself included
        kv_heads: int | None = bounded(None, at_least=1)  # null: one KV head per query head; set it for grouped-query SWA

    test_settings = {"window": 5, "kv_heads": 2}
    context_parallel = False  # a window across slices is not written yet

    @staticmethod
    def kv_heads_for(cfg, n_heads: int) -> int:
        return cfg.kv_heads or n_heads

    def window(self) -> int:
        return self.cfg.window

    def caveat(self, d_model: int, max_seq_len: int) -> str | None:
        if self.cfg.window >= max_seq_len:
            return (f"attention.window={self.cfg.window} >= model.max_seq_len={max_seq_len}: every position sees "
                    f"the whole context, so swa computes exactly what mha does")
        return None

    def new_cache(self, batch: int, max_len: int, device, dtype, slack: int = 0) -> RollingKVCache:
        return RollingKVCache(batch, self.kv_heads, min(self.cfg.window, max_len), self.head_dim, self.head_dim,
                              device, dtype, slack)


@ATTENTION.register("qknorm")
class QKNormAttention(GroupedQueryAttention):
    """Grouped-query attention with RMS-normalised queries and keys per head, before RoPE
    (Dehghani et al. 2023; OLMo 2; Qwen3's layout): attention logits stay bounded at high
    learning rates. ``eps`` is the q/k norms' epsilon; the model spec resolves its null to
    ``norm.eps``."""

    def __init__(self, cfg, d_model: int, n_heads: int, bias: bool = False, causal: bool = True):
        super().__init__(cfg, d_model, n_heads, bias, causal)
        if cfg.eps is None:
            raise ValueError("qknorm: eps is resolved by ModelSpec.from_config (null: norm.eps) before a layer is built")
        self.q_norm, self.k_norm = nn.RMSNorm(self.head_dim, eps=cfg.eps), nn.RMSNorm(self.head_dim, eps=cfg.eps)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The projections with queries and keys normed per head, in the projection's layout
        (B, T, heads, Dh), before the heads move forward: torch's CPU RMSNorm took 5.4 against
        8.5 ms (forward and backward) on the default run's queries laid out so, not transposed."""
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split(self.qkv_sizes(), dim=-1)
        q = normed(self.q_norm, q.view(B, T, H, D)).transpose(1, 2)
        k = normed(self.k_norm, k.view(B, T, Hkv, D)).transpose(1, 2)
        return q, k, v.view(B, T, Hkv, D).transpose(1, 2)

    @staticmethod
    def inline_owner() -> type:
        return QKNormAttention

    def decode_heads(self, qk: torch.Tensor) -> torch.Tensor:
        """`project`'s norms on a decoded token, in the projection's layout: queries, then keys."""
        H = self.n_heads
        return torch.cat((normed(self.q_norm, qk[:, :, :H]), normed(self.k_norm, qk[:, :, H:])), dim=2)
