"""The decoder-only Transformer, assembled from registry-built parts.

    tokens -> embedding (+ position signal) -> blocks -> final norm -> LM head -> logits

The model is built once from a `ModelSpec`; ``forward`` holds no branch on a variant name.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from llmlab.errors import ConfigError
from llmlab.model.attention import ATTENTION
from llmlab.model.block import BLOCK, NormConfig
from llmlab.model.cache import ModelCache
from llmlab.model.ffn import FFN, round_up
from llmlab.model.norm import NORM
from llmlab.model.position import POSITION
from llmlab.registry import parse_dataclass


@dataclass
class ModelConfig:
    """The ``model`` section: shared sizes, passed to every part."""

    name: str = "custom"
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    max_seq_len: int = 256
    ffn: str = "swiglu"
    ffn_hidden: int | None = None  # None: the feed-forward's own default
    bias: bool = False
    tie_embeddings: bool = True
    init_std: float = 0.02
    vocab_multiple: int = 64  # pad the vocabulary for faster matmuls

    def check(self, prefix: str) -> None:
        for key in ("d_model", "n_layers", "n_heads", "max_seq_len", "vocab_multiple"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{prefix}.{key}: must be >= 1, got {getattr(self, key)}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"{prefix}.n_heads: {self.n_heads} does not divide {prefix}.d_model={self.d_model}")
        FFN.get(self.ffn, f"{prefix}.ffn")
        if self.ffn_hidden is not None and self.ffn_hidden < 1:
            raise ConfigError(f"{prefix}.ffn_hidden: must be >= 1 or null, got {self.ffn_hidden}")


@dataclass
class ModelSpec:
    """Everything that determines the network: what a checkpoint needs to rebuild it."""

    vocab_size: int
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: Any = None
    norm: NormConfig = field(default_factory=NormConfig)
    pos: Any = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], vocab_size: int) -> "ModelSpec":
        """Check the ``model``, ``attention``, ``norm`` and ``pos`` sections of a config."""
        return cls(
            vocab_size=vocab_size,
            model=parse_dataclass(ModelConfig, cfg.get("model"), "model"),
            attention=ATTENTION.config(cfg.get("attention"), "attention"),
            norm=parse_dataclass(NormConfig, cfg.get("norm"), "norm"),
            pos=POSITION.config(cfg.get("pos"), "pos"),
        )

    def to_dict(self) -> dict:
        return {"vocab_size": self.vocab_size, "model": asdict(self.model),
                "attention": asdict(self.attention), "norm": asdict(self.norm), "pos": asdict(self.pos)}


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        m = spec.model
        self.vocab_size = spec.vocab_size
        self.padded_vocab = round_up(spec.vocab_size, m.vocab_multiple)
        self.max_seq_len = m.max_seq_len
        ffn_cls = FFN.get(m.ffn, "model.ffn")
        hidden = m.ffn_hidden or ffn_cls.default_hidden(m.d_model)
        block_cls = BLOCK.get(spec.norm.placement, "norm.placement")

        self.embed = nn.Embedding(self.padded_vocab, m.d_model)
        self.pos = POSITION.build(spec.pos, m.d_model, m.max_seq_len)
        self.blocks = nn.ModuleList(
            block_cls(ATTENTION.build(spec.attention, m.d_model, m.n_heads, bias=m.bias),
                      ffn_cls(m.d_model, hidden, m.bias), spec.norm, m.d_model)
            for _ in range(m.n_layers))
        self.norm = NORM.get(spec.norm.kind)(m.d_model, spec.norm.eps) if block_cls.final_norm else nn.Identity()
        self.lm_head = nn.Linear(m.d_model, self.padded_vocab, bias=False)
        if m.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, init_std); residual output projections scaled by 1/sqrt(2L) (GPT-2, section 2.3)."""
        std = self.spec.model.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                scale = 1 / math.sqrt(2 * self.spec.model.n_layers) if getattr(module, "residual_out", False) else 1.0
                nn.init.normal_(module.weight, mean=0.0, std=std * scale)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    # -- forward -----------------------------------------------------------------------
    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: ModelCache | None = None, need_weights: bool = False):
        """idx: (B, T) token ids. Returns logits (B, T, V_padded), loss or None, and the
        per-layer attention weights when ``need_weights``."""
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        positions = torch.arange(start, start + T, device=idx.device)
        x = self.pos.embed(self.embed(idx), positions)  # (B, T, d)
        rotary = self.pos.rotary(positions)
        all_weights = []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, rotary, positions, cache.layers[i] if cache is not None else None, need_weights)
            all_weights.append(weights)
        if cache is not None:
            cache.pos += T
        logits = self.lm_head(self.norm(x))  # (B, T, V_padded)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        return logits, loss, (all_weights if need_weights else None)

    def new_cache(self, batch: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> ModelCache:
        p = next(self.parameters())
        max_len = max_len or self.max_seq_len
        return ModelCache([blk.attn.new_cache(batch, max_len, p.device, dtype or p.dtype) for blk in self.blocks])

    # -- the model card ----------------------------------------------------------------
    def param_counts(self) -> dict[str, int]:
        total = sum(p.numel() for p in self.parameters())
        embedding = self.embed.weight.numel() + sum(p.numel() for p in self.pos.parameters())
        return {"total": total, "embedding": embedding, "non_embedding": total - embedding}

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token: 6 N over every matmul weight (the LM head included, tied or
        not) plus the attention term (Kaplan et al. 2020; PaLM appendix B)."""
        seq_len = seq_len or self.max_seq_len
        matmul_params = self.param_counts()["non_embedding"]
        if self.spec.model.tie_embeddings:
            matmul_params += self.lm_head.weight.numel()
        attn = sum(blk.attn.flops_per_token(seq_len) for blk in self.blocks)
        return 6 * matmul_params + attn

    def kv_cache_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return sum(blk.attn.kv_cache_bytes_per_token(dtype_bytes) for blk in self.blocks)
