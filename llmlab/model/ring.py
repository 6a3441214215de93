"""Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): causal
attention over a sequence split across the ranks of a process group, in contiguous slices
(rank r holds positions [r T, (r + 1) T)), on `torch.distributed` point-to-point operations, so
it runs on gloo (the CPU) as on NCCL.

Forward: each rank keeps its queries; the key/value blocks travel around the ring, one hop per
step, and each rank merges the partial attention of every block it receives by log-sum-exp.
Backward: the blocks travel again, now with accumulators for their gradients, which end one
hop later at the rank that owns the block. No rank ever holds more than its own slice and one
block in flight of the keys and values, and scores for `CHUNK` query rows at a time.

With contiguous slices and a causal mask, rank r attends to r + 1 blocks: the ranks' work is
unbalanced (the last rank does the most), which a zig-zag split would even out.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist


class _Hop:
    """``tensors`` on their way to the next rank of the ring, and what the previous rank sends:
    started at once, so the sending overlaps the work on the block in hand; `wait` returns it."""

    def __init__(self, tensors: list[torch.Tensor], group):
        rank, world = tdist.get_rank(group), tdist.get_world_size(group)
        nxt = tdist.get_global_rank(group, (rank + 1) % world)
        prev = tdist.get_global_rank(group, (rank - 1) % world)
        self.sent = [t.contiguous() for t in tensors]
        self.received = [torch.empty_like(t) for t in self.sent]
        ops = [tdist.P2POp(tdist.isend, t, nxt, group) for t in self.sent]
        ops += [tdist.P2POp(tdist.irecv, r, prev, group) for r in self.received]
        self.requests = tdist.batch_isend_irecv(ops)

    def wait(self) -> list[torch.Tensor]:
        for request in self.requests:
            request.wait()
        return self.received


def _expand(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Key/value heads shared by groups of query heads (GQA), repeated to one per query head."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def _fold(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of `_expand`: each shared head sums its group's."""
    B, H, T, D = grad.shape
    return grad if H == kv_heads else grad.view(B, kv_heads, H // kv_heads, T, D).sum(2)


#: query rows scored at a time: a rank's scores take (CHUNK x its slice) per head, not (slice x slice)
CHUNK = 1024


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, diagonal: bool, first: int) -> torch.Tensor:
    """Scores of the query rows ``first``... (``q``) over the block's keys; on the rank's own
    block (``diagonal``), causal: a row does not see the keys after its position."""
    s = (q @ k.transpose(-2, -1)) * scale
    if diagonal:
        rows = torch.arange(first, first + q.shape[2], device=q.device)
        s = s.masked_fill(torch.arange(k.shape[2], device=q.device)[None, :] > rows[:, None], float("-inf"))
    return s


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, scale: float, causal: bool):
        rank, world = tdist.get_rank(group), tdist.get_world_size(group)
        H, T = q.shape[1], q.shape[2]
        qf = q.float()
        out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        block = [k, v]
        for step in range(world):
            source = (rank - step) % world  # whose block this rank holds now
            hop = _Hop(block, group) if step < world - 1 else None
            if not causal or source <= rank:
                kb, vb = _expand(block[0], H).float(), _expand(block[1], H).float()
                for a in range(0, T, CHUNK):  # merge the block into the rows' running result
                    rows = slice(a, min(a + CHUNK, T))
                    s = _scores(qf[:, :, rows], kb, scale, causal and source == rank, a)
                    lse_b = s.logsumexp(-1)
                    new = torch.logaddexp(lse[:, :, rows], lse_b)
                    out[:, :, rows] = (out[:, :, rows] * torch.exp(lse[:, :, rows] - new)[..., None]
                                       + (torch.exp(s - lse_b[..., None]) @ vb) * torch.exp(lse_b - new)[..., None])
                    lse[:, :, rows] = new
            if hop is not None:
                block = hop.wait()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.causal = group, scale, causal
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group, scale, causal = ctx.group, ctx.scale, ctx.causal
        rank, world = tdist.get_rank(group), tdist.get_world_size(group)
        H, T, kv_heads = q.shape[1], q.shape[2], k.shape[1]
        qf, do = q.float(), grad_out.float()
        delta = (do * out).sum(-1, keepdim=True)  # rowsum(dO * O), (B, H, T, 1)
        dq = torch.zeros_like(qf)
        block = [k, v, torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
        for step in range(world):
            source = (rank - step) % world
            hop = _Hop(block[:2], group) if step < world - 1 else None  # the block moves on while it is used
            if not causal or source <= rank:
                kb, vb = _expand(block[0], H).float(), _expand(block[1], H).float()
                dk, dv = torch.zeros_like(kb), torch.zeros_like(vb)
                for a in range(0, T, CHUNK):
                    rows = slice(a, min(a + CHUNK, T))
                    q_c, do_c = qf[:, :, rows], do[:, :, rows]
                    p = torch.exp(_scores(q_c, kb, scale, causal and source == rank, a) - lse[:, :, rows, None])
                    dv += p.transpose(-2, -1) @ do_c
                    ds = p * (do_c @ vb.transpose(-2, -1) - delta[:, :, rows])
                    dq[:, :, rows] += (ds @ kb) * scale
                    dk += (ds.transpose(-2, -1) @ q_c) * scale
                block[2] = block[2] + _fold(dk, kv_heads)
                block[3] = block[3] + _fold(dv, kv_heads)
            if hop is not None:  # its gradients follow it once they hold this rank's share
                block = hop.wait() + _Hop(block[2:], group).wait()
        # the block held last is the next rank's: one more hop takes its gradients home
        dk, dv = _Hop(block[2:], group).wait() if world > 1 else block[2:]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, scale: float | None = None,
                   causal: bool = True) -> torch.Tensor:
    """softmax(q k^T scale, causal) v over the whole sequence, each rank of ``group`` holding
    one contiguous slice of it, in rank order. q (B, H, T, D); k, v (B, Hkv, T, D or Dv) with
    Hkv dividing H; returns (B, H, T, Dv). Gradients flow to q, k and v of every rank."""
    group = group if group is not None else tdist.group.WORLD
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    return _RingAttention.apply(q, k, v, group, scale, causal)


@dataclass(frozen=True)
class Shard:
    """This rank's slice of the sequence: slice ``rank`` of ``world`` in ``group``."""

    group: Any
    rank: int
    world: int


_ACTIVE: list[Shard] = []


@contextlib.contextmanager
def sharded(group):
    """Within it, the model's forward takes its input as this rank's contiguous slice of each
    sequence (positions offset to match) and attention runs as `ring_attention` over ``group``."""
    _ACTIVE.append(Shard(group, tdist.get_rank(group), tdist.get_world_size(group)))
    try:
        yield
    finally:
        _ACTIVE.pop()


def active() -> Shard | None:
    """The shard a forward runs on, or None (the whole sequence)."""
    return _ACTIVE[-1] if _ACTIVE else None
