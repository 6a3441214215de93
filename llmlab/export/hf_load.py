"""Read a Hugging Face `transformers` directory of the families `llmlab.export.hf` writes
(llama, qwen3, gpt2) as an llmlab model: ``eval ckpt=<dir>``, ``sample ckpt=<dir>`` and
``train init=<dir>``.

Nothing in the directory runs: config.json is read as JSON and each field it uses is checked
(type and range) before anything is built; weights come only from safetensors files
(model.safetensors, or the shards model.safetensors.index.json names inside the directory);
a directory with only a pickle (pytorch_model.bin) is refused. The architecture is mapped
onto llmlab's parts field by field, and what llmlab cannot express (another rotary scaling,
a head width other than hidden_size / heads, sliding windows) is refused in one line that
names the field, so a model is never scored as something it is not.

The weights are renamed (and, for GPT-2's Conv1D, transposed; q, k and v concatenated) into
llmlab's names, every tensor checked against the shape config.json implies. The only tensors
left out are buffers transformers derives itself and some files still carry: GPT-2's causal
mask (``attn.bias``, ``attn.masked_bias``) and rotary ``inv_freq`` tables.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from llmlab.errors import UserError

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
# transformers' Qwen3Config default for head_dim, used when config.json leaves it out
QWEN3_HEAD_DIM = 128
DERIVED_BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def is_hf_dir(path: Path) -> bool:
    """A transformers model directory (config.json, and no llmlab model.json)."""
    return (path / "config.json").is_file() and not (path / "model.json").exists()


class _Fields:
    """config.json's values, each checked as it is read: a wrong type or range is one line
    naming the field."""

    def __init__(self, config: dict, where: Path, prefix: str = ""):
        self.config, self.where, self.prefix = config, where, prefix

    def bad(self, name: str, expected: str) -> UserError:
        return UserError(f"ckpt: {self.where}: {self.prefix}{name} must be {expected}, got {self.config.get(name)!r}")

    def int(self, name: str, default: Any = ..., at_least: int = 1) -> int:
        value = self.config.get(name, default)
        if value is ...:
            raise UserError(f"ckpt: {self.where} has no {name}; it is not a complete transformers config")
        if not isinstance(value, int) or isinstance(value, bool) or value < at_least or value > 2**31:
            raise self.bad(name, f"an integer of at least {at_least}")
        return value

    def float(self, name: str, default: Any = ...) -> float:
        value = self.config.get(name, default)
        if value is ...:
            raise UserError(f"ckpt: {self.where} has no {name}; it is not a complete transformers config")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise self.bad(name, "a positive number")
        return float(value)

    def bool(self, name: str, default: bool) -> bool:
        value = self.config.get(name, default)
        if not isinstance(value, bool):
            raise self.bad(name, "true or false")
        return value

    def choice(self, name: str, allowed: dict, default: Any = ...) -> Any:
        value = self.config.get(name, default)
        if not isinstance(value, str) or value not in allowed:
            raise UserError(f"ckpt: {self.where}: {name} is {value!r}; llmlab reads {', '.join(allowed)}")
        return allowed[value]

    def refuse_unless(self, ok: bool, why: str) -> None:
        if not ok:
            raise UserError(f"ckpt: {self.where}: {why}, which llmlab's model cannot express")


def _rope_theta(f: _Fields) -> float:
    """The rotary base, from ``rope_parameters`` (transformers 5) or ``rope_theta``; any
    scaling (llama3, yarn, linear, dynamic) is refused."""
    for name in ("rope_parameters", "rope_scaling"):
        params = f.config.get(name)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise f.bad(name, "a mapping")
        kind = params.get("rope_type", params.get("type", "default"))
        f.refuse_unless(kind == "default", f"{name}.rope_type is {kind!r} (a scaled rotary embedding)")
        if "rope_theta" in params:
            return _Fields(params, f.where, f"{name}.").float("rope_theta")
    return f.float("rope_theta", 10000.0)


def _llama_spec(f: _Fields, qk_norm: bool) -> dict:
    d, heads = f.int("hidden_size"), f.int("num_attention_heads")
    kv = f.int("num_key_value_heads", heads)
    f.refuse_unless(d % heads == 0, f"hidden_size={d} is not a multiple of num_attention_heads={heads}")
    f.refuse_unless(heads % kv == 0, f"num_key_value_heads={kv} does not divide num_attention_heads={heads}")
    head_dim = f.int("head_dim", QWEN3_HEAD_DIM if qk_norm else d // heads)
    f.refuse_unless(head_dim == d // heads, f"head_dim={head_dim} is not hidden_size / num_attention_heads = {d // heads}")
    f.choice("hidden_act", {"silu": "silu"}, "silu")
    attention_bias, mlp_bias = f.bool("attention_bias", False), f.bool("mlp_bias", False)
    f.refuse_unless(attention_bias == mlp_bias, f"attention_bias={attention_bias} with mlp_bias={mlp_bias} "
                                                "(llmlab's model.bias sets both)")
    if qk_norm:
        f.refuse_unless(not f.bool("use_sliding_window", False), "use_sliding_window=true")
        types = f.config.get("layer_types") or []
        f.refuse_unless(isinstance(types, list) and all(t == "full_attention" for t in types),
                        f"layer_types {types!r} (only full_attention layers)")
    eps = f.float("rms_norm_eps", 1e-6)
    if qk_norm:
        attention = {"kind": "qknorm", "kv_heads": kv, "eps": eps}
    else:
        attention = {"kind": "mha"} if kv == heads else {"kind": "mqa"} if kv == 1 else {"kind": "gqa", "kv_heads": kv}
    return {"model": {"d_model": d, "n_layers": f.int("num_hidden_layers"), "n_heads": heads,
                      "max_seq_len": f.int("max_position_embeddings", 32768 if qk_norm else 2048), "bias": attention_bias,
                      "tie_embeddings": f.bool("tie_word_embeddings", False)},
            "attention": attention, "ffn": {"kind": "swiglu", "hidden": f.int("intermediate_size")},
            "norm": {"placement": "pre", "kind": "rmsnorm", "eps": eps}, "pos": {"kind": "rope", "theta": _rope_theta(f)}}


def _gpt2_spec(f: _Fields) -> dict:
    d, heads = f.int("n_embd"), f.int("n_head")
    f.refuse_unless(d % heads == 0, f"n_embd={d} is not a multiple of n_head={heads}")
    act = f.choice("activation_function", {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"},
                   "gelu_new")
    inner = f.config.get("n_inner")
    f.refuse_unless(f.bool("scale_attn_weights", True), "scale_attn_weights=false")
    f.refuse_unless(not f.bool("scale_attn_by_inverse_layer_idx", False), "scale_attn_by_inverse_layer_idx=true")
    f.refuse_unless(not f.bool("add_cross_attention", False), "add_cross_attention=true")
    return {"model": {"d_model": d, "n_layers": f.int("n_layer"), "n_heads": heads, "max_seq_len": f.int("n_positions"),
                      "bias": True, "tie_embeddings": f.bool("tie_word_embeddings", True)},
            "attention": {"kind": "mha"},
            "ffn": {"kind": act, "hidden": 4 * d if inner is None else f.int("n_inner")},
            "norm": {"placement": "pre", "kind": "layernorm", "eps": f.float("layer_norm_epsilon", 1e-5)},
            "pos": {"kind": "learned"}}


SPECS = {"llama": lambda f: _llama_spec(f, qk_norm=False), "qwen3": lambda f: _llama_spec(f, qk_norm=True),
         "gpt2": _gpt2_spec}


def read_config(path: Path) -> tuple[str, dict, dict]:
    """(family, model.json-style spec, config.json itself) from ``path``/config.json, checked,
    without weights."""
    where = path / "config.json"
    try:
        config = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"ckpt: {where} is unreadable ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]})") from e
    if not isinstance(config, dict):
        raise UserError(f"ckpt: {where} holds a JSON {type(config).__name__}, not an object")
    family = config.get("model_type")
    if not isinstance(family, str) or family not in SPECS:
        raise UserError(f"ckpt: {where}: model_type is {family!r}; llmlab reads the families it exports: "
                        f"{', '.join(SPECS)}")
    f = _Fields(config, where)
    spec = SPECS[family](f)
    # the embedding table's rows, padding included, exactly: vocab_multiple 1 keeps it
    spec["vocab_size"] = f.int("vocab_size")
    spec["model"].update(name=path.resolve().name, vocab_multiple=1,
                         init_std=f.float("initializer_range", 0.02))
    spec["objective"] = {"kind": "clm"}
    return family, spec, config


def eos_token(path: Path, config: dict | None = None) -> str | None:
    """The end-of-text token's text, from tokenizer_config.json (a string or an added-token
    mapping), else config.json's ``eos_token_id`` looked up in tokenizer.json; None if neither."""
    tok_cfg = path / "tokenizer_config.json"
    if tok_cfg.is_file():
        try:
            value = json.loads(tok_cfg.read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError, AttributeError) as e:
            raise UserError(f"ckpt: {tok_cfg} is unreadable ({type(e).__name__})") from e
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value:
            return value
    if config is None:
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"ckpt: {path / 'config.json'} is unreadable ({type(e).__name__})") from e
    eos_id = config.get("eos_token_id") if isinstance(config, dict) else None
    if isinstance(eos_id, list):
        eos_id = eos_id[0] if eos_id else None
    if isinstance(eos_id, int) and not isinstance(eos_id, bool) and (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer
        try:
            return Tokenizer.from_file(str(path / "tokenizer.json")).id_to_token(eos_id)
        except Exception as e:  # the Rust side raises plain Exceptions for bad files
            raise UserError(f"ckpt: {path / 'tokenizer.json'} is unreadable ({str(e).splitlines()[0][:120]})") from e
    return None


def _weight_files(path: Path) -> list[Path]:
    if (path / SINGLE).is_file():
        return [path / SINGLE]
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (OSError, ValueError, AttributeError) as e:
            raise UserError(f"ckpt: {index} is unreadable ({type(e).__name__})") from e
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"ckpt: {index}: weight_map must be a mapping of tensor names to shard files")
        names = sorted(set(weight_map.values()), key=str)
        for name in names:  # a shard is a file of this directory, never a path out of it
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..") \
                    or not name.endswith(".safetensors"):
                raise UserError(f"ckpt: {index}: shard {name!r} is not a .safetensors file name of this directory")
            if not (path / name).is_file():
                raise UserError(f"ckpt: {index} names {name}, which is not in {path}")
        return [path / name for name in names]
    pickled = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
    if pickled:
        raise UserError(f"ckpt: {path} holds its weights only as {pickled[0]} (a pickle, which can run code as it loads); "
                        "llmlab loads safetensors only: save the model with safe_serialization=True")
    raise UserError(f"ckpt: {path} has no {SINGLE} (nor {INDEX})")


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors files, by transformers' names."""
    out: dict[str, torch.Tensor] = {}
    for f in _weight_files(path):
        try:
            part = load_file(str(f))
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"ckpt: {f} is truncated or corrupt ({(str(e).splitlines() or [''])[0][:120]})") from e
        twice = set(part) & set(out)
        if twice:
            raise UserError(f"ckpt: {f} repeats {sorted(twice)[0]}, which another shard holds")
        out.update(part)
    return out


