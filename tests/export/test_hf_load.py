"""transformers directories in: an export read back scores exactly as the model it came from;
a directory transformers itself saved scores as transformers scores it; what llmlab cannot
express, and every damaged or crafted file, is one line naming it."""

import contextlib
import json
import shutil
from pathlib import Path
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from llmlab.data.tokenizer import TOKENIZER
from llmlab.errors import UserError
from llmlab.eval.loss import evaluate_loss
from llmlab.export.hf import FAMILIES, export_hf
from llmlab.export.hf_load import SPECS, WEIGHTS
from llmlab.train.checkpoint import build_model, load_checkpoint
from tests.helpers import EXPORT_CASES as CASES
from tests.helpers import export_checkpoint as checkpoint
from tests.helpers import hf_loss

CPU = torch.device("cpu")


def loss(model, tokens) -> float:
    return evaluate_loss(model, tokens, 32, 4, CPU, contextlib.nullcontext())["loss"]


def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 257, 32 * 4 + 1)


def test_every_exported_family_is_read():
    assert set(SPECS) == set(WEIGHTS) == {f.name for f in FAMILIES}


@pytest.mark.parametrize("case", CASES)
def test_an_export_read_back_scores_as_its_source(tmp_path, case):
    ckpt = checkpoint(tmp_path, *CASES[case][0])
    model = build_model(ckpt, CPU)
    export_hf(ckpt, model, tmp_path / "hf")
    back = load_checkpoint(tmp_path / "hf")
    assert back.spec_file == "config.json" and back.state["eos"] == "<|endoftext|>"
    again = build_model(back, CPU)
    assert abs(loss(again, tokens()) - loss(model, tokens())) < 1e-6
    # same tokenizer, and an export of the import is the export again
    assert back.tokenizer().encode("def f(x): pass") == ckpt.tokenizer().encode("def f(x): pass")
    export_hf(back, again, tmp_path / "hf2")
    first, second = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(str(tmp_path / "hf2" / "model.safetensors"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def saved_by_transformers(tmp_path, family: str, **config):
    """A random model of ``family`` that transformers builds and saves itself, with a byte tokenizer."""
    import transformers

    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
               "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel)}
    config_cls, model_cls = classes[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**config)).eval()
    with torch.no_grad():  # norms away from 1 and biases away from 0, so a swapped one shows
        for name, p in model.named_parameters():
            if "norm" in name or "ln" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    out = tmp_path / family
    model.save_pretrained(out, safe_serialization=True)
    TOKENIZER.build(TOKENIZER.config({"kind": "byte"}, "tokenizer")).make().save(out / "tokenizer.json")
    return out


SMALL = {"llama": dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=64, rope_theta=500.0, rms_norm_eps=1e-5),
         "qwen3": dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=1, head_dim=16, max_position_embeddings=64, tie_word_embeddings=True),
         "gpt2": dict(vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_positions=64)}


@pytest.mark.parametrize("family", SMALL)
def test_a_directory_transformers_saved_scores_as_transformers_scores_it(tmp_path, family):
    directory = saved_by_transformers(tmp_path, family, **SMALL[family])
    ckpt = load_checkpoint(directory)
    ours = loss(build_model(ckpt, CPU), tokens())
    assert abs(ours - hf_loss(directory, tokens(), 32)) < 1e-4
    assert ours < 10  # a real loss, not a failed build's nan


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict:
    """This module's exports, by their overrides, each built once."""
    return {"root": tmp_path_factory.mktemp("exports"), "made": {}}


@pytest.fixture
def exported(exports, tmp_path):
    """``exported(*overrides)``: a copy, in the test's own folder, of the export of a
    checkpoint built once per module for those overrides (each test edits its copy)."""
    def make(*overrides) -> Path:
        made = exports["made"]
        if overrides not in made:
            where = exports["root"] / f"e{len(made)}"
            where.mkdir()
            ckpt = checkpoint(where, *overrides)
            export_hf(ckpt, build_model(ckpt, CPU), where / "hf")
            made[overrides] = where / "hf"
        shutil.copytree(made[overrides], tmp_path / "hf")
        return tmp_path / "hf"
    return make


def edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


