"""``pos=alibi``: attention with linear biases, in one file."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmlab.model.config import POSITION
from llmlab.model.position import Position, PositionView
from llmlab.registry import bounded


def alibi_slopes(heads: int, exponent: float) -> list[float]:
    """Head h of n (h = 1..n) gets slope 2^(-exponent h / n), a geometric sequence; for n not
    a power of two, the slopes of the power of two below it and every other slope of the one
    above (Press et al. 2022, section 3 and their reference code)."""
    def geometric(n: int) -> list[float]:
        return [2 ** (-exponent * h / n) for h in range(1, n + 1)]

    below = 1 << (heads.bit_length() - 1)
    return geometric(below) + geometric(2 * below)[0::2][:heads - below]


class LinearBiases(PositionView):
    """Scores minus slope_h x |query position - key position|; queries and keys untouched."""

    def __init__(self, exponent: float):
        self.exponent = exponent

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, heads: int) -> torch.Tensor:
        slopes = torch.tensor(alibi_slopes(heads, self.exponent), device=q_pos.device)  # (H,)
        distance = (q_pos[:, None] - k_pos[..., None, :]).abs().float()  # (Tq, Tk), or (B, Tq, Tk) for keys gathered
        return -slopes[:, None, None] * distance[..., None, :, :]  # (H, Tq, Tk) or (B, H, Tq, Tk)


@POSITION.register("alibi")
class ALiBi(Position):
    """ALiBi (Press et al. 2022, Train Short, Test Long): no position signal in the embeddings;
    each head's attention scores fall linearly with the distance to the key, at its own slope."""

    context_parallel = False

    @dataclass
    class Config:
        kind: str = "alibi"
        exponent: float = bounded(8.0, above=0)  # head h of n has slope 2^(-exponent h / n); the paper's 8

    def view(self, positions: torch.Tensor) -> LinearBiases:
        return LinearBiases(self.cfg.exponent)
