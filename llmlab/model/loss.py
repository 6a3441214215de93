"""Cross-entropy of a linear LM head, computed without keeping the logits.

The plain path writes the (N, V) logits, reads them for the log-softmax, keeps them for the
backward, and writes (N, V) gradients there: for GPT-2's vocabulary and 32k tokens a step, 3.3 GB
in bf16 per copy, and about a tenth of the step's time on an H100. `linear_cross_entropy` takes
the rows in chunks and, while the chunk's logits are at hand, turns them into their gradient
(softmax minus the one-hot target, over the number of counted targets) and multiplies it out
into the gradients of the hidden states and of the head's weight (the recipe of Liger Kernel's
fused linear cross-entropy, Hsu et al. 2024). The backward only scales those by the incoming
gradient. No FLOP is added: the same three matmuls run, the backward's two in the forward.

Only a scalar loss may flow out of it (the mean over counted targets, as ``F.cross_entropy``
with ``ignore_index`` gives). Its gradients are computed whenever autograd records (a backward
is taken to follow); under ``torch.no_grad`` it computes the loss alone. `llmlab train` uses
it; evaluation keeps the plain head, which also gives the logits.
"""

from __future__ import annotations

import torch

# Logits of one chunk, in the matmul's dtype: 2 GiB is 21,345 rows of GPT-2's padded vocabulary
# in bf16, so a 32k-token micro-batch goes in two chunks. On an H100, chunks of 4,700 rows ran
# the head's matmuls 1.9 ms slower per step than one large matmul (their outputs are too small
# to fill the chip), which ate most of what the fusion saves.
CHUNK_BYTES = 2 << 30
# On the CPU the work between the matmuls (the upcast, the log-softmax, the exp, the one-hot
# subtraction, the cast back) goes over a chunk's logits in blocks of rows whose float32 copy
# fits in a core's cache, each block's gradient written over its own logits: over the whole
# chunk each of those steps streamed the (rows, V) buffer through memory. The default `llmlab
# train`'s head and loss (2,048 rows of 8,192 tokens, d 96; a 2-core AVX-512 BF16 CPU) went
# from 122 to 74 ms in bf16 and from 127 to 117 ms in fp32, forward and backward.
CPU_BLOCK_BYTES = 1 << 20


