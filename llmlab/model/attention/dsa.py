"""DeepSeek Sparse Attention (``model/attention=dsa``), DeepSeek-V3.2's: a small "lightning"
indexer scores every earlier key for each query, and the query attends to its top-k keys only,
under a base attention (MLA, as DeepSeek does, or the GQA family)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmlab.errors import ConfigError
from llmlab.model.attention import ATTENTION, Attention, attention_mask
from llmlab.model.cache import IndexedCache
from llmlab.registry import Checked, bounded, choice, width


class LightningIndexer(nn.Module):
    """I(t, s) = sum_j w(t, j) ReLU(q(t, j) . k(s)) / sqrt(dim * heads): ``heads`` small query
    heads and their weights from the query token, one key per token (layer-normed), queries and
    keys rotated by the position scheme (DeepSeek-V3.2, section 2.1). Scores are computed in
    fp32, so a selection does not depend on the autocast dtype's rounding."""

    def __init__(self, d_model: int, heads: int, dim: int):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.q_proj = nn.Linear(d_model, heads * dim, bias=False)
        self.k_proj = nn.Linear(d_model, dim, bias=False)
        self.k_norm = nn.LayerNorm(dim)
        self.w_proj = nn.Linear(d_model, heads, bias=False)

    def queries(self, x: torch.Tensor, pos) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d) -> queries (B, heads, T, dim) and their weights (B, T, heads)."""
        B, T, _ = x.shape
        q = pos.rotate(self.q_proj(x).view(B, T, self.heads, self.dim).transpose(1, 2))
        return q, self.w_proj(x)

    def keys(self, x: torch.Tensor, pos) -> torch.Tensor:
        """x (B, T, d) -> one key per token (B, T, dim)."""
        return pos.rotate(self.k_norm(self.k_proj(x))[:, None])[:, 0]

    def scores(self, q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """(B, T, Tk) index scores of the queries over the keys k (B, Tk, dim)."""
        dots = (q.float() @ k.float()[:, None].transpose(-2, -1)).relu_()  # (B, heads, T, Tk)
        return torch.einsum("bhts,bth->bts", dots, w.float()) / (self.dim * self.heads) ** 0.5


def top_keys(scores: torch.Tensor, k_pos: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the ``k`` highest ``scores`` (B, T, Tk, float32) per query; of equal
    scores the earlier key first. An exact order, so a decode step (one query over the cached
    keys) picks the set the whole sequence's pass picks; ReLU makes exact ties common (zeros).

    Each score's float32 bits, mapped to an integer in the floats' order, make the high part of
    an int64 key, and the position (below 2^24) the low part."""
    bits = (scores.float() + 0.0).contiguous().view(torch.int32)  # + 0.0: -0.0 becomes 0.0, an equal score
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)  # monotone in the score
    key = ordered * 2 ** 24 + (2 ** 24 - 1 - k_pos.to(torch.int64))
    return key.topk(k, dim=-1, sorted=False).indices


