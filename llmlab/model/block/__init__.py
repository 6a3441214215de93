"""Transformer blocks (the ``norm`` group, ``norm.placement``): pre-norm and post-norm are two
classes. A block is built as ``cls(cfg, attn, ffn, d_model)`` from the ``norm`` section and the
parts it holds; it never asks which attention or FFN they are. A new block can be one file in
this package: its class, registered with ``@BLOCK.register(name)``, holding a nested ``Config``
(a subclass of `NormConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from llmlab.model.config import BLOCK, NORM, NormConfig


class Block(nn.Module):
    #: whether the stack needs a norm after the last block
    final_norm = True

    def __init__(self, cfg: NormConfig, attn: nn.Module, ffn: nn.Module, d_model: int):
        super().__init__()
        self.attn_norm = NORM.build(cfg, d_model)
        self.attn = attn
        self.ffn_norm = NORM.build(cfg, d_model)
        self.ffn = ffn

    def decode_token(self, x, pos, positions, cache):
        """One new token per sequence (B, 1, d) with this layer's cache, inside
        `Transformer.decode_token` (no hooks run there): the block's forward, by default."""
        return self.forward(x, pos, positions, cache)[0]


@BLOCK.register("pre")
class PreNormBlock(Block):
    """Pre-norm: x + f(norm(x)), with a final norm before the LM head (GPT-2, Llama)."""

    def forward(self, x, pos, positions, cache=None, need_weights=False):
        a, weights = self.attn(self.attn_norm(x), pos, positions, cache, need_weights)
        x = x + a
        x = x + self.ffn(self.ffn_norm(x))
        return x, weights

    def decode_token(self, x, pos, positions, cache):
        """`forward`, with the parts entered through their ``forward``."""
        x = x + self.attn.forward(self.attn_norm.forward(x), pos, positions, cache)[0]
        return x + self.ffn.forward(self.ffn_norm.forward(x))


@BLOCK.register("post")
class PostNormBlock(Block):
    """Post-norm: norm(x + f(x)) after each residual add, as in the original Transformer."""

    @dataclass
    class Config(NormConfig):  # Vaswani et al. 2017, section 3.1
        placement: str = "post"
        kind: str = "layernorm"

    final_norm = False

    def forward(self, x, pos, positions, cache=None, need_weights=False):
        a, weights = self.attn(x, pos, positions, cache, need_weights)
        x = self.attn_norm(x + a)
        x = self.ffn_norm(x + self.ffn(x))
        return x, weights
