"""Invariants of the assembled model, for every registered variant (tests loop over the
registries, so a new variant is covered without editing them)."""

import itertools

import pytest
import torch

from llmlab.errors import ConfigError
from llmlab.model.attention import ATTENTION
from llmlab.model.block import BLOCK
from llmlab.model.ffn import FFN
from llmlab.model.position import POSITION
from llmlab.model.transformer import Transformer
from llmlab.sample.generate import SamplingConfig, generate
from tests.conftest import tiny_model, tiny_spec

ATTN = {name: {"kind": name, **({"kv_heads": 2} if name == "gqa" else {})} for name in ATTENTION.names()}
COMBOS = list(itertools.product(ATTENTION.names(), POSITION.names(), BLOCK.names()))


@pytest.mark.parametrize("attn, pos, placement", COMBOS)
def test_forward_backward_finite_and_causal(attn, pos, placement):
    model = tiny_model(attention=ATTN[attn], pos={"kind": pos}, norm={"placement": placement, "kind": "rmsnorm"})
    x = torch.randint(0, 97, (2, 16))
    model.train()
    logits, loss, _ = model(x, x)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

    model.eval()
    t = 9
    x2 = x.clone()
    x2[:, t] = (x2[:, t] + 1) % 97  # change one token
    with torch.no_grad():
        a, _, _ = model(x)
        b, _, _ = model(x2)
    assert torch.allclose(a[:, :t], b[:, :t], atol=1e-6), "a later token changed earlier logits"
    assert not torch.allclose(a[:, t:], b[:, t:]), "the changed token had no effect at all"


@pytest.mark.parametrize("ffn", FFN.names())
def test_every_ffn_trains(ffn):
    model = tiny_model(ffn=ffn)
    x = torch.randint(0, 97, (2, 8))
    model.train()
    _, loss, _ = model(x, x)
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("attn", ATTENTION.names())
@pytest.mark.parametrize("pos", POSITION.names())
def test_cached_decoding_matches_full_forward(attn, pos):
    model = tiny_model(attention=ATTN[attn], pos={"kind": pos})
    x = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full, _, _ = model(x)
        cache = model.new_cache(2)
        parts = [model(x[:, :7], cache=cache)[0]]  # prefill
        parts += [model(x[:, i:i + 1], cache=cache)[0] for i in range(7, 12)]  # one at a time
        parts.append(model(x[:, 12:], cache=cache)[0])  # a chunk after a prefix
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


@pytest.mark.parametrize("attn", ATTENTION.names())
def test_cached_and_uncached_greedy_generation_agree(attn):
    model = tiny_model(attention=ATTN[attn])
    prompt = torch.randint(0, 97, (2, 5))
    cfg = SamplingConfig(max_new_tokens=20, temperature=0.0)
    a = generate(model, prompt, cfg, use_cache=True)
    b = generate(model, prompt, cfg, use_cache=False)
    assert a.shape == (2, 25)
    assert torch.equal(a, b)


def test_sampling_with_top_k_1_equals_greedy():
    model = tiny_model()
    prompt = torch.randint(0, 97, (1, 4))
    greedy = generate(model, prompt, SamplingConfig(max_new_tokens=15, temperature=0.0))
    top1 = generate(model, prompt, SamplingConfig(max_new_tokens=15, temperature=1.3, top_k=1),
                    generator=torch.Generator().manual_seed(0))
    assert torch.equal(greedy, top1)


def test_generation_stops_at_eos():
    model = tiny_model()
    prompt = torch.randint(0, 97, (1, 4))
    first = generate(model, prompt, SamplingConfig(max_new_tokens=1, temperature=0.0))[0, -1].item()
    out = generate(model, prompt, SamplingConfig(max_new_tokens=30, temperature=0.0), eos_id=first)
    assert out.shape[1] == 5  # the eos itself, then stop


@pytest.mark.parametrize("named, gqa_kv_heads", [("mha", 4), ("mqa", 1)])
def test_mha_and_mqa_are_gqa_with_all_or_one_kv_heads(named, gqa_kv_heads):
    """Given the same weights: gqa with kv_heads = heads is mha; with one kv head it is mqa."""
    reference = tiny_model(attention={"kind": named})
    gqa = Transformer(tiny_spec(attention={"kind": "gqa", "kv_heads": gqa_kv_heads})).eval()
    gqa.load_state_dict(reference.state_dict())
    x = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        assert torch.allclose(reference(x)[0], gqa(x)[0], atol=1e-6)


@pytest.mark.parametrize("attn", ATTENTION.names())
def test_sdpa_path_equals_math_path(attn):
    model = tiny_model(attention=ATTN[attn])
    x = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        fast, _, none = model(x)
        slow, _, weights = model(x, need_weights=True)
    assert none is None
    assert torch.allclose(fast, slow, atol=1e-5)
    assert len(weights) == 2 and weights[0].shape == (2, 4, 16, 16)
    assert torch.allclose(weights[0].sum(-1), torch.ones(2, 4, 16))
    assert torch.all(weights[0].triu(1) == 0)  # causal


def test_loss_falls_when_overfitting_one_batch():
    torch.manual_seed(0)
    model = tiny_model().train()
    x = torch.randint(0, 97, (4, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        _, loss, _ = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 4.0  # about ln(97) at the start
    assert losses[-1] < 0.5 * losses[0]


def test_vocab_padded_and_tied_head():
    model = tiny_model(vocab_size=100)
    assert model.padded_vocab == 128
    assert model.lm_head.weight is model.embed.weight
    untied = tiny_model(vocab_size=100, tie_embeddings=False)
    assert untied.lm_head.weight is not untied.embed.weight
    assert untied.param_counts()["total"] == model.param_counts()["total"] + 128 * 32


def test_residual_projections_get_scaled_init():
    model = Transformer(tiny_spec(n_layers=8, d_model=64, init_std=0.02))
    o = model.blocks[0].attn.o_proj.weight.std().item()
    q = model.blocks[0].attn.q_proj.weight.std().item()
    assert abs(q - 0.02) < 0.003
    assert abs(o - 0.02 / 4) < 0.001  # 1 / sqrt(2 * 8)


def test_model_card_numbers():
    model = tiny_model(vocab_size=97)  # padded to 128, d 32, 2 layers, 4 heads of 8
    counts = model.param_counts()
    assert counts["embedding"] == 128 * 32
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    # MHA caches K and V: 2 * heads * head_dim per layer
    assert model.kv_cache_bytes_per_token(4) == 2 * 2 * 32 * 4
    gqa = tiny_model(attention={"kind": "gqa", "kv_heads": 2})
    assert gqa.kv_cache_bytes_per_token(4) == model.kv_cache_bytes_per_token(4) // 2
    n = counts["non_embedding"] + 128 * 32  # the tied head is still a matmul
    assert model.flops_per_token(32) == 6 * n + 2 * 6 * 4 * 32 * (8 + 8)


def test_impossible_shapes_are_config_errors():
    with pytest.raises(ConfigError, match=r"^attention.kv_heads: 3 does not divide model.n_heads=4$"):
        Transformer(tiny_spec(attention={"kind": "gqa", "kv_heads": 3}))
    with pytest.raises(ConfigError, match=r"^model.n_heads: 5 does not divide model.d_model=32$"):
        tiny_spec(n_heads=5)
    with pytest.raises(ConfigError, match=r"^model.ffn: unknown model.ffn 'relu3'; allowed: gelu, relu2, swiglu$"):
        tiny_spec(ffn="relu3")