def gather_positions(t: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """The entries of ``t`` at the positions ``index`` (B, k) along axis ``dim`` (B first)."""
    B, k = index.shape
    view = [B] + [1] * (dim - 1) + [k] + [1] * (t.dim() - dim - 1)
    return t.gather(dim, index.view(view).expand(*t.shape[:dim], k, *t.shape[dim + 1:]))


@ATTENTION.register("dsa")
class DeepSeekSparseAttention(Attention):
    """DeepSeek Sparse Attention (DeepSeek-AI 2025, DeepSeek-V3.2, section 2).

    Each query attends, under the ``base`` attention, to the ``topk`` earlier keys that the
    lightning indexer scores highest (to all of them while there are fewer); of equal scores
    the earlier key goes first, in every pass alike (`top_keys`).

    Training follows the paper's two stages. For ``dense_warmup`` steps attention is dense and
    the indexer learns to match the main attention's distribution over the keys (summed over
    heads, normalised) by KL divergence; then attention is sparse and the KL covers the selected
    keys only. The indexer reads a detached copy of the layer input and the target is detached,
    so the language-model loss never trains the indexer and the KL never trains the model.
    Outside training (evaluation, decoding) attention is always sparse.

    Decoding caches the indexer's key beside the base's cache; each new query scores every
    cached key and its base attends to the gathered top-k only.
    """

    @dataclass
    class Config(Checked):
        """DeepSeek Sparse Attention (DeepSeek-V3.2): a lightning indexer scores every earlier key,
        and each query attends to its ``topk`` best under the ``base`` attention. The base's own
        settings sit beside: MLA's widths where base=mla, ``kv_heads`` where base=gqa."""

        kind: str = "dsa"
        base: str = choice("mla", ("mla", "mha", "gqa", "mqa"))  # the attention the indexer selects keys for
        topk: int = bounded(64, at_least=1)  # keys each query attends to (all earlier ones while there are fewer)
        index_heads: int = bounded(4, at_least=1)  # the indexer's heads
        index_dim: int = bounded(32, at_least=2)  # the indexer's query/key width (even: RoPE rotates it); cached per token
        dense_warmup: int = bounded(100, at_least=0)  # training steps of dense attention while the indexer learns to follow it
        index_weight: float = bounded(1.0, above=0)  # weight of the indexer's KL loss (it trains the indexer alone)
        kv_heads: int = bounded(2, at_least=1)  # base=gqa: key/value heads
        q_rank: Any = width(0, at_least=0)  # base=mla: as attention=mla's settings
        kv_rank: Any = width(96)
        rope_dim: Any = width(32)
        nope_dim: Any = width(64)
        v_dim: Any = width(64)
        absorb: bool = True

        def check(self, prefix: str) -> None:
            if self.index_dim % 2:
                raise ConfigError(f"{prefix}.index_dim: must be even (RoPE rotates pairs), got {self.index_dim}")
            if self.base == "mla":
                self.base_config().check(prefix)

        def base_config(self) -> Any:
            """The base attention's own Config."""
            base = ATTENTION.config_of(self.base)
            if self.base == "mla":
                return base(q_rank=self.q_rank, kv_rank=self.kv_rank, rope_dim=self.rope_dim, nope_dim=self.nope_dim,
                            v_dim=self.v_dim, absorb=self.absorb)
            return base(kv_heads=self.kv_heads) if self.base == "gqa" else base()

    aux_name = "indexer"
    context_parallel = False  # the indexer ranks every earlier key, which a slice does not hold
    test_settings = {"topk": 4, "index_heads": 2, "index_dim": 8, "q_rank": 12, "kv_rank": 16, "rope_dim": 4,
                     "nope_dim": 8, "v_dim": 8}

    def __init__(self, cfg, d_model: int, n_heads: int, bias: bool = False, causal: bool = True):
        super().__init__(causal)
        self.cfg = cfg
        self.base = ATTENTION.build(cfg.base_config(), d_model, n_heads, bias=bias, causal=causal)
        self.indexer = LightningIndexer(d_model, cfg.index_heads, cfg.index_dim)
        self.dense_phase = False  # training's dense warm-up (`at_step`)
        self._aux: dict[str, torch.Tensor] = {}

    # the base attends, so muP's score factor is its
    @property
    def score_mult(self) -> float:
        return self.base.score_mult

    @score_mult.setter
    def score_mult(self, value: float) -> None:
        self.base.score_mult = value

    def at_step(self, step: int) -> None:
        self.dense_phase = step < self.cfg.dense_warmup

    def take_aux(self) -> dict[str, torch.Tensor]:
        aux, self._aux = self._aux, {}
        return aux

    # -- the card ----------------------------------------------------------------------
    def residual_projections(self) -> list[nn.Linear]:
        return self.base.residual_projections()

    def key_mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        return self.base.key_mask(q_pos, k_pos)  # the keys the indexer chooses among

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.base.kv_cache_bytes_per_token(dtype_bytes) + self.cfg.index_dim * dtype_bytes

    def flops_per_token(self, seq_len: int) -> int:
        """The base's attention over ``topk`` keys (where fewer than the context) and the
        indexer's over all of them: as a sparse kernel counts it. (Training here computes the
        selected scores within dense masked matmuls; decoding gathers the top-k keys.)"""
        return (self.base.flops_per_token(min(seq_len, self.cfg.topk))
                + 6 * self.cfg.index_heads * self.cfg.index_dim * seq_len)

    def caveat(self, d_model: int, max_seq_len: int) -> str | None:
        base = self.base.caveat(d_model, max_seq_len)
        if self.cfg.topk >= max_seq_len:
            return (f"attention.topk={self.cfg.topk} >= model.max_seq_len={max_seq_len}: every query attends to every "
                    f"earlier key, so dsa computes exactly what attention.base={self.cfg.base} does")
        return base

    def new_cache(self, batch: int, max_len: int, device, dtype, slack: int = 0) -> IndexedCache:
        return IndexedCache(self.base.new_cache(batch, max_len, device, dtype, slack), batch, max_len,
                            self.cfg.index_dim, device, dtype)

    # -- forward -----------------------------------------------------------------------
    def forward(self, x: torch.Tensor, pos, positions: torch.Tensor, cache: IndexedCache | None = None,
                need_weights: bool = False, select=None):
        B, T, _ = x.shape
        learn = self.training and torch.is_grad_enabled()  # the indexer's KL is computed (and trained)
        dense = self.training and self.dense_phase
        xi = x.detach()  # the KL never reaches the model below the indexer
        q, w = self.indexer.queries(xi, pos)
        k = self.indexer.keys(xi, pos)
        k_pos = positions
        if cache is not None:
            k, k_pos = cache.append(k)
        scores = self.indexer.scores(q, w, k)  # (B, T, Tk)
        visible = attention_mask(positions, k_pos, self.causal)  # (T, Tk) or None
        if pos.documents is not None:  # data.doc_mask: the indexer chooses among the query's own document
            same = pos.same_document(positions, k_pos)  # (B, T, Tk)
            visible = same if visible is None else visible & same
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        Tk, top = k.shape[1], self.cfg.topk
        chosen = gathered = None
        if not dense and top < Tk:
            order = top_keys(scores.detach(), k_pos, top)  # (B, T, k)
            if T == 1 and not (need_weights or learn):
                gathered = order[:, 0].sort(dim=-1).values  # decoding: attend to the k keys alone
            else:
                chosen = torch.zeros(B, T, Tk, dtype=torch.bool, device=x.device).scatter_(-1, order, True)
                if visible is not None:
                    chosen &= visible  # a query with fewer than k earlier keys keeps them all

        def pick(tensors, dims, base_pos):
            if gathered is not None:
                return (tuple(gather_positions(t, d, gathered) for t, d in zip(tensors, dims)),
                        base_pos[gathered], None)
            return tensors, base_pos, chosen

        sparse = chosen is not None or gathered is not None
        y, weights = self.base(x, pos, positions, cache.base if cache is not None else None,
                               need_weights or learn, pick if sparse else None)
        if learn:
            self._aux = self.index_loss(scores, weights, chosen if chosen is not None else visible)
        return y, (weights if need_weights else None)

    def index_loss(self, scores: torch.Tensor, weights: torch.Tensor,
                   allowed: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """KL(p || softmax(I)) over the ``allowed`` keys, p the main attention summed over heads
        and normalised (detached), averaged over queries."""
        target = weights.detach().float().sum(1)  # (B, T, Tk)
        target = target / target.sum(-1, keepdim=True)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        log_q = F.log_softmax(scores, dim=-1)
        terms = torch.where(target > 0, target * (target.clamp_min(1e-30).log() - log_q), torch.zeros_like(target))
        kl = terms.sum(-1).mean()
        return {"kl": kl, "weighted": self.cfg.index_weight * kl}
