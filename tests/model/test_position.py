import math

import pytest
import torch

from llmlab.errors import UserError
from llmlab.model.position import RotaryAngles, sinusoid_table
from tests.conftest import tiny_model


def test_rope_preserves_norms():
    q = torch.randn(2, 3, 10, 16)
    rot = RotaryAngles(torch.arange(10), 10000.0)
    assert torch.allclose(rot.rotate(q).norm(dim=-1), q.norm(dim=-1), atol=1e-5)


def test_rope_dot_product_depends_only_on_offset():
    torch.manual_seed(0)
    q, k = torch.randn(16), torch.randn(16)

    def score(m, n):
        rq = RotaryAngles(torch.tensor([m]), 10000.0).rotate(q.view(1, 1, 1, 16))
        rk = RotaryAngles(torch.tensor([n]), 10000.0).rotate(k.view(1, 1, 1, 16))
        return (rq * rk).sum().item()

    assert score(5, 2) == pytest.approx(score(103, 100), abs=1e-4)
    assert score(7, 7) == pytest.approx(score(0, 0), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)


def test_rope_frequencies_span_one_head_and_are_shared_by_heads():
    """Rotating a (B, H, T, Dh) tensor uses frequencies theta^(-2i/Dh) for every head. The
    whole-model-dimension bug (frequencies over H * Dh, or a different one per head) fails."""
    head_dim, heads, theta = 8, 4, 10000.0
    pos = torch.arange(6)
    x = torch.randn(1, 1, 6, head_dim).expand(1, heads, 6, head_dim).contiguous()
    out = RotaryAngles(pos, theta).rotate(x)
    for h in range(1, heads):
        assert torch.allclose(out[:, h], out[:, 0])  # same input, same rotation in every head
    # pair (i, i + Dh/2) at position p turns by p * theta^(-2i/Dh)
    i, p = 1, 5
    angle = p * theta ** (-2 * i / head_dim)
    a, b = x[0, 0, p, i], x[0, 0, p, i + head_dim // 2]
    expect = (a * math.cos(angle) - b * math.sin(angle), b * math.cos(angle) + a * math.sin(angle))
    assert out[0, 0, p, i].item() == pytest.approx(expect[0].item(), abs=1e-5)
    assert out[0, 0, p, i + head_dim // 2].item() == pytest.approx(expect[1].item(), abs=1e-5)


def test_sinusoid_table_matches_the_formula():
    table = sinusoid_table(torch.arange(50), 16)
    p, i = 7, 3
    assert table[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 16)), abs=1e-6)


def test_learned_positions_stop_at_max_seq_len():
    model = tiny_model(pos={"kind": "learned"})
    with pytest.raises(UserError, match=r"pos=learned knows positions 0..31"):
        model(torch.zeros(1, 33, dtype=torch.long))
