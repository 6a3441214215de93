"""Transformer blocks (``norm.placement``): pre-norm and post-norm are two classes."""

from __future__ import annotations

from torch import nn

from llmlab.model.config import BLOCK, NORM, NormConfig


class Block(nn.Module):
    #: whether the stack needs a norm after the last block
    final_norm = True

    def __init__(self, attn: nn.Module, ffn: nn.Module, norm_cfg: NormConfig, d_model: int):
        super().__init__()
        make_norm = NORM.get(norm_cfg.kind)
        self.attn_norm = make_norm(d_model, norm_cfg.eps)
        self.attn = attn
        self.ffn_norm = make_norm(d_model, norm_cfg.eps)
        self.ffn = ffn


@BLOCK.register("pre")
class PreNormBlock(Block):
    """Pre-norm: x + f(norm(x)), with a final norm before the LM head (GPT-2, Llama)."""

    def forward(self, x, rotary, positions, cache=None, need_weights=False):
        a, weights = self.attn(self.attn_norm(x), rotary, positions, cache, need_weights)
        x = x + a
        x = x + self.ffn(self.ffn_norm(x))
        return x, weights


@BLOCK.register("post")
class PostNormBlock(Block):
    """Post-norm: norm(x + f(x)) after each residual add, as in the original Transformer."""

    final_norm = False

    def forward(self, x, rotary, positions, cache=None, need_weights=False):
        a, weights = self.attn(x, rotary, positions, cache, need_weights)
        x = self.attn_norm(x + a)
        x = self.ffn_norm(x + self.ffn(x))
        return x, weights