REFUSED_CONFIGS = {
    "a family that is no name": ({"model_type": {}}, "model_type is {}; llmlab reads the families it exports"),
    "another family": ({"model_type": "mistral"}, "model_type is 'mistral'; llmlab reads the families it exports: llama, qwen3, gpt2"),
    "scaled rope": ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "rope_parameters.rope_type is 'llama3'"),
    "head_dim": ({"head_dim": 32}, "head_dim=32 is not hidden_size / num_attention_heads = 16"),
    "activation": ({"hidden_act": "gelu"}, "hidden_act is 'gelu'; llmlab reads silu"),
    "biases apart": ({"attention_bias": True}, "attention_bias=True with mlp_bias=False"),
    "a size as text": ({"hidden_size": "64"}, "hidden_size must be an integer of at least 1, got '64'"),
    "a size of zero": ({"num_hidden_layers": 0}, "num_hidden_layers must be an integer of at least 1"),
    "no width": ({"hidden_size": None}, "has no hidden_size"),
    "eps nan": ({"rms_norm_eps": float("nan")}, "rms_norm_eps must be a positive number"),
    "kv heads": ({"num_key_value_heads": 3}, "num_key_value_heads=3 does not divide num_attention_heads=4"),
    "a wider model than its weights": ({"hidden_size": 128, "head_dim": None}, "model.embed_tokens.weight is torch.float32 (320, 64), but "
                                                             "config.json implies a float tensor of shape (320, 128)"),
    "a deeper model than its weights": ({"num_hidden_layers": 3}, "lacks model.layers.2.input_layernorm.weight"),
    "a shallower one": ({"num_hidden_layers": 1}, "holds model.layers.1."),
    "untied without a head": ({"tie_word_embeddings": False}, "lacks lm_head.weight"),
}


@pytest.mark.parametrize("case", REFUSED_CONFIGS)
def test_what_llmlab_cannot_express_or_a_damaged_config_is_one_line(exported, case):
    directory = exported("model=llama", "model.tie_embeddings=true")
    changes, message = REFUSED_CONFIGS[case]
    edit_config(directory, **changes)
    with pytest.raises(UserError, match="^ckpt: ") as e:
        build_model(load_checkpoint(directory), CPU)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_gpt2_settings_it_cannot_express_are_refused(exported):
    directory = exported("model=gpt2")
    edit_config(directory, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(UserError, match="scale_attn_by_inverse_layer_idx=true, which llmlab's model cannot express"):
        load_checkpoint(directory)


def test_a_pickle_only_directory_is_refused_without_loading_it(exported):
    directory = exported("model=llama")
    (directory / "model.safetensors").unlink()
    (directory / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(UserError, match="only as pytorch_model.bin .a pickle.*llmlab loads safetensors only"):
        load_checkpoint(directory)


def test_shards_are_read_and_may_not_name_a_file_outside(exported):
    directory = exported("model=llama")
    single = load_checkpoint(directory)
    weights = load_file(str(directory / "model.safetensors"))
    names = sorted(weights)
    halves = {"model-1.safetensors": names[: len(names) // 2], "model-2.safetensors": names[len(names) // 2:]}
    for shard, keys in halves.items():
        save_file({k: weights[k] for k in keys}, str(directory / shard))
    (directory / "model.safetensors").unlink()
    index = {"weight_map": {k: shard for shard, keys in halves.items() for k in keys}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    sharded = load_checkpoint(directory)
    assert all(torch.equal(sharded.weights[k], single.weights[k]) for k in single.weights)
    index["weight_map"][names[0]] = "../outside.safetensors"
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="shard '../outside.safetensors' is not a .safetensors file name of this directory"):
        load_checkpoint(directory)


def test_a_truncated_weights_file_is_one_line(exported):
    directory = exported("model=llama")
    data = (directory / "model.safetensors").read_bytes()
    (directory / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="model.safetensors is truncated or corrupt"):
        load_checkpoint(directory)


def test_an_integer_tensor_where_a_weight_belongs_is_refused(exported):
    directory = exported("model=llama")
    weights = load_file(str(directory / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"].long()
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(UserError, match="model.norm.weight is torch.int64"):
        load_checkpoint(directory)


def test_the_eos_token_comes_from_the_model_config_when_the_tokenizer_config_has_none(exported):
    directory = exported("model=llama")
    (directory / "tokenizer_config.json").unlink()
    assert load_checkpoint(directory).state["eos"] == "<|endoftext|>"
    edit_config(directory, eos_token_id=None)
    assert load_checkpoint(directory).state["eos"] is None
