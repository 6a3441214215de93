"""Transformer blocks (``norm.placement``): pre-norm and post-norm are two classes."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from llmlab.errors import ConfigError
from llmlab.model.norm import NORM
from llmlab.registry import Registry

BLOCK = Registry("norm.placement")


@dataclass
class NormConfig:
    """The ``norm`` group: where the norm sits (a block class) and which norm it is."""

    placement: str = "pre"
    kind: str = "rmsnorm"
    eps: float = 1e-5

    def check(self, prefix: str) -> None:
        BLOCK.get(self.placement, f"{prefix}.placement")
        NORM.get(self.kind, f"{prefix}.kind")
        if not self.eps > 0:
            raise ConfigError(f"{prefix}.eps: must be > 0, got {self.eps}")


class Block(nn.Module):
    #: whether the stack needs a norm after the last block
    final_norm = True

    @dataclass
    class Config:
        kind: str = ""

    def __init__(self, attn: nn.Module, ffn: nn.Module, norm_cfg: NormConfig, d_model: int):
        super().__init__()
        make_norm = NORM.get(norm_cfg.kind)
        self.attn_norm = make_norm(d_model, norm_cfg.eps)
        self.attn = attn
        self.ffn_norm = make_norm(d_model, norm_cfg.eps)
        self.ffn = ffn


@BLOCK.register("pre")
class PreNormBlock(Block):
    """x + f(norm(x)): the residual stream is never normalised (GPT-2, Llama)."""

    def forward(self, x, rotary, positions, cache=None, need_weights=False):
        a, weights = self.attn(self.attn_norm(x), rotary, positions, cache, need_weights)
        x = x + a
        x = x + self.ffn(self.ffn_norm(x))
        return x, weights


@BLOCK.register("post")
class PostNormBlock(Block):
    """norm(x + f(x)), as in the original Transformer (Vaswani et al. 2017, section 3.1)."""

    final_norm = False

    def forward(self, x, rotary, positions, cache=None, need_weights=False):
        a, weights = self.attn(x, rotary, positions, cache, need_weights)
        x = self.attn_norm(x + a)
        x = self.ffn_norm(x + self.ffn(x))
        return x, weights
