"""``model/ffn=swish_mlp``: the two-matrix MLP with a Swish activation, in one file."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmlab.model.config import FFN, FFNConfig
from llmlab.model.ffn import TwoMatrixFFN


@FFN.register("swish_mlp")
class SwishMLP(TwoMatrixFFN):
    """The GPT-2 MLP with Swish, x sigmoid(x) (Ramachandran et al. 2017), in place of GELU: no gate."""

    @dataclass
    class Config(FFNConfig):
        kind: str = "swish_mlp"

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.silu(h)
