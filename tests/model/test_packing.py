"""Weights laid out for CPU decoding (oneDNN's, transposed, split in column or row blocks): the same
numbers as ``F.linear`` for every attention kind, in full and incremental forwards; the layout
"auto" measures fastest on the model itself; swapped back on exit; laid out again when a weight
changes; never while autograd records."""

import functools
import platform

import pytest
import torch
import torch.nn.functional as F
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


def product_of(m: nn.Linear):
    """The product a swapped layer multiplies with: its own, or its group's (`_Joint`)."""
    import llmlab.model.packing as pk
    f = m.forward
    return f.func.product if isinstance(f.func, pk._Joint) else f.args[0]


def weight_of(m: nn.Linear) -> torch.Tensor:
    """The copy of the weights a swapped layer multiplies by: its own, or its group's."""
    import llmlab.model.packing as pk
    f = m.forward
    return f.func.weight if isinstance(f.func, pk._Joint) else f.args[2]


def test_x86_builds_with_onednn_pack():
    """Where "auto" may choose oneDNN's layout (x86-64 with oneDNN), the probe must find its
    ops working: otherwise every oneDNN test here would pass on the other layouts alone."""
    import llmlab.model.packing as pk
    linears = [m for m in tiny_model().modules() if isinstance(m, nn.Linear)]
    if platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available():
        assert packing_supported() and "onednn" in pk._candidates(linears)
    else:  # elsewhere "auto" must not time it
        assert "onednn" not in pk._candidates(linears)


def test_auto_lays_each_model_out_as_its_own_decoding_measured_fastest(monkeypatch):
    """"auto" times the model's decoding step in each candidate layout once per set of layer
    shapes (and thread count), takes the fastest, and leaves a near tie to F.linear; a second
    model of other shapes is timed on its own; true packs every layer in oneDNN's layout."""
    import llmlab.model.packing as pk
    timed = []
    verdicts = {2: {"plain": 1.0, "transposed": 0.9, "split": 0.7}, 1: {"plain": 1.0, "transposed": 0.98}}

    def fake(model, linears, rounds=pk.ROUNDS):
        timed.append(len(model.blocks))
        assert linears == [m for m in model.modules() if isinstance(m, nn.Linear)]
        return verdicts[len(model.blocks)], {}
    monkeypatch.setattr(pk, "_time_layouts", fake)
    monkeypatch.setattr(pk, "_chosen", {})
    target, draft = tiny_model(0), tiny_model(1, n_layers=1)
    with torch.no_grad(), packed_linears(target, draft, enabled="auto") as packed:
        assert packed
        assert {m: product_of(m) for m in swapped(target)} == dict.fromkeys(
            [m for m in target.modules() if isinstance(m, nn.Linear)], pk.LAYOUTS["split"])
        assert not swapped(draft)  # 0.98 of F.linear's time: a tie, no second copy
    assert timed == [2, 1]
    with torch.no_grad(), packed_linears(tiny_model(5), enabled="auto"):  # the same shapes, other weights
        pass
    assert timed == [2, 1]  # remembered: not timed again
    if packing_supported():
        with torch.no_grad(), packed_linears(target, enabled=True):  # true: every layer, oneDNN's
            assert {product_of(m) for m in swapped(target)} == {pk.LAYOUTS["onednn"]}
            assert len(swapped(target)) == sum(isinstance(m, nn.Linear) for m in target.modules())


@pytest.mark.parametrize("attn", KINDS, ids=[k["kind"] for k in KINDS])
def test_the_timing_runs_every_candidate_on_the_model_and_leaves_it_as_it_was(attn):
    """The timing decodes with the model itself, of every attention kind: every candidate
    layout is timed, with a copy of every layer's weight, and the model comes back unswapped,
    in the mode it was in, with the global random state as it was."""
    import llmlab.model.packing as pk
    model = tiny_model(attention=attn, init_std=0.3)
    model.train()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    state = torch.get_rng_state()
    with torch.no_grad():
        times, copies = pk._time_layouts(model, linears, rounds=1)
    assert list(times) == pk._candidates(linears)
    assert {"plain", "transposed"} <= set(times) and all(0 < t < 1 for t in times.values())
    # a copy of every layer's weight: alone, or joined with the layers that read its input
    groups = pk.linear_groups([model])
    assert groups and all(set(c) == set(groups) | (set(linears) - {m for g in groups for m in g})
                          for c in copies.values())
    assert set(copies) == set(times) - {"plain"}
    assert model.training and not swapped(model)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("verdict", ["transposed", "plain"])
