"""CUDA graph decoding (`llmlab.sample.graphs`): the step a graph records is the ordinary
decoding step's arithmetic over the whole cache, masked past the token's position. Its numbers
and the loop around it are checked here on the CPU (``record=False`` runs the step a replay
runs); recording and replaying on a GPU is checked by ``bench.cuda_check``."""

from __future__ import annotations

import pytest
import torch

from llmlab.sample import generate as gen_mod
from llmlab.sample.generate import SamplingConfig, generate
from llmlab.sample.graphs import GraphedStep, unrecordable, why_not
from llmlab.model.transformer import lean_decoding
from tests.conftest import tiny_model

SHAPES = [
    {"attention": {"kind": "mha"}, "pos": {"kind": "rope"}},
    {"attention": {"kind": "gqa", "kv_heads": 2}, "pos": {"kind": "rope"}, "ffn": "swiglu"},
    {"attention": {"kind": "mqa"}, "pos": {"kind": "learned"}, "norm": {"placement": "post", "kind": "layernorm"}},
    {"attention": {"kind": "mha"}, "pos": {"kind": "sinusoidal"}, "bias": True, "ffn": "gelu"},
    {"attention": {"kind": "gqa", "kv_heads": 2}, "pos": {"kind": "none"}, "parametrization": "mup", "tie_embeddings": False,
     "mup_base_width": 16},
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s['attention']['kind']}-{s['pos']['kind']}")
@torch.inference_mode()
def test_the_recorded_step_gives_the_logits_of_ordinary_decoding(shape):
    model = tiny_model(**shape)
    prompt = torch.tensor([[5, 17, 3, 60, 8], [9, 2, 44, 1, 30]])
    assert why_not(model, model.new_cache(2, 32)) == "not on a CUDA device"
    with lean_decoding(model):
        plain, fixed = model.new_cache(2, 32), model.new_cache(2, 32)
        model(prompt, cache=plain)
        model(prompt, cache=fixed)
        step = GraphedStep(model, fixed, record=False)
        tok = prompt[:, -1:]
        for p in range(5, 20):
            want = model(tok, cache=plain).logits
            got = step.step(tok, fixed.pos)
            assert fixed.pos == plain.pos == p + 1
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            tok = want[:, -1].argmax(-1, keepdim=True)
        # a stale key past the position stays out of sight: write garbage there, and the step
        # at the current position still gives the ordinary logits
        for layer in fixed.layers:
            layer.k[:, :, fixed.pos + 1:] = 1e4
        torch.testing.assert_close(step.step(tok, fixed.pos), model(tok, cache=plain).logits, rtol=1e-5, atol=1e-5)


def test_generate_with_the_step_gives_the_same_tokens_across_a_refill(monkeypatch):
    """Past the context window the loop refills the same cache (the recorded step holds its
    buffers) and goes on: the tokens are those of decoding without graphs."""
    model = tiny_model(attention={"kind": "gqa", "kv_heads": 2})
    made = []

    def unrecorded(model, cache):
        made.append(GraphedStep(model, cache, record=False))
        return made[-1]

    monkeypatch.setattr(gen_mod, "why_not", lambda model, cache: None)
    monkeypatch.setattr(gen_mod, "GraphedStep", unrecorded)
    prompt = torch.tensor([[5, 17, 3, 60, 8]])
    cfg = SamplingConfig(max_new_tokens=70, temperature=0)  # max_seq_len 32: refilled twice
    plain = generate(model, prompt, cfg, graphs=False)
    graphed = generate(model, prompt, cfg, graphs=True)
    assert len(made) == 1
    assert torch.equal(graphed, plain)
    sampled = SamplingConfig(max_new_tokens=40, temperature=0.9, top_k=20)
    a = generate(model, prompt, sampled, generator=torch.Generator().manual_seed(3), graphs=False)
    b = generate(model, prompt, sampled, generator=torch.Generator().manual_seed(3), graphs=True)
    assert torch.equal(a, b)


@pytest.mark.parametrize("shape, reason", [
    ({"attention": {"kind": "swa", "window": 4}}, "SlidingWindowAttention"),
    ({"attention": {"kind": "mla", "kv_rank": 16, "rope_dim": 4, "nope_dim": 4, "v_dim": 8}}, "keeps its own cache"),
    ({"pos": {"kind": "alibi"}}, "pos=alibi biases the attention scores"),
    ({"ffn": {"kind": "moe", "n_experts": 4, "top_k": 2}}, "mixture of experts"),
])
def test_models_whose_step_cannot_be_recorded_say_why(shape, reason):
    model = tiny_model(**shape)
    cache = model.new_cache(1, 8)
    assert why_not(model, cache) == "not on a CUDA device"
    assert reason in unrecordable(model, cache)  # on a GPU, the model's own reason
    assert unrecordable(tiny_model(), tiny_model().new_cache(1, 8)) is None


class _Replayed:
    """A recorded graph whose replay leaves the output as the recording made it."""

    def replay(self) -> None:
        pass


@pytest.mark.parametrize("failure, said", [
    ("raise", "recording the step failed (operation not permitted when stream is capturing); decoded without it"),
    ("differ", "its replay differed from the step it recorded; decoded without it"),
])
def test_a_step_that_cannot_be_recorded_or_replays_wrong_is_said_and_decoding_goes_on(monkeypatch, capsys, failure,
                                                                                       said):
    """Either way, one line says so, and the tokens are those of decoding without graphs."""
    def record(self):
        if failure == "raise":
            raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
        self.graph = _Replayed()
        eager = self._run()
        self.logits = eager + 1.0  # what a replay would give if it went wrong
        return eager

    model = tiny_model(attention={"kind": "gqa", "kv_heads": 2})
    monkeypatch.setattr(gen_mod, "why_not", lambda model, cache: None)
    monkeypatch.setattr(GraphedStep, "_record", record)
    prompt = torch.tensor([[5, 17, 3, 60, 8]])
    cfg = SamplingConfig(max_new_tokens=40, temperature=0)  # past max_seq_len 32: a refill too
    plain = generate(model, prompt, cfg)
    capsys.readouterr()
    assert torch.equal(generate(model, prompt, cfg, graphs=True), plain)
    assert capsys.readouterr().err.strip() == f"CUDA graph decoding: {said}"
