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


def test_alibi_slopes_are_the_papers():
    from llmlab.model.position.alibi import alibi_slopes

    assert alibi_slopes(8, 8.0) == [2.0 ** -i for i in range(1, 9)]  # 1/2 ... 1/256
    # 6 heads: the four of n=4 (2^-2, 2^-4, ...), then every other one of n=8 (2^-1, 2^-3)
    assert alibi_slopes(6, 8.0) == [2.0 ** -i for i in (2, 4, 6, 8, 1, 3)]


def test_alibi_weights_fall_with_distance_at_each_heads_slope():
    """With queries and keys zeroed, every score is the bias alone, so each head's weights
    are softmax(-slope x distance) over the keys a query sees: the closed form."""
    from llmlab.model.position.alibi import alibi_slopes
    from tests.conftest import tiny_model

    model = tiny_model(pos={"kind": "alibi"}, n_layers=1).eval()
    attn = model.blocks[0].attn
    q_and_k = attn.n_heads * attn.head_dim + attn.kv_heads * attn.head_dim
    with torch.no_grad():
        attn.qkv_proj.weight[:q_and_k] = 0
        weights = model(torch.randint(0, 97, (1, 12)), need_weights=True).weights[0][0]  # (H, T, T)
    for h, slope in enumerate(alibi_slopes(attn.n_heads, 8.0)):
        for i in range(12):
            expected = torch.softmax(-slope * (i - torch.arange(i + 1.0)), dim=0)
            assert torch.allclose(weights[h, i, :i + 1], expected, atol=1e-6)
            assert torch.all(weights[h, i, i + 1:] == 0)

