"""Export to a Hugging Face `transformers` directory (``llmlab export format=hf``).

Three families map one to one onto `transformers` classes:
- llama: RoPE, RMSNorm, SwiGLU, pre-norm, MHA/GQA/MQA, tied or not -> ``LlamaForCausalLM``;
- qwen3: the same with qknorm attention (per-head q/k RMSNorm before RoPE) -> ``Qwen3ForCausalLM``;
- gpt2: learned positions, LayerNorm, GELU, pre-norm, MHA -> ``GPT2LMHeadModel``.

Each family lists what it needs; a model that fits neither is refused with the reasons. The
directory holds config.json, model.safetensors (transformers' names) and the tokenizer
(tokenizer.json + tokenizer_config.json), so ``AutoModelForCausalLM.from_pretrained(dir)`` and
``AutoTokenizer.from_pretrained(dir)`` load it with no network.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from llmlab.errors import UserError
from llmlab.files import link_out, owned_tmp_dir, replace_dir
from llmlab.model.ffn import FFN


class Family:
    name = ""
    architecture = ""

    def objections(self, spec, model) -> list[str]:
        """Why this model is not of the family; empty when it is."""
        raise NotImplementedError

    def config(self, spec, model, eos_id: int | None) -> dict:
        raise NotImplementedError

    def weights(self, model) -> dict[str, torch.Tensor]:
        raise NotImplementedError


def _common_objections(spec, model, attention_kinds: tuple[str, ...]) -> list[str]:
    out = []
    if spec.objective.kind != "clm":
        out.append(f"objective={spec.objective.kind} is not a causal LM")
    if spec.norm.placement != "pre":
        out.append(f"norm.placement={spec.norm.placement} (transformers' decoders are pre-norm)")
    kind = spec.attention.kind
    if kind == "swa" and spec.attention.window >= spec.model.max_seq_len:
        pass  # a window as long as the context is full causal attention
    elif kind not in attention_kinds:
        why = {"mla": "MLA has no DeepSeek-compatible layout here (its own latent norm and rotary split)",
               "swa": f"a sliding window of {getattr(spec.attention, 'window', '?')} < max_seq_len="
                      f"{spec.model.max_seq_len}, which this config cannot express"}.get(kind, f"attention={kind}")
        out.append(why)
    if FFN.get(spec.ffn.kind).sparse:
        out.append(f"model/ffn={spec.ffn.kind} (mixture of experts)")
    if getattr(model, "width_mult", 1.0) != 1.0:
        out.append(f"model.parametrization=mup at d_model={spec.model.d_model} != mup_base_width={spec.model.mup_base_width} "
                   "(its logit and attention-score multipliers have no field there)")
    return out


class Llama(Family):
    name, architecture = "llama", "LlamaForCausalLM"
    attention_kinds = ("mha", "gqa", "mqa")

    def objections(self, spec, model):
        out = _common_objections(spec, model, self.attention_kinds)
        if spec.pos.kind != "rope":
            out.append(f"pos={spec.pos.kind} (needs rope)")
        if spec.norm.kind != "rmsnorm":
            out.append(f"norm.kind={spec.norm.kind} (needs rmsnorm)")
        if spec.ffn.kind != "swiglu" and not FFN.get(spec.ffn.kind).sparse:
            out.append(f"model/ffn={spec.ffn.kind} (needs swiglu)")
        return out

    def config(self, spec, model, eos_id):
        attn, m = model.blocks[0].attn, spec.model
        return {
            "architectures": [self.architecture], "model_type": "llama",
            "vocab_size": model.padded_vocab, "hidden_size": m.d_model,
            "intermediate_size": model.blocks[0].ffn.up_proj.out_features,
            "num_hidden_layers": m.n_layers, "num_attention_heads": m.n_heads,
            "num_key_value_heads": attn.kv_heads, "head_dim": attn.head_dim,
            "max_position_embeddings": m.max_seq_len, "rms_norm_eps": spec.norm.eps,
            "rope_theta": spec.pos.theta, "rope_parameters": {"rope_type": "default", "rope_theta": spec.pos.theta},
            "hidden_act": "silu", "attention_bias": m.bias, "mlp_bias": m.bias,
            "tie_word_embeddings": m.tie_embeddings, "initializer_range": m.init_std,
            "bos_token_id": eos_id, "eos_token_id": eos_id, "torch_dtype": "float32", "use_cache": True,
        }

    def weights(self, model):
        sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm.weight}
        if not model.spec.model.tie_embeddings:
            sd["lm_head.weight"] = model.lm_head.weight
        for i, blk in enumerate(model.blocks):
            p, a = f"model.layers.{i}.", blk.attn
            sd[p + "input_layernorm.weight"] = blk.attn_norm.weight
            sd[p + "post_attention_layernorm.weight"] = blk.ffn_norm.weight
            for name, w in zip(("q_proj", "k_proj", "v_proj"), a.qkv_proj.weight.split(a.qkv_sizes())):
                sd[p + f"self_attn.{name}.weight"] = w
            if a.qkv_proj.bias is not None:
                for name, b in zip(("q_proj", "k_proj", "v_proj"), a.qkv_proj.bias.split(a.qkv_sizes())):
                    sd[p + f"self_attn.{name}.bias"] = b
            sd[p + "self_attn.o_proj.weight"] = a.o_proj.weight
            if a.o_proj.bias is not None:
                sd[p + "self_attn.o_proj.bias"] = a.o_proj.bias
            for name in ("gate_proj", "up_proj", "down_proj"):
                lin = getattr(blk.ffn, name)
                sd[p + f"mlp.{name}.weight"] = lin.weight
                if lin.bias is not None:
                    sd[p + f"mlp.{name}.bias"] = lin.bias
        return sd


class Qwen3(Llama):
    """Llama's layout with RMS-normalised queries and keys per head before RoPE (llmlab's
    qknorm). transformers' Qwen3 has one epsilon for every norm and no MLP biases."""
    name, architecture = "qwen3", "Qwen3ForCausalLM"
    attention_kinds = ("qknorm",)

    def objections(self, spec, model):
        out = super().objections(spec, model)
        if spec.attention.kind == "qknorm" and spec.attention.eps != spec.norm.eps:
            out.append(f"the q/k norms' eps {spec.attention.eps:g} != norm.eps={spec.norm.eps:g} (Qwen3 has one eps)")
        if spec.model.bias:
            out.append("model.bias=true (Qwen3's MLP has no biases)")
        return out

    def config(self, spec, model, eos_id):
        config = super().config(spec, model, eos_id)
        config.update({"architectures": [self.architecture], "model_type": "qwen3", "use_sliding_window": False,
                       "layer_types": ["full_attention"] * spec.model.n_layers})
        config.pop("mlp_bias")
        return config

    def weights(self, model):
        sd = super().weights(model)
        for i, blk in enumerate(model.blocks):
            sd[f"model.layers.{i}.self_attn.q_norm.weight"] = blk.attn.q_norm.weight
            sd[f"model.layers.{i}.self_attn.k_norm.weight"] = blk.attn.k_norm.weight
        return sd


