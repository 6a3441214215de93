"""Position-wise feed-forward networks (``model.ffn``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llmlab.registry import Registry

FFN = Registry("model.ffn")


def round_up(n: float, multiple: int) -> int:
    return int(-(-n // multiple) * multiple)


class FeedForward(nn.Module):
    @dataclass
    class Config:
        kind: str = ""

    @staticmethod
    def default_hidden(d_model: int) -> int:
        return 4 * d_model


class TwoMatrixFFN(FeedForward):
    """d -> hidden -> activation -> d."""

    def __init__(self, d_model: int, hidden: int, bias: bool):
        super().__init__()
        self.up_proj = nn.Linear(d_model, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d_model, bias=bias)
        self.down_proj.residual_out = True

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.up_proj(x)))


@FFN.register("gelu")
class GeluFFN(TwoMatrixFFN):
    """The GPT-2 / BERT MLP (tanh-approximated GELU, as GPT-2 uses)."""

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h, approximate="tanh")


@FFN.register("relu2")
class ReluSquaredFFN(TwoMatrixFFN):
    """Squared ReLU (So et al. 2021, Primer, section 4)."""

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.relu(h).square()


@FFN.register("swiglu")
class SwiGLU(FeedForward):
    """Shazeer 2020, GLU Variants: down(silu(gate(x)) * up(x)).

    The default hidden size is 8/3 d, so three matrices cost what the 4d MLP's two do,
    rounded up to a multiple of 64 for the kernels.
    """

    @staticmethod
    def default_hidden(d_model: int) -> int:
        return round_up(8 * d_model / 3, 64)

    def __init__(self, d_model: int, hidden: int, bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=bias)
        self.up_proj = nn.Linear(d_model, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d_model, bias=bias)
        self.down_proj.residual_out = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
