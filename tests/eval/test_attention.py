"""Attention analysis: the statistics against hand-made rows and an independent re-computation
of the weights, for every attention kind."""

import math

import numpy as np
import pytest
import torch

from llmlab.eval.attention import collect, head_diversity, row_stats, summarize
from llmlab.model.attention import ATTENTION
from tests.conftest import test_configs, tiny_model


def test_uniform_and_one_hot_rows():
    T = 5
    visible = torch.arange(1, T + 1)
    uniform = torch.tril(torch.ones(T, T)) / visible[:, None]  # each query spreads over what it sees
    s = row_stats(uniform[None, None], visible)
    assert torch.allclose(s["entropy_bits"][0, 0], torch.log2(visible.double()))
    assert torch.allclose(s["support"][0, 0], visible.double())
    assert torch.allclose(s["normalized_support"][0, 0], torch.ones(T, dtype=torch.float64))
    one_hot = torch.eye(T)  # each query attends to itself only
    s = row_stats(one_hot[None, None], visible)
    assert torch.allclose(s["support"], torch.ones(1, 1, T, dtype=torch.float64))
    assert torch.allclose(s["normalized_support"][0, 0], 1 / visible.double())


def test_head_diversity_is_the_earth_movers_distance():
    T = 6
    a = torch.zeros(T)
    a[1] = 1
    b = torch.zeros(T)
    b[4] = 1  # all mass moved 3 positions
    c = torch.full((T,), 1 / T)
    w = torch.stack([a, b, c])[None, :, None, :]  # (B=1, H=3, Tq=1, Tk=T)
    emd_ab, emd_ac, emd_bc = 3.0, sum(abs(k - 1) for k in range(T)) / T, sum(abs(k - 4) for k in range(T)) / T
    assert head_diversity(w)[0, 0].item() == pytest.approx((emd_ab + emd_ac + emd_bc) / 3)
    same = torch.stack([c, c])[None, :, None, :]
    assert head_diversity(same).abs().max().item() < 1e-12


KINDS = test_configs(ATTENTION)


@pytest.mark.parametrize("attn", KINDS, ids=[k["kind"] for k in KINDS])
def test_every_attention_kind_is_analysed(attn):
    model = tiny_model(attention=attn)
    tokens = np.random.default_rng(0).integers(0, 97, 400)
    raw = collect(model, tokens, 16, windows=3, batch=2, device=torch.device("cpu"))
    summary = summarize(raw)
    assert summary["windows"] == 3 and len(summary["layers"]) == 2 and len(summary["layers"][0]["heads"]) == 4
    visible = raw["visible"][0]
    expected = torch.arange(1, 17).clamp(max=attn.get("window", 16))
    assert torch.equal(visible.long(), expected)  # SWA caps the keys a query sees at the window
    ns = raw["layers"][0]["normalized_support"]
    assert (ns > 0).all() and (ns <= 1 + 1e-9).all()
    assert ns[:, :, 0].allclose(torch.ones_like(ns[:, :, 0], dtype=torch.float64))  # the first query sees one key
    # every visible key has weight, but where a sparse kind picks its top-k (dsa)
    attended = torch.minimum(visible.double(), torch.tensor(float(attn.get("topk", 16)))) / visible.double()
    assert torch.allclose(raw["layers"][0]["attended_share"], attended.expand_as(ns))
    assert summary["mean"]["attended_share"] == pytest.approx(float(attended.mean()))
    assert summary["mean"]["diversity_emd"] >= 0
    assert len(summary["by_length"]["support"]) == 16


def test_weights_match_an_independent_recomputation():
    """MHA with RoPE: softmax(q k^T / sqrt(d)) from the layer's own projections, by hand."""
    model = tiny_model(attention={"kind": "mha"})
    tokens = np.random.default_rng(1).integers(0, 97, 200)
    raw = collect(model, tokens, 16, windows=1, batch=1, device=torch.device("cpu"))
    x = torch.from_numpy(tokens[:16]).long()[None]
    blk, attn = model.blocks[0], model.blocks[0].attn
    h = blk.attn_norm(model.embed(x))
    q, k, _ = attn.qkv_proj(h).split(attn.qkv_sizes(), dim=-1)
    q = q.view(1, 16, 4, 8).transpose(1, 2)
    k = k.view(1, 16, 4, 8).transpose(1, 2)
    pos = torch.arange(16).float()
    inv = 10000.0 ** (-torch.arange(0, 8, 2).float() / 8)
    ang = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)

    def rope(t):
        rot = torch.cat([-t[..., 4:], t[..., :4]], -1)
        return t * ang.cos() + rot * ang.sin()

    scores = (rope(q) @ rope(k).transpose(-1, -2)) / math.sqrt(8)
    scores = scores.masked_fill(~torch.tril(torch.ones(16, 16, dtype=torch.bool)), float("-inf"))
    w = scores.softmax(-1)
    ent = -(w * torch.log2(w.clamp_min(1e-30))).sum(-1)
    assert torch.allclose(raw["layers"][0]["entropy_bits"][0].float(), ent[0].detach(), atol=1e-4)


def test_bidirectional_model_sees_every_key():
    model = tiny_model(objective={"kind": "mlm"})
    tokens = np.random.default_rng(0).integers(0, 97, 200)
    raw = collect(model, tokens, 16, windows=2, batch=2, device=torch.device("cpu"))
    assert torch.equal(raw["visible"][0].long(), torch.full((16,), 16))
