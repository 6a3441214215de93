"""The model's schema: every part's Config dataclass, the registries they are options of, and
`ModelSpec`, the checked whole. No torch here, so composing or checking a config (``llmlab
train --cfg job``, ``--help``, a mistake's one-line error) imports none: each registry imports
the module that holds its classes (``impl``) only when a part is built.

A new kind of part is its Config here, declared with ``@REGISTRY.option(name)``, and its
class in the ``impl`` module, registered with ``@REGISTRY.register(name)``. The file grows by
a few lines a kind: the whole schema of the network reads in one place.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from llmlab.errors import ConfigError
from llmlab.registry import Checked, Registry, bounded, choice, config_store, parse_dataclass, store_schema, width

ATTENTION = Registry("attention", group="model/attention", package="_global_.attention", impl="llmlab.model.attention")
FFN = Registry("ffn", group="model/ffn", package="_global_.ffn", impl="llmlab.model.ffn")
NORM = Registry("norm.kind", impl="llmlab.model.norm")
BLOCK = Registry("norm", group="norm", kind_key="placement", impl="llmlab.model.block")
POSITION = Registry("pos", group="pos", impl="llmlab.model.position")
OBJECTIVE = Registry("objective", group="objective", impl="llmlab.model.objective")


# ---- attention (model/attention=..., settings attention.*) ----

@ATTENTION.option("gqa")
@dataclass
class GQAConfig:
    kind: str = "gqa"
    kv_heads: int = bounded(2, at_least=1)  # key/value heads, each shared by n_heads / kv_heads query heads


@ATTENTION.option("mha")
@dataclass
class MHAConfig:
    kind: str = "mha"


@ATTENTION.option("mqa")
@dataclass
class MQAConfig:
    kind: str = "mqa"


@ATTENTION.option("swa")
@dataclass
class SWAConfig:
    kind: str = "swa"
    window: Any = width(64, relative_to=("max_seq_len", "d_model"))  # positions each query sees, itself included
    kv_heads: int | None = bounded(None, at_least=1)  # null: one KV head per query head; set it for grouped-query SWA


# the q/k norms' epsilon before it was a setting: a section written then (no ``eps``) keeps it
QKNORM_OLD_EPS = 1e-6


@ATTENTION.option("qknorm")
@dataclass
class QKNormConfig(GQAConfig):
    kind: str = "qknorm"
    eps: float | None = bounded(None, above=0)  # the q/k norms' epsilon; null: norm.eps (Qwen3 has one for every norm)


@ATTENTION.option("mla")
@dataclass
class MLAConfig(Checked):
    kind: str = "mla"
    q_rank: Any = width(0, at_least=0)  # 0: no query compression
    kv_rank: Any = width(96)  # the shared latent's width; the cache holds kv_rank + rope_dim per token and layer
    rope_dim: Any = width(32)  # per-head rotary query dims, and the one shared rotary key's
    nope_dim: Any = width(64)  # per-head query/key dims without position
    v_dim: Any = width(64)  # per-head value dims
    absorb: bool = True  # decode in the latent space (W_UK into the query, W_UV into the output)

    def check(self, prefix: str) -> None:
        if self.rope_dim % 2:
            raise ConfigError(f"{prefix}.rope_dim: must be even (RoPE rotates pairs), got {self.rope_dim}")


@ATTENTION.option("dsa")
@dataclass
class DSAConfig(Checked):
    """DeepSeek Sparse Attention (DeepSeek-V3.2): a lightning indexer scores every earlier key,
    and each query attends to its ``topk`` best under the ``base`` attention. The base's own
    settings sit beside: MLA's widths where base=mla, ``kv_heads`` where base=gqa."""

    kind: str = "dsa"
    base: str = choice("mla", ("mla", "mha", "gqa", "mqa"))  # the attention the indexer selects keys for
    topk: int = bounded(64, at_least=1)  # keys each query attends to (all earlier ones while there are fewer)
    index_heads: int = bounded(4, at_least=1)  # the indexer's heads
    index_dim: int = bounded(32, at_least=2)  # the indexer's query/key width (even: RoPE rotates it); cached per token
    dense_warmup: int = bounded(100, at_least=0)  # training steps of dense attention while the indexer learns to follow it
    index_weight: float = bounded(1.0, above=0)  # weight of the indexer's KL loss (it trains the indexer alone)
    kv_heads: int = bounded(2, at_least=1)  # base=gqa: key/value heads
    q_rank: Any = width(0, at_least=0)  # base=mla: as attention=mla's settings
    kv_rank: Any = width(96)
    rope_dim: Any = width(32)
    nope_dim: Any = width(64)
    v_dim: Any = width(64)
    absorb: bool = True

    def check(self, prefix: str) -> None:
        if self.index_dim % 2:
            raise ConfigError(f"{prefix}.index_dim: must be even (RoPE rotates pairs), got {self.index_dim}")
        if self.base == "mla":
            self.base_config().check(prefix)

    def base_config(self) -> Any:
        """The base attention's own Config."""
        if self.base == "mla":
            return MLAConfig(q_rank=self.q_rank, kv_rank=self.kv_rank, rope_dim=self.rope_dim, nope_dim=self.nope_dim,
                             v_dim=self.v_dim, absorb=self.absorb)
        return {"mha": MHAConfig, "mqa": MQAConfig}[self.base]() if self.base != "gqa" else GQAConfig(kv_heads=self.kv_heads)