class _Take:
    """Take tensors out of a transformers state dict by name, each checked against its shape;
    what is left at the end is refused."""

    def __init__(self, weights: dict[str, torch.Tensor], where: Path, prefix: str = ""):
        self.weights, self.where, self.prefix = dict(weights), where, prefix

    def __call__(self, name: str, *shape: int) -> torch.Tensor:
        key = self.prefix + name
        if key not in self.weights:
            raise UserError(f"ckpt: {self.where} lacks {key}, which its config.json implies")
        t = self.weights.pop(key)
        if tuple(t.shape) != shape or not t.is_floating_point():
            raise UserError(f"ckpt: {self.where}: {key} is {t.dtype} {tuple(t.shape)}, but config.json implies a float "
                            f"tensor of shape {shape}")
        return t.float()

    def maybe(self, name: str, *shape: int) -> torch.Tensor | None:
        return self(name, *shape) if self.prefix + name in self.weights else None

    def done(self) -> None:
        left = sorted(k for k in self.weights if not k.endswith(DERIVED_BUFFERS))
        if left:
            raise UserError(f"ckpt: {self.where} holds {left[0]}" + (f" and {len(left) - 1} more tensors" if len(left) > 1
                            else "") + " that its config.json does not account for")


def _tied_head(take: _Take, sd: dict, tied: bool, vocab: int, d: int, head: str) -> None:
    """An untied model's LM head; a tied one may still store it, if it equals the embedding."""
    w = take.maybe(head, vocab, d) if tied else take(head, vocab, d)
    if w is None:
        return
    if tied and not torch.equal(w, sd["embed.weight"]):
        raise UserError(f"ckpt: {take.where}: {head} differs from the token embedding, but tie_word_embeddings is true")
    if not tied:
        sd["lm_head.weight"] = w