class GPT2(Family):
    name, architecture = "gpt2", "GPT2LMHeadModel"
    ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}

    def objections(self, spec, model):
        out = _common_objections(spec, model, ("mha",))
        if spec.pos.kind != "learned":
            out.append(f"pos={spec.pos.kind} (needs learned)")
        if spec.norm.kind != "layernorm":
            out.append(f"norm.kind={spec.norm.kind} (needs layernorm)")
        if spec.ffn.kind not in self.ACTIVATIONS and not FFN.get(spec.ffn.kind).sparse:
            out.append(f"model/ffn={spec.ffn.kind} (needs gelu or gelu_tanh)")
        return out

    def config(self, spec, model, eos_id):
        m = spec.model
        return {
            "architectures": [self.architecture], "model_type": "gpt2",
            "vocab_size": model.padded_vocab, "n_positions": m.max_seq_len, "n_embd": m.d_model,
            "n_layer": m.n_layers, "n_head": m.n_heads, "n_inner": model.blocks[0].ffn.up_proj.out_features,
            "activation_function": self.ACTIVATIONS[spec.ffn.kind], "layer_norm_epsilon": spec.norm.eps,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": m.init_std,
            "scale_attn_weights": True, "tie_word_embeddings": m.tie_embeddings,
            "bos_token_id": eos_id, "eos_token_id": eos_id, "torch_dtype": "float32", "use_cache": True,
        }

    def weights(self, model):
        def bias(lin):  # GPT-2 always has biases; a bias-free model exports zeros
            return lin.bias if lin.bias is not None else torch.zeros(lin.out_features)

        sd = {"transformer.wte.weight": model.embed.weight, "transformer.wpe.weight": model.pos.table.weight,
              "transformer.ln_f.weight": model.norm.weight, "transformer.ln_f.bias": model.norm.bias}
        if not model.spec.model.tie_embeddings:
            sd["lm_head.weight"] = model.lm_head.weight
        for i, blk in enumerate(model.blocks):
            p, a = f"transformer.h.{i}.", blk.attn
            # GPT-2's Conv1D stores (in, out), the transpose of nn.Linear; q, k, v stay fused
            sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"] = a.qkv_proj.weight.T, bias(a.qkv_proj)
            sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = a.o_proj.weight.T, bias(a.o_proj)
            sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = blk.attn_norm.weight, blk.attn_norm.bias
            sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = blk.ffn_norm.weight, blk.ffn_norm.bias
            sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = blk.ffn.up_proj.weight.T, bias(blk.ffn.up_proj)
            sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = blk.ffn.down_proj.weight.T, bias(blk.ffn.down_proj)
        return sd