# ---- feed-forward (model/ffn=..., settings ffn.*) ----

@dataclass
class FFNConfig:
    kind: str = ""
    hidden: Any = width(None)  # hidden width; null: the kind's default (4d; 8/3 d rounded to 64 for swiglu)


@FFN.option("gelu")
@dataclass
class GeluConfig(FFNConfig):
    kind: str = "gelu"


@FFN.option("gelu_tanh")
@dataclass
class GeluTanhConfig(FFNConfig):
    kind: str = "gelu_tanh"


@FFN.option("relu2")
@dataclass
class ReluSquaredConfig(FFNConfig):
    kind: str = "relu2"


@FFN.option("swiglu")
@dataclass
class SwiGLUConfig(FFNConfig):
    kind: str = "swiglu"


@FFN.option("geglu")
@dataclass
class GeGLUConfig(FFNConfig):
    kind: str = "geglu"


@FFN.option("moe")
@dataclass
class MoEConfig(FFNConfig, Checked):
    """``model/ffn=moe``: routed SwiGLU experts; ``hidden`` is each expert's width."""

    kind: str = "moe"
    n_experts: int = bounded(8, at_least=1)
    top_k: int = bounded(2, at_least=1)
    shared_experts: int = bounded(0, at_least=0)  # always-on experts beside the routed ones (DeepSeekMoE)
    jitter: float = bounded(0.0, at_least=0, below=1)  # router input multiplied by U(1 - jitter, 1 + jitter) in training
    balance_coef: float = bounded(0.01, at_least=0)  # weight of the Switch load-balancing loss (per MoE layer)

    def check(self, prefix: str) -> None:
        if self.top_k > self.n_experts:
            raise ConfigError(f"{prefix}.top_k: must be in [1, {prefix}.n_experts={self.n_experts}], got {self.top_k}")


# ---- norms (norm.kind) and their placement (norm=pre|post) ----

@NORM.option("rmsnorm")
@dataclass
class RMSNormConfig:
    kind: str = "rmsnorm"


@NORM.option("layernorm")
@dataclass
class LayerNormConfig:
    kind: str = "layernorm"


@dataclass
class NormConfig(Checked):
    """The ``norm`` group: where the norm sits (``placement``: a block class, the group's
    option) and which norm it is (``kind``: a `NORM` variant, a setting)."""

    placement: str = "pre"
    kind: str = "rmsnorm"  # rmsnorm | layernorm
    eps: float = bounded(1e-5, above=0)

    def check(self, prefix: str) -> None:
        BLOCK.config_of(self.placement, f"{prefix}.placement")
        NORM.config_of(self.kind, f"{prefix}.kind")