def test_decoding_uses_the_copies_the_timing_made_and_keeps_none_for_plain(verdict, monkeypatch):
    import llmlab.model.packing as pk
    real, made = pk._time_layouts, {}

    def forced(model, linears, rounds=pk.ROUNDS):
        times, copies = real(model, linears, rounds=1)
        made.update(copies)
        return {**dict.fromkeys(times, 1.0), verdict: 0.5}, copies
    monkeypatch.setattr(pk, "_time_layouts", forced)
    monkeypatch.setattr(pk, "_chosen", {})
    model = tiny_model(7)
    with torch.no_grad(), packed_linears(model, enabled="auto") as packed:
        assert packed == (verdict != "plain")
        joined = {m: g for g in pk.linear_groups([model]) for m in g}
        assert swapped(model) == [] or any(m in joined for m in swapped(model))
        assert all(weight_of(m) is (made[verdict][joined[m]][0] if m in joined else made[verdict][m])
                   for m in swapped(model))
    assert any(m in pk._packed for m in model.modules()) == (verdict != "plain")


def test_kept_layouts_are_read_as_far_as_they_can_be_and_the_rest_is_said(tmp_path):
    """The file `llmlab sample` keeps its measured layouts in, as a user might have edited it."""
    from llmlab.model.packing import read_layouts
    path = tmp_path / "decode_layouts.json"
    assert read_layouts(path) == ({}, None)  # none yet
    path.write_text('{"a": "split", "b": "fast", "c": 3}')
    known, note = read_layouts(path)
    assert known == {"a": "split"}
    assert str(path) in note and "2 entries not one of plain, onednn, transposed, split, split_k" in note and "'b'" in note
    for text, why in [("{not json", "not JSON"), ("[1, 2]", "not a JSON object")]:
        path.write_text(text)
        known, note = read_layouts(path)
        assert known == {} and note == f"{path}: {why}; each decoding layout is measured again"
    path.write_text('{"a": "plain", "b": "transposed"}')
    assert read_layouts(path) == ({"a": "plain", "b": "transposed"}, None)


def test_a_kept_layout_is_taken_as_it_is_and_a_clean_measurement_is_kept(monkeypatch):
    import llmlab.model.packing as pk
    import llmlab.perf

    def fake(model, linears, rounds=pk.ROUNDS):
        timed.append(model)
        return {"plain": 1.0, "transposed": 0.9, "split": 0.5}, {}
    timed = []
    monkeypatch.setattr(pk, "_time_layouts", fake)
    monkeypatch.setattr(pk, "_chosen", {})
    model = tiny_model(0)
    known = {pk.layout_key(model): "transposed"}  # measured by an earlier run
    with torch.no_grad():
        assert set(pk.chosen_linears([model], "auto", known=known).values()) == {"transposed"}
    assert timed == [] and known == {pk.layout_key(model): "transposed"}
    for load, kept in [(0.9, False), (0.0, True)]:  # under contention the measurement is not kept
        monkeypatch.setattr(pk, "_chosen", {})
        monkeypatch.setattr(llmlab.perf, "other_load", lambda start, end: load)
        other, known = tiny_model(1, n_layers=1), {}
        with torch.no_grad():
            assert set(pk.chosen_linears([other], "auto", known=known).values()) == {"split"}
        assert timed[-1] is other and known == ({pk.layout_key(other): "split"} if kept else {})
    assert pk.layout_key(other) != pk.layout_key(model)  # other shapes, another entry


@pytest.mark.parametrize("threads, out_features, parts", [(1, 96, 1), (2, 96, 2), (3, 64, 2), (4, 97, 1), (16, 96, 8)])
def test_the_split_cuts_a_layer_into_one_block_per_thread_where_they_divide_it(threads, out_features, parts,
                                                                                monkeypatch):
    import llmlab.model.packing as pk
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert pk._split_parts(out_features) == parts


