"""Normalisation layers (``norm.kind``), built from the ``norm`` section and a width:
``NORM.build(norm_cfg, d)``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llmlab.model.config import NORM, NormConfig


@NORM.register("rmsnorm")
class RMSNorm(nn.RMSNorm):
    """Zhang & Sennrich 2019: scale by the root mean square, no centring, no bias."""

    def __init__(self, cfg: NormConfig, d_model: int):
        super().__init__(d_model, eps=cfg.eps)


@NORM.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """Ba et al. 2016."""

    @dataclass
    class Config:
        kind: str = "layernorm"

    def __init__(self, cfg: NormConfig, d_model: int):
        super().__init__(d_model, eps=cfg.eps)


def normed(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` in the norm weight's dtype: under autocast a projection's bf16 output meets
    an fp32 weight, which torch's fused RMSNorm refuses (it warns and takes a slower path
    whose result is fp32 all the same)."""
    return norm(x.to(norm.weight.dtype))
