"""Transformer blocks (``norm.placement``): pre-norm and post-norm are two classes."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from llmlab.errors import ConfigError
from llmlab.model.norm import NORM
from llmlab.registry import Registry

BLOCK = Registry("norm", group="norm", kind_key="placement")


@dataclass
class NormConfig:
    """The ``norm`` group: where the norm sits (``placement``: a block class, the group's
    option) and which norm it is (``kind``: a `NORM` variant, a setting)."""

    placement: str = "pre"
    kind: str = "rmsnorm"  # rmsnorm | layernorm
    eps: float = 1e-5

    def check(self, prefix: str) -> None:
        BLOCK.get(self.placement, f"{prefix}.placement")
        NORM.get(self.kind, f"{prefix}.kind")
        if not self.eps > 0:
            raise ConfigError(f"{prefix}.eps: must be > 0, got {self.eps}")


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

    @dataclass
    class Config(NormConfig):
        placement: str = "pre"

    def forward(self, x, rotary, positions, cache=None, need_weights=False):
        a, weights = self.attn(self.attn_norm(x), rotary, positions, cache, need_weights)
        x = x + a
        x = x + self.ffn(self.ffn_norm(x))
        return x, weights


@BLOCK.register("post")
class PostNormBlock(Block):
    """Post-norm: norm(x + f(x)) after each residual add, as in the original Transformer."""

    @dataclass
    class Config(NormConfig):  # Vaswani et al. 2017, section 3.1
        placement: str = "post"
        kind: str = "layernorm"

    final_norm = False

    def forward(self, x, rotary, positions, cache=None, need_weights=False):
        a, weights = self.attn(x, rotary, positions, cache, need_weights)
        x = self.attn_norm(x + a)
        x = self.ffn_norm(x + self.ffn(x))
        return x, weights
