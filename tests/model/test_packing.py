"""Prepacked CPU weights: the same numbers as ``F.linear`` for every attention kind, in full and
incremental forwards; swapped back on exit; packed again when a weight changes; never while
autograd records."""

import functools
import platform

import pytest
import torch
from torch import nn

from llmlab.errors import ConfigError
from llmlab.model.attention import ATTENTION
from llmlab.model.packing import check_pack, packed_linears, packing_supported
from llmlab.sample.generate import SamplingConfig, generate
from llmlab.sample.speculative import speculative_generate
from tests.conftest import test_configs, tiny_model

KINDS = test_configs(ATTENTION)


def swapped(model) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m.__dict__.get("forward"), functools.partial)]


def test_x86_builds_with_onednn_pack():
    """Where "auto" packs (x86-64 with oneDNN), the probe must find the ops working: otherwise
    every other test here would pass on the unpacked path alone."""
    if platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available():
        assert packing_supported()
    else:  # elsewhere "auto" must fall back, whatever the probe says
        with torch.no_grad(), packed_linears(tiny_model(), enabled="auto") as packed:
            assert not packed


@pytest.mark.skipif(not packing_supported(), reason="this torch build has no oneDNN packing")
def test_auto_packs_the_layers_whose_shape_measured_faster(monkeypatch):
    """"auto" packs a layer only where the timing of its shape says the packed product is
    clearly faster (here: the 96-wide q/k/v projections only), times each shape once, and a
    tie goes to F.linear."""
    import llmlab.model.packing as pk
    timed = []

    def fake(out_features, in_features, bias):
        timed.append((out_features, in_features))
        if out_features == 96:  # clearly faster
            return 1.0, 0.5
        return 1.0, 0.95  # within noise: not worth a second copy
    monkeypatch.setattr(pk, "_time_one_row", fake)
    monkeypatch.setattr(pk, "_pays", {})
    model = tiny_model()
    with torch.no_grad(), packed_linears(model, enabled="auto") as packed:
        assert packed
        chosen = {(m.out_features, m.in_features) for m in swapped(model)}
    assert chosen == {(96, 32)}
    assert sorted(timed) == sorted({(m.out_features, m.in_features) for m in model.modules()
                                    if isinstance(m, nn.Linear)})  # once per shape
    with torch.no_grad(), packed_linears(model, enabled="auto"):
        pass
    assert len(timed) == len(set(timed))  # remembered: not timed again
    with torch.no_grad(), packed_linears(model, enabled=True):  # true: every layer
        assert len(swapped(model)) == sum(isinstance(m, nn.Linear) for m in model.modules())


@pytest.mark.skipif(not packing_supported(), reason="this torch build has no oneDNN packing")
def test_the_timing_runs_both_products():
    import llmlab.model.packing as pk
    plain, packed = pk._time_one_row(48, 32, True, samples=3)
    assert 0 < plain < 1 and 0 < packed < 1


@pytest.mark.parametrize("attn", KINDS, ids=[k["kind"] for k in KINDS])
def test_packed_forward_matches_plain(attn):
    model = tiny_model(attention=attn, bias=True, init_std=0.3)
    x = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        for m in model.modules():  # biases start at zero: make them count
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.normal_(0, 0.3)
        ref = model(x).logits
        with packed_linears(model, enabled=True) as packed:
            assert packed == packing_supported()
            if packed:  # every Linear, the (tied) LM head included
                assert len(swapped(model)) == sum(isinstance(m, nn.Linear) for m in model.modules())
            full = model(x).logits
            cache = model.new_cache(2)  # a prefill of 7, then rows of 1 and 4: decode and verify shapes
            steps = [model(x[:, a:b], cache=cache).logits for a, b in [(0, 7), (7, 8), (8, 12)]]
    torch.testing.assert_close(full, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.cat(steps, 1), ref, rtol=1e-4, atol=1e-5)
    assert not swapped(model)  # restored on exit