FAMILIES = (Llama(), Qwen3(), GPT2())


def pick_family(spec, model) -> Family:
    """The family that fits, or a one-line refusal with each family's reasons."""
    if spec.model.logit_softcap is not None:  # none of the three caps its logits
        raise UserError(f"export: transformers' {', '.join(f.name for f in FAMILIES)} have no logit soft-cap, and this "
                        f"model caps its logits (model.logit_softcap={spec.model.logit_softcap:g})")
    reasons = {}
    for family in FAMILIES:
        why = family.objections(spec, model)
        if not why:
            return family
        reasons[family.name] = why
    detail = "; ".join(f"as {name}: {', '.join(why)}" for name, why in reasons.items())
    raise UserError(f"export: transformers cannot represent this model ({detail})")


# what `export_hf` writes: overwrite=true replaces a directory of these files and nothing else
EXPORT_FILES = frozenset({"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                          "tokenizer_config.json", "special_tokens_map.json"})


def check_out(out: Path, ckpt: Path, overwrite: bool) -> None:
    """``out`` may be new, empty, or (with overwrite) an earlier export. Replacing it deletes
    what it holds, so a directory with anything an export does not write (the checkpoint
    itself, a run, a user's notes) is refused whatever overwrite says."""
    target = link_out(out)
    if target is not None:  # the export would replace the link, and an overwrite would read the folder it leads to
        raise UserError(f"out: {out} is a link out of its folder (to {target}); llmlab does not write through links: "
                        "choose another out=")
    if not out.is_dir() or not any(out.iterdir()):
        return  # new or empty (a file in the way is the writer's one line)
    if not overwrite:
        raise UserError(f"out: {out} exists and is not empty; choose another out= or pass overwrite=true")
    if ckpt.resolve().is_relative_to(out.resolve()):
        raise UserError(f"out: {out} holds the checkpoint being exported ({ckpt}); overwrite=true would delete it; "
                        "choose another out=")
    foreign = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir()
                     if p.name not in EXPORT_FILES or not p.is_file())
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise UserError(f"out: {out} is not an earlier export (it holds {shown}); overwrite=true replaces only "
                        "an export's own files; choose another out=")


def export_hf(ckpt, model, out: Path, overwrite: bool = False) -> dict:
    """Write the transformers directory for ``model`` (built from ``ckpt``) to ``out``,
    atomically: a temporary directory renamed into place."""
    spec = model.spec
    family = pick_family(spec, model)
    out = Path(out)
    check_out(out, Path(ckpt.path), overwrite)
    tok = ckpt.tokenizer()
    config = family.config(spec, model, tok.eos_id)
    weights = {k: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in family.weights(model).items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = owned_tmp_dir(out.parent, out.name)
    try:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        if tok.eos_id is not None:
            (tmp / "generation_config.json").write_text(json.dumps(
                {"bos_token_id": tok.eos_id, "eos_token_id": tok.eos_id}, indent=2))
        shutil.copyfile(ckpt.tokenizer_path, tmp / "tokenizer.json")
        special = {"eos_token": tok.eos, "bos_token": tok.eos, "unk_token": tok.eos} if tok.eos else {}
        (tmp / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": spec.model.max_seq_len,
             "clean_up_tokenization_spaces": False, "add_bos_token": False, **special}, indent=2))
        (tmp / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    notes = []
    if len(model.mtp):
        notes.append(f"the {len(model.mtp)} MTP heads are training aids and are left out")
    return {"family": family.name, "architecture": family.architecture, "out": str(out),
            "params": sum(v.numel() for v in weights.values()), "notes": notes}
