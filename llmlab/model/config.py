"""The model's schema: the registries of its parts, the sections every kind shares
(``model``, ``norm``, ``ffn.hidden``), `ModelSpec`, the checked whole, and the Configs of the
kinds the default model is made of.

Those few (the tiny model's qknorm attention and the gqa it extends, swiglu, rmsnorm, pre-norm,
rope, clm) are declared here with ``@REGISTRY.option(name)``, without torch, so that composing
or checking the default config (``llmlab train --cfg job``, a mistake's one-line error: about
0.5 s) imports none; their classes are registered under the same names in the families'
packages. Every other kind nests its Config in its class, in its family's package (one file
for a new kind), and the registry imports that package when a config names one of them.
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


# the q/k norms' epsilon before it was a setting: a section written then (no ``eps``) keeps it
QKNORM_OLD_EPS = 1e-6


@ATTENTION.option("qknorm")
@dataclass
class QKNormConfig(GQAConfig):
    kind: str = "qknorm"
    eps: float | None = bounded(None, above=0)  # the q/k norms' epsilon; null: norm.eps (Qwen3 has one for every norm)


# ---- feed-forward (model/ffn=..., settings ffn.*) ----

@dataclass
class FFNConfig:
    kind: str = ""
    hidden: Any = width(None)  # hidden width; null: the kind's default (4d; 8/3 d rounded to 64 for swiglu)


@FFN.option("swiglu")
@dataclass
class SwiGLUConfig(FFNConfig):
    kind: str = "swiglu"


# ---- norms (norm.kind) and their placement (norm=pre|post) ----

@NORM.option("rmsnorm")
@dataclass
class RMSNormConfig:
    kind: str = "rmsnorm"


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


# ---- position (pos=...) ----

@POSITION.option("rope")
@dataclass
class RoPEConfig:
    kind: str = "rope"
    theta: float = bounded(10000.0, above=1)  # the base of the rotation frequencies


# ---- objective (objective=...) ----

@OBJECTIVE.option("clm")
@dataclass
class CausalLMConfig:
    kind: str = "clm"


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