LAYOUTS = ["onednn", "transposed", "split", "split_k"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("attn", KINDS, ids=[k["kind"] for k in KINDS])
def test_packed_forward_matches_plain(attn, layout, monkeypatch):
    """Every layout gives F.linear's numbers, biases included, for one row and for many (the
    split layout cut in two blocks, as on two threads)."""
    import llmlab.model.packing as pk
    if layout == "onednn" and not packing_supported():
        pytest.skip("this torch build has no oneDNN packing")
    monkeypatch.setattr(pk, "model_layout", lambda model, known=None: layout)
    monkeypatch.setattr(pk, "_split_parts", lambda out_features: 2 if out_features % 2 == 0 else 1)
    model = tiny_model(attention=attn, bias=True, init_std=0.3)
    x = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        for m in model.modules():  # biases start at zero: make them count
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.normal_(0, 0.3)
        ref = model(x).logits
        with packed_linears(model, enabled="auto" if layout != "onednn" else True) as packed:
            assert packed
            # every Linear, the (tied) LM head included
            assert {product_of(m) for m in swapped(model)} == {pk.LAYOUTS[layout]}
            assert len(swapped(model)) == sum(isinstance(m, nn.Linear) for m in model.modules())
            if layout in ("split", "split_k"):
                assert any(weight_of(m).dim() == 3 and weight_of(m).shape[0] == 2 for m in swapped(model))
            # a SwiGLU's gate and up projections as one product, where the kind has them
            assert any(isinstance(m.forward.func, pk._Joint) for m in swapped(model)) == bool(pk.linear_groups([model]))
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
        model.blocks[1].ffn.up_proj.weight.add_(0.1)  # one member of a joint product (gate and up)
        ref = model(x).logits
        with packed_linears(model, enabled=True):
            after = model(x).logits
    assert not torch.allclose(before, ref, atol=1e-3)
    torch.testing.assert_close(after, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layers_of_one_input_share_a_product_and_each_gets_its_own_part(layout, monkeypatch):
    """A SwiGLU's gate and up projections read one input: the first called multiplies by
    both weights at once and the other takes its part, in either order. Called with another
    input, or a second time, a member computes afresh: never a part made for another input."""
    import llmlab.model.packing as pk
    if layout == "onednn" and not packing_supported():
        pytest.skip("this torch build has no oneDNN packing")
    monkeypatch.setattr(pk, "_split_parts", lambda out_features: 2 if out_features % 2 == 0 else 1)
    torch.manual_seed(0)
    gate, up = nn.Linear(16, 24, bias=True), nn.Linear(16, 24, bias=True)
    x, z = torch.randn(3, 16), torch.randn(3, 16)

    def ref(m, t):
        return F.linear(t, m.weight, m.bias)
    with torch.no_grad():
        for parts in [p for p in (1, 2, 3, 4) if layout != "split_k" or 16 % p == 0]:  # blocks that cut across the members, or not
            monkeypatch.setattr(pk, "_split_parts", lambda out_features: parts)
            if layout != "onednn":  # written from the members: what the stacked weight's copy holds
                assert torch.equal(pk._joint_copy((gate, up), layout)[0],
                                   pk._layout_copy(torch.cat([gate.weight, up.weight]), layout))
        monkeypatch.setattr(pk, "_split_parts", lambda out_features: 2 if out_features % 2 == 0 else 1)
        joint = pk._Joint((gate, up), pk.LAYOUTS[layout], *pk.joint_weight((gate, up), layout))
        calls = [(0, x), (1, x),  # in order
                 (1, z), (0, z),  # the other order
                 (0, x), (0, x), (1, x),  # one member twice: the second computes again
                 (0, z), (1, x),  # another input: the part made for z is not x's
                 (0, x)]  # the part made with x's last call
        for i, t in calls:
            torch.testing.assert_close(joint(i, t), ref((gate, up)[i], t), rtol=1e-5, atol=1e-6)
        assert joint.input is None  # nothing held once every part was taken


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


def test_the_probe_keeps_one_copy_for_the_transposed_and_split_k_layouts(monkeypatch):
    """split_k's copy is the transposed copy seen in row blocks: the probe that times every
    layout holds it once, and the view multiplies to F.linear's numbers."""
    import llmlab.model.packing as pk
    monkeypatch.setattr(pk, "_split_parts", lambda features: 2 if features % 2 == 0 else 1)
    model = tiny_model(ffn="swiglu", init_std=0.3)
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    _, copies = pk._time_layouts(model, linears, rounds=1)
    assert {"transposed", "split_k"} <= set(copies)
    for key, copy in copies["split_k"].items():
        flat = copies["transposed"][key]
        blocks, plain = (copy[0], flat[0]) if isinstance(key, tuple) else (copy, flat)
        assert blocks.dim() == 3 and blocks.shape[0] == 2 and blocks.data_ptr() == plain.data_ptr()
    alone = [m for m in linears if m in copies["split_k"]]
    assert alone
    for m in alone:
        x = torch.randn(3, m.in_features)
        torch.testing.assert_close(pk._split_k_linear(x, copies["split_k"][m], m.bias), F.linear(x, m.weight, m.bias),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("attn", KINDS, ids=[k["kind"] for k in KINDS])
def test_under_cpu_autocast_each_layer_keeps_one_copy_in_its_dtype_and_gives_autocasts_numbers(attn, dtype):
    """Under CPU autocast every layer multiplies by a copy of its weight and bias in
    autocast's dtype, made once: bit for bit what autocast's cast at every call gives, in a
    prefill and in steps of one token; outside autocast, inside the same context, the layer's
    own fp32 product; swapped back on exit."""
    import llmlab.model.packing as pk
    model = tiny_model(attention=attn, bias=True, init_std=0.3)
    x = torch.randint(0, 97, (2, 12))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]

    def steps():
        cache = model.new_cache(2)
        return torch.cat([model(x[:, a:b], cache=cache).logits for a, b in [(0, 7), (7, 8), (8, 9), (9, 12)]], 1)
    with torch.inference_mode():
        for m in linears:  # biases start at zero: make them count
            if m.bias is not None:
                m.bias.normal_(0, 0.3)
        plain = model(x).logits
        with torch.autocast("cpu", dtype=dtype):
            ref_full, ref_steps = model(x).logits, steps()
            with packed_linears(model) as packed:
                assert packed and len(swapped(model)) == len(linears)
                assert {m.forward.func for m in swapped(model)} == {pk._cast_forward}
                assert all(weight_of(m).dtype == dtype and torch.equal(weight_of(m), m.weight.to(dtype))
                           for m in swapped(model))
                full, cached = model(x).logits, steps()
                with torch.autocast("cpu", enabled=False):
                    unswapped = model(x).logits
    assert ref_full.dtype == dtype and torch.equal(full, ref_full) and torch.equal(cached, ref_steps)
    assert unswapped.dtype == torch.float32 and torch.equal(unswapped, plain)
    assert not swapped(model)


def test_autocast_copies_are_made_again_when_a_weight_or_bias_changes_and_never_while_training():
    from llmlab.model.packing import cast_dtype

    model = tiny_model(bias=True, init_std=0.3)
    x = torch.randint(0, 97, (1, 6))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        with packed_linears(model):
            before = model(x).logits
        model.lm_head.weight.mul_(0.5)  # in place, as an optimizer step would (tied to the embedding)
        model.blocks[0].ffn.down_proj.bias.add_(0.25)
        ref = model(x).logits
        with packed_linears(model):
            after = model(x).logits
        with packed_linears(model, enabled=False) as packed:
            assert not packed and not swapped(model)
    assert not torch.equal(before, ref) and torch.equal(after, ref)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # grad mode on: training
        assert cast_dtype([model]) is None
        with packed_linears(model) as packed:
            assert not packed and not swapped(model)
    with torch.no_grad():  # no autocast: fp32 decoding, where the layouts are timed instead
        assert cast_dtype([model]) is None
