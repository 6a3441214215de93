"""The sampling rules against hand-computed distributions."""

import math

import pytest
import torch

from llmlab.errors import ConfigError
from llmlab.registry import parse_dataclass
from llmlab.sample.generate import SamplingConfig, penalize, seen_tokens, token_probs


def test_min_p_keeps_tokens_near_the_top():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    p = token_probs(logits, SamplingConfig(temperature=1.0, min_p=0.2))  # keep p >= 0.1
    assert torch.allclose(p, torch.tensor([[0.5, 0.3, 0.12, 0.0]]) / 0.92)


def test_repetition_penalty_follows_ctrl():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    seen = seen_tokens(torch.tensor([[0, 1, 1]]), 4)
    assert seen.tolist() == [[True, True, False, False]]
    assert torch.allclose(penalize(logits, seen, 2.0), torch.tensor([[1.0, -2.0, 0.5, 3.0]]))
    p = token_probs(logits, SamplingConfig(temperature=0.5, repetition_penalty=2.0), seen)
    expected = torch.softmax(torch.tensor([1.0, -2.0, 0.5, 3.0]) / 0.5, -1)
    assert torch.allclose(p[0], expected)


@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 1e-8])
def test_a_temperature_near_zero_is_greedy_not_nan(temperature):
    """Logits divided by 1e-40 overflow to inf and their softmax is NaN: the distribution is
    taken from the logits less their maximum, so it ends one-hot on the arg-max (ties share)."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [1.0, 4.0, 4.0, -50.0]])
    p = token_probs(logits, SamplingConfig(temperature=temperature, top_p=0.9, min_p=0.1))
    assert torch.equal(p, torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.5, 0.5, 0.0]]))
    assert torch.multinomial(p, 1).tolist() in ([[3], [1]], [[3], [2]])


def test_a_repetition_penalty_near_zero_or_huge_stays_finite():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    seen = seen_tokens(torch.tensor([[0, 1]]), 4)
    for penalty in (1e-40, 1e39):
        penalized = penalize(logits, seen, penalty)
        assert penalized.isfinite().all()
        p = token_probs(logits, SamplingConfig(temperature=0.7, repetition_penalty=penalty), seen)
        assert p.isfinite().all() and torch.allclose(p.sum(-1), torch.ones(1))
    # a tiny penalty sends a seen positive logit to the top, a huge one a seen negative to the bottom
    assert penalize(logits, seen, 1e-40).argmax().item() == 0
    assert penalize(logits, seen, 1e39)[0, 1] == -torch.finfo(torch.float32).max


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_sampling_from_logits_that_are_not_finite_is_one_line(bad):
    """A model whose weights overflow gives NaN logits: drawing from them was torch's
    RuntimeError ("probability tensor contains either inf, nan..."), now an error that says why."""
    from llmlab.errors import UserError
    from llmlab.sample.generate import next_token
    logits = torch.tensor([[2.0, bad, 0.5, 3.0]])
    with pytest.raises(UserError, match=r"^sampling: the model's next-token logits are not finite"):
        next_token(logits, SamplingConfig(temperature=1.0), None)


def test_filters_compose_and_greedy_is_one_hot():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    p = token_probs(logits, SamplingConfig(temperature=1.0, top_k=3, top_p=0.6))
    assert torch.allclose(p, torch.tensor([[0.4, 0.3, 0.0, 0.0]]) / 0.7)  # top-3, then the nucleus of 0.6
    g = token_probs(logits, SamplingConfig(temperature=0.0, repetition_penalty=3.0), seen_tokens(torch.tensor([[0]]), 4))
    assert g.tolist() == [[0.0, 1.0, 0.0, 0.0]]  # log 0.4 < 0 is multiplied by 3: token 1 becomes the arg-max
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)


@pytest.mark.parametrize("key, value", [("min_p", 1.0), ("min_p", -0.1), ("repetition_penalty", 0.0)])
def test_bad_rules_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        parse_dataclass(SamplingConfig, {key: value}, "")


def test_decoding_on_cuda_keeps_cudnn_attention_out_and_restores_it(monkeypatch):
    """cuDNN's SDPA builds a plan per key length, which decoding changes every step: inside
    ``generate`` on CUDA only flash, memory-efficient and math attention may run; elsewhere,
    and afterwards, the backend flags are as they were. (The flags are process state, so this
    runs without a GPU; the model is on the CPU and only the device it reports is CUDA.)"""
    from llmlab.model.attention import decode_backends
    from llmlab.sample import generate as gen_mod
    from tests.conftest import tiny_model

    flags = torch.backends.cuda
    state = lambda: (flags.cudnn_sdp_enabled(), flags.flash_sdp_enabled(), flags.mem_efficient_sdp_enabled(),
                     flags.math_sdp_enabled())
    before = state()
    assert decode_backends(torch.device("cpu")) is None
    assert "CUDNN_ATTENTION" not in {b.name for b in decode_backends(torch.device("cuda"))}
    seen = []
    model = tiny_model()
    real = gen_mod._generate

    def spy(*args):
        seen.append(state())
        return real(*args)

    monkeypatch.setattr(gen_mod, "_generate", spy)
    x = torch.randint(0, 97, (1, 4))
    cfg = gen_mod.SamplingConfig(max_new_tokens=3, temperature=0.0)
    gen_mod.generate(model, x, cfg)  # on the CPU: nothing changes
    with monkeypatch.context() as m:  # report a CUDA device
        m.setattr(gen_mod, "_model_device", lambda model: torch.device("cuda"))
        gen_mod.generate(model, x, cfg)
    assert seen[0] == before
    assert seen[1] == (False, True, True, True)
    assert state() == before


def _rope_model(seed: int = 0):
    from llmlab.model.config import ModelSpec
    from llmlab.model.transformer import Transformer

    torch.manual_seed(seed)
    cfg = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 16},
           "attention": {"kind": "gqa", "kv_heads": 2}, "pos": {"kind": "rope"}}
    return Transformer(ModelSpec.from_config(cfg, 50))


def test_training_after_decoding_matches_a_model_that_never_decoded():
    """Decoding runs in inference mode and fills RoPE's angle table: the ids it returns and the
    table must serve autograd afterwards (train.prompts samples between steps; distillation
    trains on a teacher's text), with the gradients of a model that never decoded."""
    from llmlab.sample.generate import generate

    decoded, fresh = _rope_model(), _rope_model()
    ids = generate(decoded, torch.tensor([[1, 2, 3]]), SamplingConfig(max_new_tokens=20, temperature=0.0))
    assert not ids.is_inference()
    for model in (decoded, fresh):
        model(ids, ids).loss.backward()
    for (name, a), b in zip(decoded.named_parameters(), fresh.parameters()):
        assert torch.equal(a.grad, b.grad), name


def test_rope_angles_past_the_table_grow_it_and_match_computed_ones():
    """The angle table starts at max_seq_len positions and doubles when a forward reaches past
    it; looked-up angles equal the ones computed for those positions."""
    from llmlab.model.position import rotary_table

    model = _rope_model()
    rope = model.pos
    positions = torch.arange(30, 37)
    rope.check_end(37)
    cos, sin = rope.view(positions).cos_sin(8)
    want_cos, want_sin = rotary_table(positions, 8, rope.cfg.theta)
    assert rope.table.length == 64 and torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    # and the rotation is RoFormer's rotate-half form
    t = torch.randn(1, 2, 7, 8)
    half = torch.cat([-t[..., 4:], t[..., :4]], dim=-1)
    c, s = want_cos, torch.cat([want_sin[:, 4:], want_sin[:, 4:]], dim=-1)  # the unsigned sin
    assert torch.allclose(rope.view(positions).rotate(t), t * c + half * s, atol=1e-6)


@pytest.mark.parametrize("window", [1, 2, 3])
def test_a_window_of_a_few_positions_decodes_past_it(window):
    """A model whose context holds one position (model.max_seq_len=1) refills its cache with
    the newest token at every step, which is what the uncached loop sees too; a window of a
    few positions decodes past its end through its refills."""
    from llmlab.sample.generate import generate
    from tests.conftest import tiny_model

    model = tiny_model(max_seq_len=window)
    prompt = torch.tensor([[5, 7, 11]])
    cfg = SamplingConfig(max_new_tokens=6, temperature=0)
    cached = generate(model, prompt, cfg, use_cache=True, pack=False)
    assert cached.shape == (1, 9) and torch.equal(cached[:, :3], prompt)
    if window == 1:
        assert torch.equal(cached, generate(model, prompt, cfg, use_cache=False, pack=False))