def _llama_weights(spec: dict, weights: dict, where: Path) -> dict[str, torch.Tensor]:
    m, a = spec["model"], spec["attention"]
    d, heads, layers, vocab, hidden = m["d_model"], m["n_heads"], m["n_layers"], spec["vocab_size"], spec["ffn"]["hidden"]
    kv, hd, bias = a.get("kv_heads", 1 if a["kind"] == "mqa" else heads), d // heads, m["bias"]
    take = _Take(weights, where)
    sd = {"embed.weight": take("model.embed_tokens.weight", vocab, d), "norm.weight": take("model.norm.weight", d)}
    _tied_head(take, sd, m["tie_embeddings"], vocab, d, "lm_head.weight")
    sizes = {"q_proj": heads * hd, "k_proj": kv * hd, "v_proj": kv * hd}
    for i in range(layers):
        p, q = f"model.layers.{i}.", f"blocks.{i}."
        sd[q + "attn_norm.weight"] = take(p + "input_layernorm.weight", d)
        sd[q + "ffn_norm.weight"] = take(p + "post_attention_layernorm.weight", d)
        sd[q + "attn.qkv_proj.weight"] = torch.cat([take(p + f"self_attn.{n}.weight", s, d) for n, s in sizes.items()])
        sd[q + "attn.o_proj.weight"] = take(p + "self_attn.o_proj.weight", d, heads * hd)
        if bias:
            sd[q + "attn.qkv_proj.bias"] = torch.cat([take(p + f"self_attn.{n}.bias", s) for n, s in sizes.items()])
            sd[q + "attn.o_proj.bias"] = take(p + "self_attn.o_proj.bias", d)
        if a["kind"] == "qknorm":
            sd[q + "attn.q_norm.weight"] = take(p + "self_attn.q_norm.weight", hd)
            sd[q + "attn.k_norm.weight"] = take(p + "self_attn.k_norm.weight", hd)
        for name, shape in (("gate_proj", (hidden, d)), ("up_proj", (hidden, d)), ("down_proj", (d, hidden))):
            sd[q + f"ffn.{name}.weight"] = take(p + f"mlp.{name}.weight", *shape)
            if bias:
                sd[q + f"ffn.{name}.bias"] = take(p + f"mlp.{name}.bias", shape[0])
    take.done()
    return sd