def test_weights_changed_after_packing_are_packed_again():
    model = tiny_model(init_std=0.3)
    x = torch.randint(0, 97, (1, 6))
    with torch.no_grad():
        with packed_linears(model, enabled=True):
            before = model(x).logits
        model.lm_head.weight.mul_(0.5)  # in place, as an optimizer step would (tied to the embedding)
        model.blocks[0].ffn.down_proj.weight.add_(0.1)
        ref = model(x).logits
        with packed_linears(model, enabled=True):
            after = model(x).logits
    assert not torch.allclose(before, ref, atol=1e-3)
    torch.testing.assert_close(after, ref, rtol=1e-4, atol=1e-5)


def test_never_packs_while_autograd_records_or_when_off():
    model = tiny_model()
    with packed_linears(model, enabled=True) as packed:  # grad mode on: training
        assert not packed and not swapped(model)
        model(torch.randint(0, 97, (1, 4)), torch.randint(0, 97, (1, 4))).loss.backward()
    assert model.lm_head.weight.grad is not None
    with torch.no_grad(), packed_linears(model, enabled=False) as packed:
        assert not packed and not swapped(model)


def test_generation_gives_the_same_tokens_packed_or_not():
    target = tiny_model(0, init_std=0.3)
    draft = tiny_model(1, n_layers=1, init_std=0.3)
    cfg = SamplingConfig(max_new_tokens=40, temperature=0.0)  # past the 32-token window: refills too
    prompt = torch.tensor([[3, 5, 7], [2, 4, 6]])
    outs = {pack: generate(target, prompt, cfg, pack=pack) for pack in (True, False)}
    assert torch.equal(outs[True], outs[False])
    specs = {pack: speculative_generate(target, [3, 5, 7], cfg, 4, draft, pack=pack)[0] for pack in (True, False)}
    assert specs[True] == specs[False] == outs[False][0].tolist()
    assert not swapped(target) and not swapped(draft)


@pytest.mark.parametrize("value", ["maybe", 1, 0.5, None])
def test_bad_pack_setting_names_the_key(value):
    with pytest.raises(ConfigError, match=r"pack_weights: must be one of auto, true, false"):
        check_pack(value)


def test_generation_from_a_training_model_keeps_no_packed_copies():
    """Sampling during training packs, then drops the copies (the next step changes the
    weights); a model in eval mode keeps them for the next call."""
    from llmlab.model.packing import _packed

    model = tiny_model()
    prompt, cfg = torch.tensor([[1, 2]]), SamplingConfig(max_new_tokens=3, temperature=0.0)
    model.train()
    generate(model, prompt, cfg, pack=True)
    assert model.training and not any(m in _packed for m in model.modules())
    model.eval()
    generate(model, prompt, cfg, pack=True)
    assert any(m in _packed for m in model.modules()) == packing_supported()


def test_sharded_parameters_are_not_packed(tmp_path):
    """FSDP2 keeps parameters as sharded DTensors between forwards; oneDNN cannot lay those out,
    so sampling a sharded model (the end-of-training sample under data_parallel=fsdp) decodes
    unpacked, with the same tokens."""
    import torch.distributed as tdist
    from torch.distributed.fsdp import fully_shard

    store = tdist.FileStore(str(tmp_path / "store"), 1)
    tdist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = tiny_model(init_std=0.3)
        x = torch.randint(0, 97, (1, 5))
        cfg = SamplingConfig(max_new_tokens=6, temperature=0.0)
        with torch.no_grad():
            ref = generate(model, x, cfg, pack=False)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        assert any(type(p.detach()) is not torch.Tensor for p in model.parameters())
        with torch.no_grad():
            with packed_linears(model, enabled=True) as packed:
                assert not packed
            out = generate(model, x, cfg, pack=True)
        assert torch.equal(out, ref)
    finally:
        tdist.destroy_process_group()
