"""Invariants of the assembled model, for every registered variant. The tests loop over the
registries, so a new variant is covered without editing them."""

import itertools

import pytest
import torch

from llmlab.errors import ConfigError
from llmlab.model.attention import ATTENTION
from llmlab.model.block import BLOCK
from llmlab.model.ffn import FFN
from llmlab.model.position import POSITION
from llmlab.model.transformer import ModelSpec, Transformer
from llmlab.sample.generate import SamplingConfig, generate
from tests.conftest import test_config, test_configs, tiny_model, tiny_spec
from tests.helpers import incremental_logits

# Each kind's small test settings, so that windows, groups and latents are really exercised at width 32
ATTN = {c["kind"]: c for c in test_configs(ATTENTION)}
COMBOS = list(itertools.product(ATTENTION.names(), POSITION.names(), BLOCK.names()))


@pytest.mark.parametrize("attn, pos, placement", COMBOS)
def test_forward_backward_finite_and_causal(attn, pos, placement):
    model = tiny_model(attention=ATTN[attn], pos={"kind": pos}, norm={"placement": placement, "kind": "rmsnorm"})
    x = torch.randint(0, 97, (2, 16))
    model.train()
    out = model(x, x)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

    model.eval()
    t = 9
    x2 = x.clone()
    x2[:, t] = (x2[:, t] + 1) % 97  # change one token
    with torch.no_grad():
        a, b = model(x).logits, model(x2).logits
    assert torch.allclose(a[:, :t], b[:, :t], atol=1e-6), "a later token changed earlier logits"
    assert not torch.allclose(a[:, t:], b[:, t:]), "the changed token had no effect at all"


@pytest.mark.parametrize("ffn", FFN.names())
def test_every_ffn_trains(ffn):
    model = tiny_model(ffn=test_config(FFN, ffn))
    x = torch.randint(0, 97, (2, 8))
    model.train()
    out = model(x, x)
    out.loss.backward()
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("attn", ATTENTION.names())
@pytest.mark.parametrize("pos", POSITION.names())
def test_cached_decoding_matches_full_forward(attn, pos):
    """Prefill, then one token at a time, then a chunk after a prefix; 20 positions, so past
    the SWA window of 5."""
    model = tiny_model(attention=ATTN[attn], pos={"kind": pos})
    x = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full = model(x).logits
        assert torch.allclose(incremental_logits(model, x, [7, 8, 9, 10, 11, 12]), full, atol=1e-5)
        assert torch.allclose(incremental_logits(model, x, list(range(1, 20))), full, atol=1e-5)


@pytest.mark.parametrize("attn, pos, placement", COMBOS)
def test_decodings_lean_path_gives_the_ordinary_forwards_numbers_exactly(attn, pos, placement):
    """What decoding runs (`lean_decoding`: the model's and each block's `decode_token`, and
    the grouped-query kinds' own) computes what the ordinary cached forward does, bit for bit,
    for every attention kind, position scheme and block, with biases: one token at a time for
    two sequences over 20 positions (past the SWA window), after a prefill of 3."""
    from llmlab.model.transformer import lean_decoding
    model = tiny_model(attention=ATTN[attn], pos={"kind": pos}, norm={"placement": placement, "kind": "rmsnorm"},
                       bias=True, init_std=0.3)
    x = torch.randint(0, 97, (2, 20))
    with torch.inference_mode():
        ref = incremental_logits(model, x, list(range(3, 20)))
        with lean_decoding(model):
            assert model.lean_decoding
            lean = incremental_logits(model, x, list(range(3, 20)))
    assert not model.lean_decoding
    assert torch.equal(lean, ref)
    # the grouped-query family with its own seams decodes a token in one pass of its own
    assert model.blocks[0].attn.decodes_inline == (attn in ("mha", "gqa", "mqa", "qknorm"))


