"""Normalisation layers (``norm.kind``)."""

from __future__ import annotations

from torch import nn

from llmlab.model.config import NORM


@NORM.register("rmsnorm")
class RMSNorm(nn.RMSNorm):
    """Zhang & Sennrich 2019: scale by the root mean square, no centring, no bias."""

    def __init__(self, d_model: int, eps: float):
        super().__init__(d_model, eps=eps)


@NORM.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """Ba et al. 2016."""

    def __init__(self, d_model: int, eps: float):
        super().__init__(d_model, eps=eps)