def _gpt2_weights(spec: dict, weights: dict, where: Path) -> dict[str, torch.Tensor]:
    m = spec["model"]
    d, layers, vocab, hidden = m["d_model"], m["n_layers"], spec["vocab_size"], spec["ffn"]["hidden"]
    # GPT2LMHeadModel saves its body under transformer.; GPT2Model (the original release) without
    prefix = "transformer." if any(k.startswith("transformer.") for k in weights) else ""
    take = _Take(weights, where, prefix)
    sd = {"embed.weight": take("wte.weight", vocab, d), "pos.table.weight": take("wpe.weight", m["max_seq_len"], d),
          "norm.weight": take("ln_f.weight", d), "norm.bias": take("ln_f.bias", d)}
    head = _Take(take.weights, where)  # the LM head sits outside transformer.
    _tied_head(head, sd, m["tie_embeddings"], vocab, d, "lm_head.weight")
    take.weights = head.weights
    for i in range(layers):
        p, q = f"h.{i}.", f"blocks.{i}."
        for ours, theirs in (("attn_norm", "ln_1"), ("ffn_norm", "ln_2")):
            sd[q + f"{ours}.weight"], sd[q + f"{ours}.bias"] = take(p + f"{theirs}.weight", d), take(p + f"{theirs}.bias", d)
        # Conv1D stores (in, out): the transpose of nn.Linear's weight
        for ours, theirs, n_in, n_out in (("attn.qkv_proj", "attn.c_attn", d, 3 * d), ("attn.o_proj", "attn.c_proj", d, d),
                                          ("ffn.up_proj", "mlp.c_fc", d, hidden), ("ffn.down_proj", "mlp.c_proj", hidden, d)):
            sd[q + f"{ours}.weight"] = take(p + f"{theirs}.weight", n_in, n_out).T.contiguous()
            sd[q + f"{ours}.bias"] = take(p + f"{theirs}.bias", n_out)
    take.done()
    return sd


WEIGHTS = {"llama": _llama_weights, "qwen3": _llama_weights, "gpt2": _gpt2_weights}


def load_hf_dir(path: Path) -> tuple[dict, dict[str, torch.Tensor], str | None]:
    """(model.json-style spec, weights by llmlab's names, end-of-text token) of a transformers
    directory; every problem is one line naming the file and field."""
    family, spec, config = read_config(path)
    if not (path / "tokenizer.json").is_file():
        raise UserError(f"ckpt: {path} has no tokenizer.json (llmlab reads a fast tokenizer's file, which "
                        "`tokenizer.save_pretrained` writes)")
    weights = WEIGHTS[family](spec, read_weights(path), path)
    return spec, weights, eos_token(path, config)
