"""Every model preset composes through Hydra, builds, and takes a training step."""


import pytest
import torch
from hydra import initialize_config_dir

from llmlab.cli import register_parts
from llmlab.paths import conf_dir
from llmlab.model.attention import ATTENTION
from llmlab.model.transformer import ModelSpec, Transformer
from tests.helpers import composed

def group_options(group: str) -> list[str]:
    """The options of a config group: YAML files under conf/ and registered Config dataclasses."""
    from hydra.core.global_hydra import GlobalHydra

    register_parts()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


PRESETS = group_options("model")


def test_every_documented_preset_exists():
    """The recipes docs/parts.md names, and ``model=<kind>`` for every attention kind."""
    assert {"tiny", "gpt2", "llama", "bert", "pocket", "deepseek", *ATTENTION.names()} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_takes_a_training_step(preset):
    cfg = composed(f"model={preset}", "model.max_seq_len=32")
    assert cfg["model"]["name"] == preset
    torch.manual_seed(0)
    model = Transformer(ModelSpec.from_config(cfg, vocab_size=300)).train()
    window = torch.randint(0, 300, (2, 33))
    x, y = model.objective.make_batch(window, 300, torch.Generator().manual_seed(0))
    out = model(x, y)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_presets_pick_their_parts_and_the_command_line_wins():
    gpt2 = composed("model=gpt2")
    assert (gpt2["pos"]["kind"], gpt2["norm"]["kind"], gpt2["ffn"]["kind"]) == ("learned", "layernorm", "gelu")
    assert composed("model=gpt2", "pos=rope")["pos"]["kind"] == "rope"
    assert composed("model=bert")["objective"]["kind"] == "mlm"
    llama = composed("model=llama", "attention.kv_heads=4")
    assert llama["attention"] == {"kind": "gqa", "kv_heads": 4} and llama["model"]["tie_embeddings"] is False
    assert composed("model=deepseek", "model/attention=swa")["attention"]["kind"] == "swa"


def test_qknorms_eps_follows_the_blocks_norm_and_a_spec_written_before_keeps_its_own():
    """qknorm's q/k norms take norm.eps (Qwen3, which an export maps them onto, has one eps);
    a spec saved before the setting existed trained with 1e-6 and keeps it."""
    spec = ModelSpec.from_config(composed("model=qknorm"), vocab_size=64)
    assert spec.attention.kind == "qknorm" and spec.attention.eps == spec.norm.eps == 1e-5
    assert ModelSpec.from_config(composed("model=qknorm", "norm.eps=1e-3"), vocab_size=64).attention.eps == 1e-3
    assert ModelSpec.from_config(composed("model=qknorm", "attention.eps=1e-4"), vocab_size=64).attention.eps == 1e-4
    old = {**spec.to_dict(), "attention": {"kind": "qknorm", "kv_heads": 2}}
    model = Transformer(ModelSpec.from_config(old, vocab_size=64))
    assert model.blocks[0].attn.q_norm.eps == model.blocks[0].attn.k_norm.eps == 1e-6
    assert Transformer(spec).blocks[0].attn.q_norm.eps == 1e-5
    # the resolved value is what a checkpoint keeps
    assert ModelSpec.from_config(spec.to_dict(), vocab_size=64).attention.eps == 1e-5