def test_decodings_lean_path_keeps_mups_scales_and_the_heads_hidden_states():
    """Under muP the scores are scaled by 1/D and the logits by the output multiplier; the lean
    path keeps both, and hands out the final states the MTP heads read."""
    from llmlab.model.transformer import lean_decoding
    model = tiny_model(attention=ATTN["gqa"], parametrization="mup", mup_base_width=8, mtp_heads=1,
                       tie_embeddings=False, init_std=0.3)
    assert model.blocks[0].attn.score_mult != 1.0 and model.output_mult != 1.0
    x = torch.randint(0, 97, (1, 9))
    with torch.inference_mode():
        outs = []
        for lean in (False, True):
            cache = model.new_cache(1)
            model(x[:, :8], cache=cache)
            with lean_decoding(*([model] if lean else [])):
                outs.append(model(x[:, 8:], cache=cache))
    assert torch.equal(outs[0].logits, outs[1].logits) and torch.equal(outs[0].hidden, outs[1].hidden)


def test_a_model_with_hooks_decodes_through_its_ordinary_forward():
    """The lean path enters the parts through their ``forward``, which runs no hook: a model
    with one (FSDP gathers a sharded block's weights in a hook) keeps the ordinary forward."""
    model = tiny_model()
    seen = []
    model.blocks[0].register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    generate(model, torch.randint(0, 97, (1, 3)), SamplingConfig(max_new_tokens=4, temperature=0.0), pack=False)
    assert seen == [3, 1, 1, 1]  # the prompt, then each new token but the last


@pytest.mark.parametrize("attn", ATTENTION.names())
@pytest.mark.filterwarnings("error:Mismatch dtype between input and weight:UserWarning")
def test_cached_decoding_under_bf16_autocast(attn):
    """``precision=bf16`` samples under autocast: keys and values come out of the projections in
    bf16, every kind appends them to its cache (the rolling SWA cache once refused a dtype
    other than its own), and the logits follow the full forward to bf16 accuracy. On the CPU
    the cache is fp32 (`cache_dtype`: attention's scores are fp32 there), so it holds the keys
    the full forward attends to (mla's normed latents, qknorm's keys) unrounded; on a GPU under
    autocast it is in autocast's dtype. The norms inside attention (mla's latents,
    qknorm's) take their input in their weight's dtype, so torch's fused RMSNorm runs (a bf16
    input made it warn and fall back)."""
    from llmlab.model.cache import cache_dtype
    model = tiny_model(attention=ATTN[attn])
    x = torch.randint(0, 97, (2, 20))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cache = model.new_cache(2)
        full = model(x).logits.float()
        steps = incremental_logits(model, x, list(range(1, 20))).float()
    tensors = [t for layer in cache.layers for t in vars(layer).values()
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    assert tensors and all(t.dtype == torch.float32 for t in tensors)
    torch.testing.assert_close(steps, full, atol=0.1, rtol=0.05)
    assert cache_dtype(torch.float32, "cuda", torch.bfloat16) == torch.bfloat16
    assert cache_dtype(torch.bfloat16, "cpu", None) == torch.bfloat16  # a bf16 model's own dtype


@pytest.mark.parametrize("mask", ["causal flag", "float bias"])
def test_cpu_attention_under_bf16_computes_its_scores_in_fp32(mask):
    """On the CPU, PyTorch's flash kernel is many times slower in bf16 than in fp32 (its backward
    above all), so under ``precision=bf16`` the attention core takes the bf16 projections up to
    fp32 and its result back down: exactly what fp32 attention of those bf16 values gives, in
    the forward and in the gradients; fp32 inputs, and one decoded query, go to SDPA as they are."""
    from llmlab.model.attention import fused_sdpa
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8).bfloat16().requires_grad_() for _ in range(3))
    kwargs = ({"is_causal": True} if mask == "causal flag"
              else {"attn_mask": torch.randn(16, 16).bfloat16().masked_fill(torch.ones(16, 16).triu(1).bool(), float("-inf"))})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fused_sdpa(q, k, v, **kwargs)
    ref_kwargs = dict(kwargs)
    if "attn_mask" in kwargs:
        ref_kwargs["attn_mask"] = kwargs["attn_mask"].float()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q2.float(), k2.float(), v2.float(), **ref_kwargs).bfloat16()
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, ref)
    g = torch.randn_like(y)
    y.backward(g)
    ref.backward(g)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert a.grad.dtype == torch.bfloat16 and torch.equal(a.grad, b.grad)
    x = torch.randn(2, 4, 16, 8)
    assert torch.equal(fused_sdpa(x, x, x, is_causal=True),
                       torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True))
    one = q.detach()[:, :, -1:]  # a decoded token's query with bf16 keys keeps the bf16 kernel
    with torch.no_grad():
        assert torch.equal(fused_sdpa(one, k.detach(), v.detach()),
                           torch.nn.functional.scaled_dot_product_attention(one, k.detach(), v.detach()))
        # with fp32 keys (the cache under CPU autocast) it is the fp32 attention of the same values
        k32, v32 = k.detach().float(), v.detach().float()
        mixed = fused_sdpa(one, k32, v32)
        assert mixed.dtype == torch.bfloat16
        assert torch.equal(mixed, torch.nn.functional.scaled_dot_product_attention(one.float(), k32, v32).bfloat16())


