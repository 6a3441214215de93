"""Position schemes. Each offers three operations, a no-op where it does not apply:

- ``embed(x, positions)``: add a position signal to the token embeddings (sinusoidal, learned);
- ``view(positions)``: a `PositionView` for one forward pass, which attention asks to
  ``rotate(t)`` its queries and keys (RoPE) and for a ``bias(q_pos, k_pos, heads)`` to add to
  its scores (ALiBi);
- ``check_end(end)``: refuse positions the scheme has no signal for (a learned table's end).

So attention never asks which scheme is in use. A new scheme can be one file in this package:
its class, registered with ``@POSITION.register(name)``, holding a nested ``Config``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from llmlab.errors import UserError
from llmlab.model.config import POSITION


class PositionView:
    """What attention asks of the position scheme in one forward pass; by default nothing."""

    def rotate(self, t: torch.Tensor) -> torch.Tensor:
        """Queries or keys (B, H, T, D), with position put in by rotation."""
        return t

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, heads: int) -> torch.Tensor | None:
        """(H, Tq, Tk) float added to the attention scores before the softmax; None: none."""
        return None


class RotaryAngles(PositionView):
    """RoPE for a set of positions (Su et al. 2021, RoFormer, eq. 34).

    Frequencies span one head's dimension (the last axis of the tensor rotated), and every
    head uses the same ones. Rotation pairs dimension i with i + D/2 ("rotate half"), the
    layout Llama checkpoints in `transformers` use.
    """

    def __init__(self, positions: torch.Tensor, theta: float):
        self.positions = positions
        self.theta = theta
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(self, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        if dim not in self._cache:
            pos = self.positions.float()
            inv_freq = self.theta ** (-torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) / dim)
            angles = pos[:, None] * inv_freq[None, :]  # (T, D/2)
            angles = torch.cat([angles, angles], dim=-1)  # (T, D)
            self._cache[dim] = (angles.cos(), angles.sin())
        return self._cache[dim]

    def rotate(self, t: torch.Tensor) -> torch.Tensor:
        # t: (B, H, T, D); rotation is computed in fp32 and cast back
        cos, sin = self.cos_sin(t.shape[-1])
        tf = t.float()
        half = t.shape[-1] // 2
        rotated = torch.cat([-tf[..., half:], tf[..., :half]], dim=-1)
        return (tf * cos + rotated * sin).to(t.dtype)


class Position(nn.Module):
    """The base of every scheme: built as ``cls(cfg, d_model, max_seq_len)``."""

    #: trains with the sequence split across ranks (``train.context_parallel``); a scheme that
    #: biases the scores does not, as the ring attends without a bias
    context_parallel: bool = True

    def __init__(self, cfg, d_model: int, max_seq_len: int):
        super().__init__()
        self.cfg = cfg
        self.d_model = d_model
        self.max_seq_len = max_seq_len

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def view(self, positions: torch.Tensor) -> PositionView:
        return PositionView()

    def check_end(self, end: int) -> None:
        """``end``: one past the last position, a plain int (no device sync, no graph break)."""


@POSITION.register("none")
class NoPosition(Position):
    """No position signal: causal masking alone tells order (NoPE)."""

@POSITION.register("rope")
class RoPE(Position):
    """Rotary position embedding (Su et al. 2021): rotates q and k per head."""

    def view(self, positions: torch.Tensor) -> RotaryAngles:
        return RotaryAngles(positions, self.cfg.theta)


def sinusoid_table(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """Fixed encodings of Vaswani et al. 2017, section 3.5: sin on even dims, cos on odd."""
    pos = positions.float()[:, None]  # (T, 1)
    inv = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, device=pos.device).float() / d_model)
    table = torch.zeros(positions.shape[0], d_model, device=pos.device)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv[: d_model // 2])
    return table


@POSITION.register("sinusoidal")
class Sinusoidal(Position):
    """Fixed sinusoids added to the token embeddings (Vaswani et al. 2017)."""

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + sinusoid_table(positions, self.d_model).to(x.dtype)


@POSITION.register("learned")
class Learned(Position):
    """A learned table of model.max_seq_len positions added to the embeddings (GPT-2)."""

    def __init__(self, cfg, d_model: int, max_seq_len: int):
        super().__init__(cfg, d_model, max_seq_len)
        self.table = nn.Embedding(max_seq_len, d_model)

    def check_end(self, end: int) -> None:
        if end > self.max_seq_len:
            raise UserError(
                f"pos=learned knows positions 0..{self.max_seq_len - 1} (model.max_seq_len); "
                f"position {end - 1} is past the end")

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + self.table(positions)