@BLOCK.option("pre")
@dataclass
class PreNormConfig(NormConfig):
    placement: str = "pre"


@BLOCK.option("post")
@dataclass
class PostNormConfig(NormConfig):  # Vaswani et al. 2017, section 3.1
    placement: str = "post"
    kind: str = "layernorm"


# ---- position (pos=...) ----

@POSITION.option("none")
@dataclass
class NoPositionConfig:
    kind: str = "none"


@POSITION.option("rope")
@dataclass
class RoPEConfig:
    kind: str = "rope"
    theta: float = bounded(10000.0, above=1)  # the base of the rotation frequencies


@POSITION.option("sinusoidal")
@dataclass
class SinusoidalConfig:
    kind: str = "sinusoidal"


@POSITION.option("learned")
@dataclass
class LearnedConfig:
    kind: str = "learned"


# ---- objective (objective=...) ----

@OBJECTIVE.option("clm")
@dataclass
class CausalLMConfig:
    kind: str = "clm"


@OBJECTIVE.option("mlm")
@dataclass
class MaskedLMConfig(Checked):
    kind: str = "mlm"
    mask_prob: float = bounded(0.15, above=0, below=1)
    mask_replace: float = bounded(0.8, at_least=0)
    random_replace: float = bounded(0.1, at_least=0)

    def check(self, prefix: str) -> None:
        if self.mask_replace + self.random_replace > 1:
            raise ConfigError(f"{prefix}.mask_replace + {prefix}.random_replace: must be within [0, 1]")


# ---- the model section and the whole ----

@dataclass
class ModelConfig(Checked):
    """The ``model`` section: shared sizes, passed to every part."""

    name: str = "custom"  # a label for reports; presets set theirs
    d_model: int = bounded(96, at_least=1)  # the default run's width: the lowest loss per second of training of 64 to 192 (bench/README.md)
    n_layers: Any = width(4)  # blocks; d_model/32 grows the depth with the width, so a size sweep keeps the aspect ratio
    n_heads: int = bounded(4, at_least=1)
    max_seq_len: int = bounded(256, at_least=1)
    mtp_heads: int = bounded(0, at_least=0)  # extra heads predicting tokens t+2 ... t+1+mtp_heads
    mtp_weight: float = bounded(0.3, at_least=0)  # weight of the mean MTP loss in the training loss
    bias: bool = False
    tie_embeddings: bool = True
    init_std: float = bounded(0.02, at_least=0)  # the std of the normal the weights start from
    vocab_multiple: int = bounded(64, at_least=1)  # pad the vocabulary for faster matmuls
    parametrization: str = choice("standard", ("standard", "mup"))  # mup: init, per-layer Adam lr and output scale that transfer across widths (Yang et al. 2022); needs tie_embeddings=false
    mup_base_width: int = bounded(128, at_least=1)  # mup: the d_model at which mup equals standard (tune optim.lr there)
    logit_softcap: float | None = bounded(None, above=0)  # Gemma 2's cap on the output logits: cap * tanh(logits / cap)

    def check(self, prefix: str) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(f"{prefix}.n_heads: {self.n_heads} does not divide {prefix}.d_model={self.d_model}")
        if self.parametrization == "mup" and self.tie_embeddings:
            # one matrix cannot be muP's input weights and its readout at once: tied, a 4x wider
            # model trained 0.8 nats worse than untied in bench.mup_transfer's setting
            raise ConfigError(f"{prefix}.tie_embeddings: {prefix}.parametrization=mup needs an untied LM head (the tied "
                              f"embedding would be an input weight and the readout at once); set {prefix}.tie_embeddings=false")