@pytest.mark.parametrize("attn", ATTENTION.names())
def test_cached_and_uncached_greedy_generation_agree(attn):
    model = tiny_model(attention=ATTN[attn])
    prompt = torch.randint(0, 97, (2, 5))
    cfg = SamplingConfig(max_new_tokens=20, temperature=0.0)
    a = generate(model, prompt, cfg, use_cache=True)
    b = generate(model, prompt, cfg, use_cache=False)
    assert a.shape == (2, 25)
    assert torch.equal(a, b)


@pytest.mark.parametrize("attn", ATTENTION.names())
def test_sampling_with_top_k_1_equals_greedy(attn):
    model = tiny_model(attention=ATTN[attn])
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


def same_weights(reference, attention):
    other = Transformer(tiny_spec(attention=attention)).eval()
    other.load_state_dict(reference.state_dict())
    return other


@pytest.mark.parametrize("named, equivalent", [
    ({"kind": "mha"}, {"kind": "gqa", "kv_heads": 4}),
    ({"kind": "mqa"}, {"kind": "gqa", "kv_heads": 1}),
    ({"kind": "gqa", "kv_heads": 2}, {"kind": "swa", "kv_heads": 2, "window": 16}),
    ({"kind": "mha"}, {"kind": "swa", "window": 100}),
])
def test_equivalent_attention_kinds_give_the_same_logits(named, equivalent):
    """With the same weights: gqa with kv_heads = heads is mha, with one kv head it is mqa;
    swa with a window of at least the sequence length is full causal attention."""
    reference = tiny_model(attention=named)
    other = same_weights(reference, equivalent)
    x = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        assert torch.allclose(reference(x).logits, other(x).logits, atol=1e-6)


def test_swa_with_a_short_window_differs_from_full_attention():
    reference = tiny_model(attention={"kind": "mha"})
    windowed = same_weights(reference, {"kind": "swa", "window": 4})
    x = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        a, b = reference(x).logits, windowed(x).logits
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)  # nothing to cut off yet
    assert not torch.allclose(a[:, 4:], b[:, 4:], atol=1e-4)


def test_swa_cache_stays_bounded():
    model = tiny_model(attention={"kind": "swa", "window": 5}, max_seq_len=64)
    cache = model.new_cache(1)
    at_start = cache.nbytes()
    x = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        for i in range(40):
            model(x[:, i:i + 1], cache=cache)
    assert cache.nbytes() == at_start  # 40 tokens in, still 5 positions held
    # per layer: K and V of (B=1, H=4, window=5, Dh=8) fp32, plus one int64 position per slot
    assert at_start == 2 * (2 * 1 * 4 * 5 * 8 * 4 + 5 * 8)