def chunk_rows(n: int, vocab: int, itemsize: int = 4) -> int:
    """Rows per chunk: the whole batch where its logits fit in ``CHUNK_BYTES``, else equal
    chunks under that."""
    limit = max(1, CHUNK_BYTES // (itemsize * vocab))
    if n <= limit:
        return n
    chunks = -(-n // limit)
    return -(-n // chunks)


def _chunk_fused(logits, targets, row_weight, acc):
    """Per-row loss and d loss / d logits (softmax minus the one-hot target, times the row's
    weight) of one chunk, as expressions inductor fuses into two reads of the logits and one
    write of the gradient, the float32 upcast included."""
    logits = logits.to(acc)
    lse = torch.logsumexp(logits, dim=-1)
    nll = lse - logits.gather(1, targets[:, None]).squeeze(1)
    columns = torch.arange(logits.shape[-1], device=logits.device)
    onehot = (columns[None, :] == targets[:, None]).to(acc)
    return nll, (torch.exp(logits - lse[:, None]) - onehot) * row_weight[:, None]


def _chunk_eager(logits, targets, row_weight, acc):
    """The same without a compiler: one log-softmax kernel that upcasts as it reads, then in
    place, so that the (rows, V) float32 buffer is the only temporary: on a 2-core CPU a
    2,048 x 8,256 chunk took 69-77 ms, against 82-86 ms for an upcast, logsumexp and in-place
    exp. On an H100 it brought the eager bf16 head and loss to the plain path's time
    (38.4 against 38.3 ms for 32k rows of GPT-2's head), with half its memory."""
    logp = torch.log_softmax(logits, dim=-1, dtype=acc)
    nll = -logp.gather(1, targets[:, None]).squeeze(1)
    g = logp.exp_().mul_(row_weight[:, None])
    g[torch.arange(g.shape[0], device=g.device), targets] -= row_weight
    return nll, g


def _blocks_in_place(logits, targets, row_weight, acc):
    """`_chunk_eager` over blocks of ``CPU_BLOCK_BYTES`` (in ``acc``) of the logits' rows, each
    block's gradient written over its logits, in their dtype; returns the rows' losses."""
    n, vocab = logits.shape
    rows = max(1, CPU_BLOCK_BYTES // (acc.itemsize * vocab))
    nll = torch.empty(n, dtype=acc, device=logits.device)
    for start in range(0, n, rows):
        block = slice(start, min(start + rows, n))
        nll[block], g = _chunk_eager(logits[block], targets[block], row_weight[block], acc)
        logits[block] = g
    return nll


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, ignore_index: int, dtype: torch.dtype, need_grad: bool):
        n, vocab = h.shape[0], weight.shape[0]
        valid = targets != ignore_index
        count = valid.sum()
        safe = torch.where(valid, targets, 0)
        # each counted row's share of the mean; uncounted rows get no gradient
        acc = torch.promote_types(dtype, torch.float32)  # softmax and sums: float32 at least
        row_weight = valid.to(acc) / count.clamp(min=1).to(acc)
        hc, wc = h.to(dtype), weight.to(dtype)
        grad_h = torch.empty_like(h) if need_grad else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_grad else None
        loss_sum = torch.zeros((), dtype=acc, device=h.device)
        rows = chunk_rows(n, vocab, wc.element_size())
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            x, t = hc[start:stop], safe[start:stop]
            logits = x @ wc.t()
            if not need_grad:
                nll = torch.logsumexp(logits.to(acc), -1) - logits.gather(1, t[:, None]).squeeze(1).to(acc)
                loss_sum = loss_sum + (nll * valid[start:stop]).sum()
                continue
            if logits.device.type == "cpu" and not torch.compiler.is_compiling():
                nll, g = _blocks_in_place(logits, t, row_weight[start:stop], acc), logits
            else:
                chunk = _chunk_fused if torch.compiler.is_compiling() else _chunk_eager
                nll, g = chunk(logits, t, row_weight[start:stop], acc)
                g = g.to(dtype)
            loss_sum = loss_sum + (nll * valid[start:stop]).sum()
            grad_h[start:stop] = g @ wc
            grad_w += (g.t() @ x).to(acc)
        if need_grad:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return loss_sum / count  # nan when no target counts, as F.cross_entropy gives

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype), grad_w * grad_out.to(grad_w.dtype), None, None, None, None


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's where it is on, else the input's."""
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


FUSED_MIN_LOGITS = 1 << 22  # below this many logits the plain path's fewer kernels win


def use_fused(h: torch.Tensor, weight: torch.Tensor, mode: str = "auto") -> bool:
    """Whether `linear_cross_entropy` replaces the plain head and loss for states ``h`` under
    ``train.head_loss=mode``: ``plain`` never, ``fused`` always, ``auto`` for large heads.

    Never in fp16: its gradients are computed in the forward, before a loss scaler could scale
    them, and small ones would underflow. ``auto`` leaves small heads (a byte vocabulary, say)
    alone, where its extra kernel launches cost more than the logits' memory traffic: on a
    2-core CPU, 768 rows of a 320-token head took 3.8 ms against 2.6 ms plain, while 2,048 rows
    of an 8,256-token head took 338-349 ms against 389-411 ms."""
    if mode == "plain" or compute_dtype(h) == torch.float16:
        return False
    return mode == "fused" or h.numel() // h.shape[-1] * weight.shape[0] >= FUSED_MIN_LOGITS


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy of ``h @ weight.T`` against ``targets``, like
    ``F.cross_entropy(F.linear(h, weight).float(), targets, ignore_index=ignore_index)``
    (float64 stays float64), without keeping the logits. h: (..., d); weight: (V, d);
    targets: (...)."""
    d = h.shape[-1]
    need_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    return _LinearCrossEntropy.apply(h.reshape(-1, d), weight, targets.reshape(-1), ignore_index,
                                     compute_dtype(h), need_grad)
