"""The llama and gpt2 presets against Hugging Face `transformers` implementations, with the
same weights: logits agree to 1e-4. (Parity tests, not an export feature.)"""

import pytest
import torch

from llmlab.model.transformer import Transformer
from tests.helpers import composed


def build(preset: str, ffn: str | None = None, **model) -> Transformer:
    cfg = composed(f"model={preset}", *[f"model.{k}={v}" for k, v in model.items()], *([f"model/ffn={ffn}"] if ffn else []))
    from llmlab.model.transformer import ModelSpec
    torch.manual_seed(0)
    m = Transformer(ModelSpec.from_config(cfg, vocab_size=500)).eval()
    with torch.no_grad():  # non-trivial norms and biases, so their mapping is tested too
        for name, p in m.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return m


def test_llama_preset_matches_llama_for_causal_lm():
    import transformers  # a test dependency (pip install -e ".[test]"), loaded where used, not at collection
    ours = build("llama", d_model=64, n_layers=2, n_heads=4, max_seq_len=64)
    s = ours.spec
    cfg = transformers.LlamaConfig(
        vocab_size=ours.padded_vocab, hidden_size=64, intermediate_size=ours.blocks[0].ffn.up_proj.out_features,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=ours.blocks[0].attn.kv_heads,
        max_position_embeddings=64, rms_norm_eps=s.norm.eps, rope_theta=s.pos.theta, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, hidden_act="silu")
    ref = transformers.LlamaForCausalLM(cfg).eval()
    sd = {"model.embed_tokens.weight": ours.embed.weight, "model.norm.weight": ours.norm.weight,
          "lm_head.weight": ours.lm_head.weight}
    for i, blk in enumerate(ours.blocks):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = blk.attn_norm.weight
        sd[p + "post_attention_layernorm.weight"] = blk.ffn_norm.weight
        q, k, v = blk.attn.qkv_proj.weight.split(blk.attn.qkv_sizes())
        sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"], sd[p + "self_attn.v_proj.weight"] = q, k, v
        sd[p + "self_attn.o_proj.weight"] = blk.attn.o_proj.weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[p + f"mlp.{name}.weight"] = getattr(blk.ffn, name).weight
    missing, unexpected = ref.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    x = torch.randint(0, 500, (2, 40))
    with torch.no_grad():
        assert torch.allclose(ours(x).logits, ref(x).logits, atol=1e-4)


@pytest.mark.parametrize("ffn, activation", [("gelu", "gelu"), ("gelu_tanh", "gelu_new")])
def test_gpt2_preset_matches_gpt2_lm_head_model(ffn, activation):
    import transformers
    ours = build("gpt2", d_model=64, n_layers=2, n_heads=4, max_seq_len=64, ffn=ffn)
    cfg = transformers.GPT2Config(
        vocab_size=ours.padded_vocab, n_positions=64, n_embd=64, n_layer=2, n_head=4,
        activation_function=activation, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=ours.spec.norm.eps, tie_word_embeddings=True)
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    sd = {"transformer.wte.weight": ours.embed.weight, "transformer.wpe.weight": ours.pos.table.weight,
          "transformer.ln_f.weight": ours.norm.weight, "transformer.ln_f.bias": ours.norm.bias}
    for i, blk in enumerate(ours.blocks):
        p, a = f"transformer.h.{i}.", blk.attn
        # GPT-2's Conv1D stores (in, out): transposes of nn.Linear weights; q, k, v are fused
        sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"] = a.qkv_proj.weight.T, a.qkv_proj.bias
        sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = a.o_proj.weight.T, a.o_proj.bias
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = blk.attn_norm.weight, blk.attn_norm.bias
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = blk.ffn_norm.weight, blk.ffn_norm.bias
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = blk.ffn.up_proj.weight.T, blk.ffn.up_proj.bias
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = blk.ffn.down_proj.weight.T, blk.ffn.down_proj.bias
    missing, unexpected = ref.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"} | {k for k in missing if k.endswith("attn.bias")}
    x = torch.randint(0, 500, (2, 40))
    with torch.no_grad():
        assert torch.allclose(ours(x).logits, ref(x).logits, atol=1e-4)
