"""DeepSeek Sparse Attention: against its base attention, its selection, its indexer's training
and its cost card. The generic tests (causality, cached decoding, bf16 caches, speculative
decoding, packing, analysis) cover it as every registered kind."""

import pytest
import torch

from llmlab.errors import ConfigError
from llmlab.model.attention import ATTENTION
from llmlab.model.attention.dsa import top_keys
from llmlab.model.transformer import Transformer
from tests.conftest import test_config, tiny_model, tiny_spec

DSA = test_config(ATTENTION, "dsa")
MLA = {k: v for k, v in DSA.items() if k in ("q_rank", "kv_rank", "rope_dim", "nope_dim", "v_dim")}
BASES = {"mla": {"kind": "mla", **MLA}, "gqa": {"kind": "gqa", "kv_heads": 2}, "mha": {"kind": "mha"},
         "mqa": {"kind": "mqa"}}


def dsa_and_base(base: str, **settings):
    """A dsa model and its base-attention model with the same weights (the indexer aside)."""
    dsa = tiny_model(attention={**DSA, "base": base, **settings})
    plain = tiny_model(attention=BASES[base])
    state = {k.replace("attn.base.", "attn."): v for k, v in dsa.state_dict().items() if ".indexer." not in k}
    plain.load_state_dict(state)
    return dsa, plain


@pytest.mark.parametrize("base", list(BASES))
def test_with_k_at_least_the_context_it_is_its_base(base):
    dsa, plain = dsa_and_base(base, topk=32)
    x = torch.randint(0, 97, (2, 32))
    with torch.no_grad():
        assert torch.equal(dsa(x).logits, plain(x).logits)
        cache_a, cache_b = dsa.new_cache(2), plain.new_cache(2)  # decoding too
        for t in range(0, 32, 8):
            assert torch.equal(dsa(x[:, t:t + 8], cache=cache_a).logits, plain(x[:, t:t + 8], cache=cache_b).logits)


@pytest.mark.parametrize("base", ["mla", "gqa"])
def test_fewer_than_k_earlier_keys_are_all_attended(base):
    """k = 6 of 16 positions: the first six queries see what the base sees, the later ones differ."""
    dsa, plain = dsa_and_base(base, topk=6)
    x = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        a, b = dsa(x).logits, plain(x).logits
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(a[:, 6:], b[:, 6:], atol=1e-4)


@pytest.mark.parametrize("k", [1, 3])
def test_each_query_attends_to_its_top_k_keys_by_the_index(k):
    model = tiny_model(attention={**DSA, "topk": k})
    x = torch.randint(0, 97, (2, 12))
    indexer, seen = model.blocks[0].attn.indexer, []
    original = indexer.scores
    indexer.scores = lambda *args: seen.append(original(*args)) or seen[-1]  # the first layer's index scores
    with torch.no_grad():
        out = model(x, need_weights=True)
    (scores,) = seen
    weights = out.weights[0]  # (B, H, T, T)
    attended = weights > 0
    visible = torch.arange(12)[:, None] >= torch.arange(12)[None, :]
    assert torch.equal(attended.sum(-1), torch.arange(1, 13).clamp(max=k).expand(2, 4, 12))
    assert not (attended & ~visible).any()
    assert torch.equal(attended[:, 0], attended[:, 1])  # one selection for all heads
    for t in range(k, 12):  # the attended keys are the ones the indexer ranks highest
        ranked = scores[:, t, : t + 1]
        lowest_kept = ranked.masked_fill(~attended[:, 0, t, : t + 1], float("inf")).min(-1).values
        highest_dropped = ranked.masked_fill(attended[:, 0, t, : t + 1], float("-inf")).max(-1).values
        assert (lowest_kept >= highest_dropped).all()


def test_top_keys_is_an_exact_order_with_the_earlier_key_first_on_ties():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(-3, 4, (2, 5, 40), generator=g).float() / 4  # many exact ties
    scores[0, 0, :7] = 0.0
    scores[1, 2, 5:9] = float("-inf")
    scores[1, 3, 0] = -0.0
    positions = torch.arange(40)
    for k in (1, 5, 17, 40):
        got = top_keys(scores, positions, k)
        for b in range(2):
            for t in range(5):
                row = scores[b, t].tolist()
                want = sorted(range(40), key=lambda i: (-row[i], i))[:k]
                assert sorted(got[b, t].tolist()) == sorted(want), (b, t, k)