@pytest.mark.parametrize("attn", ATTENTION.names())
@pytest.mark.parametrize("pos", POSITION.names())
def test_sdpa_path_equals_math_path(attn, pos):
    """The fused kernels and the math path agree under every mask and every position scheme,
    those that bias the scores included."""
    model = tiny_model(attention=ATTN[attn], pos={"kind": pos})
    x = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        fast = model(x)
        slow = model(x, need_weights=True)
    assert fast.weights is None
    assert torch.allclose(fast.logits, slow.logits, atol=1e-5)
    w = slow.weights[0]
    assert len(slow.weights) == 2 and w.shape == (2, 4, 16, 16)
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 16), atol=1e-6)
    assert torch.all(w.triu(1) == 0)  # causal


def test_mla_absorbed_decode_equals_plain():
    absorbed = tiny_model(attention={**ATTN["mla"], "absorb": True})
    plain = same_weights(absorbed, {**ATTN["mla"], "absorb": False})
    x = torch.randint(0, 97, (2, 18))
    with torch.no_grad():
        a = incremental_logits(absorbed, x, [6, 7, 8, 12])
        b = incremental_logits(plain, x, [6, 7, 8, 12])
        full = absorbed(x).logits
    assert torch.allclose(a, b, atol=1e-5)
    assert torch.allclose(a, full, atol=1e-5)


def test_mla_caches_only_the_latent_and_one_rotary_key():
    model = tiny_model(attention=ATTN["mla"])
    cache = model.new_cache(1, 10)
    layer = cache.layers[0]
    assert layer.latent.shape == (1, 10, 16) and layer.k_rope.shape == (1, 1, 10, 4)
    assert model.kv_cache_bytes_per_token(4) == 2 * (16 + 4) * 4


@pytest.mark.parametrize("precision,device,dtype", [("fp32", "cpu", "fp32"), ("bf16", "cpu", "fp32"),
                                                    ("bf16", "cuda", "bf16"), ("fp16", "cuda", "fp16")])
def test_the_model_card_gives_the_cache_of_the_dtype_decoding_keeps(precision, device, dtype):
    """The card's KV cache is what `new_cache` makes on that device under that precision: fp32
    under CPU autocast (attention's scores are fp32 there), autocast's dtype on a GPU."""
    from llmlab.train.card import model_card
    model = tiny_model(attention=ATTN["gqa"])
    card = model_card(model, 16, precision, device)
    assert card["kv_cache_dtype"] == dtype
    assert card["kv_cache_bytes_per_token"] == model.kv_cache_bytes_per_token(4 if dtype == "fp32" else 2)
    if device == "cpu":
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            assert model.new_cache(1, 4).layers[0].k.dtype == torch.float32


def test_default_mla_cache_is_at_most_a_quarter_of_mha():
    for d_model, heads in ((256, 4), (512, 8)):
        mha = Transformer(tiny_spec(attention={"kind": "mha"}, d_model=d_model, n_heads=heads))
        mla = Transformer(tiny_spec(attention={"kind": "mla"}, d_model=d_model, n_heads=heads))
        assert mla.kv_cache_bytes_per_token(2) <= 0.25 * mha.kv_cache_bytes_per_token(2)


