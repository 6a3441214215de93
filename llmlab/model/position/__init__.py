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
from dataclasses import dataclass

import torch
from torch import nn

from llmlab.errors import UserError
from llmlab.model.config import POSITION
from llmlab.model.kept import kept_tensors


class PositionView:
    """What attention asks of the position scheme in one forward pass; by default nothing."""

    #: (B, T) the document each position of the window belongs to, where attention must not
    #: cross documents (``data.doc_mask``, `with_documents`); None: one stream
    documents: torch.Tensor | None = None

    def rotate(self, t: torch.Tensor) -> torch.Tensor:
        """Queries or keys (B, H, T, D), with position put in by rotation."""
        return t

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, heads: int) -> torch.Tensor | None:
        """(H, Tq, Tk) float added to the attention scores before the softmax; None: none."""
        return None


class DocumentView(PositionView):
    """A position view whose forward pass also keeps attention inside each document."""

    def __init__(self, inner: PositionView, documents: torch.Tensor):
        self.inner, self.documents = inner, documents
        self._seen: tuple | None = None  # the last mask, by its positions: every layer asks the same
        self._block: tuple | None = None  # the flex block mask, by (causal, window)

    def same_document(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(B, Tq, Tk) True where a query and a key lie in one document; ``k_pos`` (Tk) or, as a
        sparse kind gathers keys per sequence, (B, Tk)."""
        if self._seen is None or self._seen[0] is not q_pos or self._seen[1] is not k_pos:
            docs = self.documents
            keys = docs[:, k_pos] if k_pos.dim() == 1 else docs.gather(1, k_pos)
            self._seen = (q_pos, k_pos, docs[:, q_pos][:, :, None] == keys[:, None])
        return self._seen[2]

    def block_mask(self, causal: bool, window: int | None):
        """The flex-attention block mask of these documents (`llmlab.model.flex`), built once
        per forward: every layer asks the same."""
        if self._block is None or self._block[0] != (causal, window):
            from llmlab.model import flex
            self._block = ((causal, window), flex.block_mask(self.documents, causal, window))
        return self._block[1]

    def rotate(self, t: torch.Tensor) -> torch.Tensor:
        return self.inner.rotate(t)

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, heads: int) -> torch.Tensor | None:
        return self.inner.bias(q_pos, k_pos, heads)


class RotaryAngles(PositionView):
    """RoPE for a set of positions (Su et al. 2021, RoFormer, eq. 34).

    Frequencies span one head's dimension (the last axis of the tensor rotated), and every
    head uses the same ones. Rotation pairs dimension i with i + D/2 ("rotate half"), the
    layout Llama checkpoints in `transformers` use.

    ``table``: the `RoPE` module's tables of every position so far, looked up instead of
    computed (decoding runs a forward per token; the angles are the same numbers either way).
    """

    def __init__(self, positions: torch.Tensor, theta: float, table=None):
        self.positions = positions
        self.theta = theta
        self.table = table
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(self, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and a signed sin, (T, D) each: the sin's first half negated, so that rotating
        is ``t * cos + roll(t, D/2) * sin`` (the roll brings the pair partner; see `rotate`)."""
        if dim not in self._cache:
            if self.table is not None:
                cos, sin = self.table(dim, self.positions)
            else:
                cos, sin = rotary_table(self.positions, dim, self.theta)
            self._cache[dim] = (cos, sin)
        return self._cache[dim]

    def rotate(self, t: torch.Tensor) -> torch.Tensor:
        # t: (B, H, T, D); rotation is computed in fp32 and cast back. roll(t, D/2) is
        # [t2, t1]; times the signed sin [-sin, sin] it is rotate_half(t) * sin = [-t2, t1] * sin
        cos, sin = self.cos_sin(t.shape[-1])
        tf = t if t.dtype == torch.float32 else t.float()
        out = tf * cos + tf.roll(t.shape[-1] // 2, dims=-1) * sin
        return out if out.dtype == t.dtype else out.to(t.dtype)


def rotary_table(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed sin) of RoPE's angles at ``positions`` (T,) for a head of ``dim``, (T, dim)
    each in fp32; the sin's first half is negated (see `RotaryAngles.rotate`)."""
    pos = positions.float()
    inv_freq = theta ** (-torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) / dim)
    angles = pos[:, None] * inv_freq[None, :]  # (T, D/2)
    sin = angles.sin()
    return torch.cat([angles, angles], dim=-1).cos(), torch.cat([-sin, sin], dim=-1)


class RotaryTable:
    """RoPE's cos and signed sin for positions 0..n-1 per (head width, device), computed once
    and grown (doubled) when a forward reaches past them (`grow`, told the end as a plain
    int, so no lookup syncs with the device); a forward looks its positions up."""

    def __init__(self, theta: float, length: int):
        # up to 4,096 positions at first; a longer context grows it as decoding reaches there
        self.theta, self.length = theta, max(1, min(length, 4096))
        self.tables: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def grow(self, end: int) -> None:
        while self.length < end:
            self.length *= 2

    def __call__(self, dim: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (dim, positions.device)
        table = self.tables.get(key)
        if table is None or table[0].shape[0] < self.length:
            # ordinary tensors, made outside autograd, even when the first forward decodes in
            # inference mode: training looks them up afterwards
            with kept_tensors():
                table = rotary_table(torch.arange(self.length, device=positions.device), dim, self.theta)
            self.tables[key] = table
        return table[0][positions], table[1][positions]


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

    @dataclass
    class Config:
        kind: str = "none"

@POSITION.register("rope")
class RoPE(Position):
    """Rotary position embedding (Su et al. 2021): rotates q and k per head."""

    def __init__(self, cfg, d_model: int, max_seq_len: int):
        super().__init__(cfg, d_model, max_seq_len)
        self.table = RotaryTable(cfg.theta, max_seq_len)

    def check_end(self, end: int) -> None:
        self.table.grow(end)

    def view(self, positions: torch.Tensor) -> RotaryAngles:
        # a compiled training step computes its angles in the graph (no table kept from a trace)
        table = None if torch.compiler.is_compiling() else self.table
        return RotaryAngles(positions, self.cfg.theta, table)


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

    @dataclass
    class Config:
        kind: str = "sinusoidal"

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + sinusoid_table(positions, self.d_model).to(x.dtype)


@POSITION.register("learned")
class Learned(Position):
    """A learned table of model.max_seq_len positions added to the embeddings (GPT-2)."""

    @dataclass
    class Config:
        kind: str = "learned"

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
