"""Ring attention on the CPU with gloo, 2 and 4 ranks: the output and the gradients of q, k and v
equal one process's attention over the whole sequence, for MHA, GQA and a value width unlike
the key width (as MLA's), causal or not."""

import math

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from llmlab.model import ring
from llmlab.model.ring import ring_attention

CASES = [  # (query heads, key/value heads, qk width, value width, causal)
    (4, 4, 8, 8, True), (4, 2, 8, 8, True), (4, 1, 12, 6, True), (4, 2, 8, 8, False)]


def reference(q, k, v, causal):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def worker(rank: int, world: int, store_path: str, errors):
    torch.set_num_threads(1)
    ring.CHUNK = 4  # 6 positions per rank: two chunks of query rows, one partial
    tdist.init_process_group("gloo", store=tdist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        for H, Hkv, D, Dv, causal in CASES:
            gen = torch.Generator().manual_seed(H * 100 + Hkv * 10 + D)
            T = 6 * world  # 6 positions per rank
            q = torch.randn(2, H, T, D, generator=gen, requires_grad=True)
            k = torch.randn(2, Hkv, T, D, generator=gen, requires_grad=True)
            v = torch.randn(2, Hkv, T, Dv, generator=gen, requires_grad=True)
            dout = torch.randn(2, H, T, Dv, generator=gen)
            full = reference(q, k, v, causal)
            full.backward(dout)
            mine = slice(rank * 6, (rank + 1) * 6)
            ql, kl, vl = (t.detach()[:, :, mine].clone().requires_grad_() for t in (q, k, v))
            out = ring_attention(ql, kl, vl, causal=causal)
            out.backward(dout[:, :, mine])
            for name, got, want in (("output", out, full[:, :, mine]), ("dq", ql.grad, q.grad[:, :, mine]),
                                    ("dk", kl.grad, k.grad[:, :, mine]), ("dv", vl.grad, v.grad[:, :, mine])):
                err = (got - want).abs().max().item()
                if err > 1e-5:
                    errors.put(f"rank {rank}, case {(H, Hkv, D, Dv, causal)}: {name} off by {err:.2e}")
    finally:
        tdist.destroy_process_group()


# 4 ranks (key/value blocks travel three hops instead of one) in the slow tier; 2 ranks check
# the masks of the diagonal and off-diagonal blocks, the merge of partial softmaxes and the
# backward pass's hops
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ring_attention_equals_one_process(world, tmp_path):
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    mp.start_processes(worker, args=(world, str(tmp_path / "store"), errors), nprocs=world, start_method="spawn")
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found, found