def test_loss_falls_when_overfitting_one_batch():
    torch.manual_seed(0)
    model = tiny_model().train()
    x = torch.randint(0, 97, (4, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = model(x[:, :-1], x[:, 1:]).loss
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
    q = model.blocks[0].attn.qkv_proj.weight.std().item()
    assert abs(q - 0.02) < 0.003
    assert abs(o - 0.02 / 4) < 0.001  # 1 / sqrt(2 * 8)


def test_model_card_numbers():
    model = tiny_model(vocab_size=97)  # padded to 128, d 32, 2 layers, 4 heads of 8
    counts = model.param_counts()
    assert counts["embedding"] == 128 * 32
    assert counts["total"] == counts["active"] == sum(p.numel() for p in model.parameters())
    # MHA caches K and V: 2 * heads * head_dim per layer
    assert model.kv_cache_bytes_per_token(4) == 2 * 2 * 32 * 4
    gqa = tiny_model(attention={"kind": "gqa", "kv_heads": 2})
    assert gqa.kv_cache_bytes_per_token(4) == model.kv_cache_bytes_per_token(4) // 2
    n = counts["non_embedding"] + 128 * 32  # the tied head is still a matmul
    assert model.flops_per_token(32) == 6 * n + 2 * 6 * 4 * 32 * (8 + 8)
    # untied, the head is one more vocabulary matrix: N and the FLOPs per token are the same
    untied = tiny_model(vocab_size=97, tie_embeddings=False)
    assert untied.param_counts()["non_embedding"] == counts["non_embedding"]
    assert untied.param_counts()["embedding"] == 2 * 128 * 32
    assert untied.flops_per_token(32) == model.flops_per_token(32)


def test_mtp_heads_leave_the_main_loss_alone_and_log_each_head():
    torch.manual_seed(0)
    base = tiny_model(seed=3)
    mtp = Transformer(tiny_spec(mtp_heads=2, mtp_weight=0.5)).eval()
    mtp.load_state_dict(base.state_dict(), strict=False)  # same trunk; MTP heads are extra
    x = torch.randint(0, 97, (2, 17))
    with torch.no_grad():
        a = base(x[:, :-1], x[:, 1:])
        b = mtp(x[:, :-1], x[:, 1:])
    assert torch.allclose(a.logits, b.logits) and torch.allclose(a.loss, b.metrics["loss/main"])
    assert set(b.metrics) == {"loss/main", "mtp/loss_1", "mtp/loss_2"}
    expected = b.metrics["loss/main"] + 0.5 * (b.metrics["mtp/loss_1"] + b.metrics["mtp/loss_2"]) / 2
    assert torch.allclose(b.loss, expected)
    assert a.metrics == {"loss/main": a.loss}


def test_mtp_head_k_predicts_k_tokens_further():
    """Train only the MTP heads on a sequence where token t+2 = token t + 2 (mod V): the
    first MTP head (predicting t+2) should learn it."""
    torch.manual_seed(0)
    model = Transformer(tiny_spec(mtp_heads=1, mtp_weight=1.0)).train()
    start = torch.randint(0, 97, (8, 1))
    x = (start + torch.arange(33)) % 97
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(80):
        out = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert out.metrics["mtp/loss_1"] < 1.0


def test_impossible_shapes_are_config_errors():
    with pytest.raises(ConfigError, match=r"^attention.kv_heads: 3 does not divide model.n_heads=4$"):
        Transformer(tiny_spec(attention={"kind": "gqa", "kv_heads": 3}))
    with pytest.raises(ConfigError, match=r"^model.n_heads: 5 does not divide model.d_model=32$"):
        tiny_spec(n_heads=5)
    with pytest.raises(ConfigError, match=rf"^ffn.kind: unknown ffn 'relu3'; allowed: {', '.join(FFN.names())}$"):
        tiny_spec(ffn="relu3")
    with pytest.raises(ConfigError, match=r"^attention.window: must be >= 1, got 0$"):
        tiny_spec(attention={"kind": "swa", "window": 0})
    with pytest.raises(ConfigError, match=r"^ffn.top_k: must be in \[1, ffn.n_experts=2\], got 3$"):
        tiny_spec(ffn={"kind": "moe", "n_experts": 2, "top_k": 3})


# RoPE and ALiBi act inside attention (a rotation of q and k, a bias on the scores), so each
# attention kind is compiled with both; the other positions are added to the embeddings, once
# for all kinds: their pairs with the other kinds run in the slow tier (make test-all)
INSIDE_ATTENTION = ("rope", "alibi")
COMPILE_PAIRS = [pytest.param(attn, pos, id=f"{pos}-{attn}",
                              marks=() if pos in INSIDE_ATTENTION or attn == "mha" else pytest.mark.slow)
                 for pos in POSITION.names() for attn in ATTENTION.names()]


@pytest.mark.parametrize("attn, pos", COMPILE_PAIRS)
def test_training_forward_compiles_to_one_graph(attn, pos):
    """torch.compile sees the whole training forward as one graph: no host sync or
    data-dependent branch (a graph break costs throughput on a GPU at every step)."""
    import torch._dynamo
    # one block, as no part's code depends on which layer it is in; the two-block stack once,
    # for what passes between blocks (dynamo's time grows with the blocks it traces: 0.5 s
    # against 0.9 s here for mla, 0.9 against 2.5 s for dsa)
    layers = 2 if (attn, pos) == ("mha", "rope") else 1
    model = tiny_model(attention=ATTN[attn], pos={"kind": pos}, n_layers=layers).train()
    x = torch.randint(0, 97, (2, 32))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, x)
    assert explained.graph_break_count == 0, [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_count == 1


def test_a_window_as_long_as_the_context_is_a_caveat_and_equals_mha():
    """swa with window >= context is the same computation as mha (identical logits), and the
    model says so; a shorter window differs and says nothing."""
    x = torch.randint(0, 97, (2, 32))
    mha = tiny_model(attention={"kind": "mha"})
    full = tiny_model(attention={"kind": "swa", "window": 32})
    short = tiny_model(attention={"kind": "swa", "window": 8})
    assert mha.caveats() == [] and short.caveats() == []
    [caveat] = full.caveats()
    assert caveat.startswith("attention.window=32 >= model.max_seq_len=32") and "exactly what mha does" in caveat
    assert torch.equal(full(x).logits, mha(x).logits) and not torch.allclose(short(x).logits, mha(x).logits)


def test_mla_says_when_its_latent_caches_no_less_than_mha():
    """kv_rank + rope_dim against mha's 2 x d_model values per token and layer."""
    at_64 = tiny_model(attention={"kind": "mla", "kv_rank": 96, "rope_dim": 32}, d_model=64)
    assert at_64.kv_cache_bytes_per_token(2) == tiny_model(attention={"kind": "mha"}, d_model=64).kv_cache_bytes_per_token(2)
    [caveat] = at_64.caveats()
    assert "= 128 values per token and layer, not fewer than mha's 2 x model.d_model = 128" in caveat
    assert tiny_model(attention={"kind": "mla", "kv_rank": 96, "rope_dim": 32}, d_model=128).caveats() == []


def test_a_checkpoint_spec_from_before_the_ffn_group_builds_the_same_model():
    """Checkpoints written when the FFN lived in the model section (``model.ffn``,
    ``model.ffn_hidden``, ``model.moe``) load as the same network."""
    old = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 32, "ffn": "moe", "ffn_hidden": None,
                     "moe": {"n_experts": 4, "top_k": 2, "shared_experts": 1, "expert_hidden": 48, "jitter": 0.0,
                             "balance_coef": 0.01}},
           "attention": {"kind": "mha"}, "norm": {"placement": "pre", "kind": "rmsnorm", "eps": 1e-5},
           "pos": {"kind": "rope", "theta": 10000.0}, "objective": {"kind": "clm"}}
    spec = ModelSpec.from_config(old, vocab_size=97)
    assert spec == tiny_spec(ffn={"kind": "moe", "n_experts": 4, "top_k": 2, "shared_experts": 1, "hidden": 48})
    assert ModelSpec.from_config(spec.to_dict(), vocab_size=97) == spec  # and today's round-trips
    dense = {**old, "model": {**old["model"], "ffn": "gelu", "ffn_hidden": 40}}
    assert ModelSpec.from_config(dense, vocab_size=97).ffn == FFN.get("gelu").Config(hidden=40)


def test_a_section_set_to_null_is_refused_not_replaced_by_a_default():
    """A spec without an ``ffn``, ``norm`` or ``objective`` section (written before they were
    settings) gets what it trained with; one that names the section as null (``ffn=null``, a
    hand-edited checkpoint) is an error naming it, not swiglu, pre-norm or clm in silence."""
    today = tiny_spec().to_dict()
    for key, before in (("ffn", tiny_spec().ffn), ("norm", tiny_spec().norm), ("objective", tiny_spec().objective)):
        older = {k: v for k, v in today.items() if k != key}
        assert getattr(ModelSpec.from_config(older, vocab_size=97), key) == before
        with pytest.raises(ConfigError, match=rf"^{key}: missing; .*allowed: "):
            ModelSpec.from_config({**today, key: None}, vocab_size=97)