def _register_schema() -> None:
    """The ``model`` section's schema (``conf/model/tiny.yaml`` builds on it), and a model
    option per attention kind, so that ``model=gqa`` is the tiny model with GQA."""
    store = config_store()
    store_schema("model", ModelConfig)
    ATTENTION.on_register(lambda name, config: store.store(
        group="model", name=name, provider="llmlab",
        node={"defaults": ["tiny", {"override attention": name}, "_self_"], "name": name}))


_register_schema()


@dataclass
class ModelSpec:
    """Everything that determines the network: what a checkpoint needs to rebuild it."""

    vocab_size: int
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: Any = None
    ffn: Any = None
    norm: NormConfig = field(default_factory=NormConfig)
    pos: Any = None
    objective: Any = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], vocab_size: int) -> "ModelSpec":
        """Check the ``model``, ``attention``, ``ffn``, ``norm``, ``pos`` and ``objective`` sections."""
        model, ffn = upgrade_ffn(cfg.get("model"), cfg.get("ffn"))
        if ffn is None and "ffn" not in cfg:
            ffn = {"kind": "swiglu"}  # written before the FFN was a setting: what it trained with
        attention = cfg.get("attention")
        if isinstance(attention, Mapping) and attention.get("kind") == "qknorm" and "eps" not in attention:
            attention = {**attention, "eps": QKNORM_OLD_EPS}  # written before eps was a setting: what it trained with
        # the other settings first, so that a bad d_model is named as itself before a depth relative to it
        shape = parse_dataclass(ModelConfig, {k: v for k, v in (model or {}).items() if k != "n_layers"}, "model")
        sizes = {"d_model": shape.d_model, "max_seq_len": shape.max_seq_len}  # for widths such as d_model/4
        model = parse_dataclass(ModelConfig, model, "model", sizes)
        attention = ATTENTION.config(attention, "attention", sizes)
        norm = BLOCK.config(cfg["norm"] if "norm" in cfg else NormConfig(), "norm")  # null is refused, not a default
        if getattr(attention, "eps", 0) is None:  # an attention kind's norms that follow the blocks' (qknorm)
            attention = replace(attention, eps=norm.eps)
        return cls(
            vocab_size=vocab_size,
            model=model,
            attention=attention,
            ffn=FFN.config(ffn, "ffn", sizes),
            norm=norm,
            pos=POSITION.config(cfg.get("pos"), "pos"),
            objective=OBJECTIVE.config(cfg["objective"] if "objective" in cfg else {"kind": "clm"}, "objective"),
        )

    def to_dict(self) -> dict:
        return {"vocab_size": self.vocab_size, "model": asdict(self.model), "attention": asdict(self.attention),
                "ffn": asdict(self.ffn), "norm": asdict(self.norm), "pos": asdict(self.pos), "objective": asdict(self.objective)}


def upgrade_ffn(model: Mapping[str, Any] | None, ffn: Mapping[str, Any] | None) -> tuple[dict, Any]:
    """Checkpoints written before the FFN was a config group of its own kept it inside the
    ``model`` section (``ffn``, ``ffn_hidden``, ``moe``): move those into an ``ffn`` section."""
    model = dict(model or {})
    if "ffn" not in model or ffn is not None:
        return model, ffn
    kind, hidden, moe = model.pop("ffn"), model.pop("ffn_hidden", None), dict(model.pop("moe", None) or {})
    ffn = {"kind": kind, "hidden": hidden}
    if kind == "moe":
        ffn.update({k: v for k, v in moe.items() if k != "expert_hidden"}, hidden=moe.get("expert_hidden") or hidden)
    return model, ffn


# ``pack_weights`` (decoding on the CPU with weights laid out anew: `llmlab.model.packing`),
# checked here, without torch, with the other settings
PACK_CHOICES = ("auto", True, False)


def check_pack(value, key: str = "pack_weights") -> None:
    if value not in PACK_CHOICES or isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ConfigError(f"{key}: must be one of auto, true, false; got {value!r}")