def test_language_model_loss_never_trains_the_indexer_and_the_kl_never_trains_the_model():
    for dense_warmup, step in ((5, 0), (5, 5)):  # the dense warm-up, then sparse training
        model = tiny_model(attention={**DSA, "dense_warmup": dense_warmup})
        model.train()
        model.at_step(step)
        x = torch.randint(0, 97, (2, 16))
        out = model(x, x)
        kl = out.metrics["indexer/kl"]
        assert kl > 0
        indexer = {n for n, _ in model.named_parameters() if ".indexer." in n}
        main_grads = torch.autograd.grad(out.main_loss, list(model.parameters()), allow_unused=True, retain_graph=True)
        for (name, _), g in zip(model.named_parameters(), main_grads):
            assert (g is None or not g.any()) == (name in indexer), name
        aux = (out.loss - out.main_loss)
        aux_grads = torch.autograd.grad(aux, list(model.parameters()), allow_unused=True)
        for (name, _), g in zip(model.named_parameters(), aux_grads):
            assert (g is not None and g.any()) == (name in indexer), name


def test_dense_warm_up_attends_densely_and_then_sparsely():
    dsa, plain = dsa_and_base("mla", topk=3, dense_warmup=10)
    x = torch.randint(0, 97, (2, 16))
    dsa.train(), plain.train()
    with torch.no_grad():
        reference = plain(x).logits
        dsa.at_step(9)
        assert torch.equal(dsa(x).logits, reference)  # the warm-up's last step is dense
        dsa.at_step(10)
        assert not torch.allclose(dsa(x).logits, reference, atol=1e-4)
        dsa.at_step(0)
        dsa.eval()  # evaluation and decoding are always sparse
        assert not torch.allclose(dsa(x).logits, plain.eval()(x).logits, atol=1e-4)


@pytest.mark.parametrize("base", ["mla", "gqa"])
def test_the_indexer_kl_falls_in_a_short_run(base):
    """The indexer learns to follow the attention. The model's queries are scaled up, so its
    attention is sharp, far from the untrained indexer's near-uniform scores; then 40
    training steps (the loss as the training loop takes it, on one batch) cut the KL by 40%, in the
    dense warm-up (over every earlier key) and in sparse training (over the top-k). Only the
    indexer moves: the KL reaches nothing else, and the optimizer holds the indexer alone."""
    torch.manual_seed(0)
    model = Transformer(tiny_spec(attention={**DSA, "base": base, "topk": 4, "dense_warmup": 40}))
    model.train()
    with torch.no_grad():
        for blk in model.blocks:  # queries and keys 16x: scores 256x
            for layer in blk.attn.base.modules():
                if isinstance(layer, torch.nn.Linear) and layer is not blk.attn.base.o_proj:
                    layer.weight.mul_(16.0)
    indexer = [p for blk in model.blocks for p in blk.attn.indexer.parameters()]
    x = torch.randint(0, 97, (8, 17), generator=torch.Generator().manual_seed(0))
    for first in (0, 40):  # the dense warm-up, then sparse training
        opt = torch.optim.AdamW(indexer, lr=3e-2)
        kls = []
        for step in range(first, first + 40):
            model.at_step(step)
            out = model(x[:, :-1], x[:, 1:])
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            kls.append(out.metrics["indexer/kl"].item())
        assert kls[0] > 0.03 and kls[-1] < 0.6 * kls[0], kls


def test_cost_card_counts_the_indexer_and_k_keys():
    dsa, plain = dsa_and_base("gqa", topk=8, index_dim=8, index_heads=2)
    attn, base = dsa.blocks[0].attn, plain.blocks[0].attn
    assert attn.kv_cache_bytes_per_token(2) == base.kv_cache_bytes_per_token(2) + 8 * 2
    assert attn.flops_per_token(32) == base.flops_per_token(8) + 6 * 2 * 8 * 32
    assert attn.flops_per_token(4) == base.flops_per_token(4) + 6 * 2 * 8 * 4  # fewer than k: all of them
    cache = dsa.new_cache(1, 32)
    assert cache.nbytes() == plain.new_cache(1, 32).nbytes() + 2 * 32 * 8 * 4  # two layers' fp32 index keys


def test_decoding_reads_k_keys_not_the_context():
    """A decode step hands its base the gathered top-k keys alone."""
    model = tiny_model(attention={**DSA, "base": "gqa", "topk": 3})
    seen = []
    base = model.blocks[0].attn.base
    original = base.attend

    def spy(q, k, v, *args, **kwargs):
        seen.append(k.shape[2])
        return original(q, k, v, *args, **kwargs)

    base.attend = spy
    x = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        cache = model.new_cache(1)
        model(x[:, :8], cache=cache)
        for t in range(8, 12):
            model(x[:, t:t + 1], cache=cache)
    assert seen == [8, 3, 3, 3, 3]


@pytest.mark.parametrize("setting, message", [
    ({"index_dim": 7}, "attention.index_dim: must be even"),
    ({"base": "swa"}, "attention.base"),
    ({"topk": 0}, "attention.topk: must be >= 1"),
    ({"rope_dim": 5}, "attention.rope_dim: must be even"),
])
def test_bad_settings_name_the_key(setting, message):
    with pytest.raises(ConfigError, match=message):
        tiny_spec(attention={**DSA, **setting})
