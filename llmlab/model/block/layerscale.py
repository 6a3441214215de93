"""``norm=layerscale``: pre-norm blocks whose residual branches are scaled per channel, in one file."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llmlab.model.block import Block
from llmlab.model.config import BLOCK, NormConfig
from llmlab.registry import bounded


@BLOCK.register("layerscale")
class LayerScaleBlock(Block):
    """Pre-norm with each residual branch multiplied by a learned per-channel scale that starts
    small (Touvron et al. 2021, CaiT, section 2.1): x + diag(s) f(norm(x)), so deep stacks
    start close to the identity."""

    @dataclass
    class Config(NormConfig):
        placement: str = "layerscale"
        init: float = bounded(0.1, above=0, at_most=1)  # the scales' first value (CaiT: 0.1 to depth 18, 1e-5 at 24, 1e-6 beyond)

    def __init__(self, cfg: NormConfig, attn: nn.Module, ffn: nn.Module, d_model: int):
        super().__init__(cfg, attn, ffn, d_model)
        self.attn_scale = nn.Parameter(torch.full((d_model,), cfg.init))
        self.ffn_scale = nn.Parameter(torch.full((d_model,), cfg.init))

    def forward(self, x, pos, positions, cache=None, need_weights=False):
        a, weights = self.attn(self.attn_norm(x), pos, positions, cache, need_weights)
        x = x + self.attn_scale * a
        x = x + self.ffn_scale * self.ffn(self.ffn_norm(x))
        return x, weights
