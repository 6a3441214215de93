"""Normalisation layers (``norm.kind``)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from llmlab.registry import Registry

NORM = Registry("norm.kind")


@NORM.register("rmsnorm")
class RMSNorm(nn.RMSNorm):
    """Zhang & Sennrich 2019: scale by the root mean square, no centring, no bias."""

    @dataclass
    class Config:
        kind: str = "rmsnorm"

    def __init__(self, d_model: int, eps: float):
        super().__init__(d_model, eps=eps)


@NORM.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """Ba et al. 2016."""

    @dataclass
    class Config:
        kind: str = "layernorm"

    def __init__(self, d_model: int, eps: float):
        super().__init__(d_model, eps=eps)
