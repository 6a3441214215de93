"""The decoder-only Transformer, assembled from registry-built parts.

    tokens -> embedding (+ position signal) -> blocks -> final norm -> LM head -> logits
                                                     \\-> MTP heads (tokens t+2 ... t+N+1)

The model is built once from a `ModelSpec`; ``forward`` holds no branch on a variant name.
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

from llmlab.model import ring
from llmlab.model.cache import ModelCache, cache_dtype
from llmlab.model.config import ATTENTION, BLOCK, FFN, NORM, OBJECTIVE, POSITION, ModelSpec, NormConfig
from llmlab.model.ffn import round_up
from llmlab.model.loss import linear_cross_entropy, use_fused
from llmlab.model.objective import IGNORE
from llmlab.model.position import DocumentView


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # (B, T, V_padded); None where forward(..., logits=False) fused the loss
    loss: torch.Tensor | None = None  # the training loss: main + weighted auxiliary losses
    weights: list | None = None  # per-layer attention weights (B, H, T, Tk), with need_weights
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # detached scalars to log
    hidden: torch.Tensor | None = None  # (B, T, d): the final normed state the heads read
    main_loss: torch.Tensor | None = None  # the next-token (or masked-token) part of ``loss``


class MTPHead(nn.Module):
    """One multi-token-prediction head: a projection and norm of the final hidden state, read
    out through the shared LM head (after Gloeckle et al. 2024; DeepSeek-V3 section 2.2
    chains full blocks instead)."""

    def __init__(self, d_model: int, norm_cfg: NormConfig, bias: bool):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.norm = NORM.build(norm_cfg, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(h))


def check_sizes(spec: ModelSpec) -> None:
    """Build one block's parts on the meta device, so that a size constraint between parts
    (kv_heads and n_heads, say) is a ConfigError before any work. No weights are made, and no
    embedding either: initialising one on the meta device alone imports torch's compiler."""
    m = spec.model
    causal = OBJECTIVE.build(spec.objective).causal
    with torch.device("meta"):
        ATTENTION.build(spec.attention, m.d_model, m.n_heads, bias=m.bias, causal=causal)
        FFN.build(spec.ffn, m.d_model, m.bias)


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.softcap = spec.model.logit_softcap
        self.checkpointing = "none"  # train.activation_checkpointing, which the trainer sets
        self.doc_eos: int | None = None  # data.doc_mask: the id that ends a document; attention stays inside one
        m = spec.model
        self.objective = OBJECTIVE.build(spec.objective)
        self.vocab_size = spec.vocab_size
        self.padded_vocab = round_up(spec.vocab_size + self.objective.extra_tokens(), m.vocab_multiple)
        self.max_seq_len = m.max_seq_len
        self.embed = nn.Embedding(self.padded_vocab, m.d_model)
        self.pos = POSITION.build(spec.pos, m.d_model, m.max_seq_len)
        self.blocks = nn.ModuleList(
            BLOCK.build(spec.norm,
                        ATTENTION.build(spec.attention, m.d_model, m.n_heads, bias=m.bias, causal=self.objective.causal),
                        FFN.build(spec.ffn, m.d_model, m.bias), m.d_model)
            for _ in range(m.n_layers))
        self.norm = NORM.build(spec.norm, m.d_model) if self.blocks[0].final_norm else nn.Identity()
        self.lm_head = nn.Linear(m.d_model, self.padded_vocab, bias=False)
        if m.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.mtp = nn.ModuleList(MTPHead(m.d_model, spec.norm, m.bias) for _ in range(m.mtp_heads))
        self.lean_decoding = False  # a one-token forward with a cache takes `decode_token` (see `lean_decoding`)
        # muP (Yang et al. 2022, Tensor Programs V, table 3 for Adam), relative to a model of
        # model.mup_base_width, with which it coincides: hidden matrices start at init_std /
        # sqrt(width_mult) and learn at lr / width_mult (`lr_multipliers`), the logits are
        # scaled by 1 / width_mult, and attention scores by 1/D instead of 1/sqrt(D) (as
        # 1/sqrt(D) x sqrt(D_base / D), the head count being the same at every width).
        # Embeddings, norms and biases keep the standard init and learning rate.
        self.width_mult = m.d_model / m.mup_base_width if m.parametrization == "mup" else 1.0
        self.output_mult = 1.0 / self.width_mult
        if self.width_mult != 1.0:
            for blk in self.blocks:
                blk.attn.score_mult = 1.0 / math.sqrt(self.width_mult)
        self.reset_parameters()

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The weights muP calls hidden: every linear layer's matrix but the LM head's
        (embeddings are not linear layers)."""
        return [mod.weight for mod in self.modules() if isinstance(mod, nn.Linear) and mod is not self.lm_head]

    def lr_multipliers(self) -> dict[int, float]:
        """Per-parameter learning-rate factors (by ``id``): 1 / width_mult for the hidden
        matrices under muP; none under the standard parametrization."""
        if self.width_mult == 1.0:
            return {}
        return {id(p): 1.0 / self.width_mult for p in self.hidden_matrices()}

    def reset_parameters(self) -> None:
        """N(0, init_std); residual output projections scaled by 1/sqrt(2L) (GPT-2, section 2.3);
        under muP the hidden matrices' std by 1/sqrt(width_mult) too."""
        std = self.spec.model.init_std
        residual = {id(p) for blk in self.blocks for part in (blk.attn, blk.ffn) for p in part.residual_projections()}
        hidden = {id(p) for p in self.hidden_matrices()}
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                scale = 1 / math.sqrt(2 * self.spec.model.n_layers) if id(module) in residual else 1.0
                if id(module.weight) in hidden:
                    scale /= math.sqrt(self.width_mult)
                nn.init.normal_(module.weight, mean=0.0, std=std * scale)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def head_input(self, h: torch.Tensor) -> torch.Tensor:
        """What the LM head reads: the final states, times muP's output multiplier."""
        return h if self.output_mult == 1.0 else h * self.output_mult

    # -- forward -----------------------------------------------------------------------
    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: ModelCache | None = None, need_weights: bool = False,
                logits: bool = True, head_loss: str = "auto", z_loss: float = 0.0) -> ModelOutput:
        """idx: (B, T) token ids; targets: (B, T), IGNORE where there is no loss.
        ``logits=False`` (training, with targets): where ``head_loss`` says so (`use_fused`),
        the losses come from `linear_cross_entropy`, which never holds the (B, T, V) logits,
        and ``out.logits`` is None. ``z_loss``: the coefficient of PaLM's auxiliary loss, the
        mean squared log-normaliser of the counted targets' logits (``train.z_loss``)."""
        B, T = idx.shape
        if T == 1 and cache is not None and self.lean_decoding and targets is None and not need_weights:
            return self.decode_token(idx, cache)
        start = cache.pos if cache is not None else 0
        shard = ring.active()
        if shard is not None:  # train.context_parallel: idx is this rank's slice of each sequence
            start = shard.rank * T
        self.pos.check_end(start + T)
        positions = torch.arange(start, start + T, device=idx.device)
        x = self.pos.embed(self.embed(idx), positions)  # (B, T, d)
        pos = self.pos.view(positions)  # what attention asks of the position scheme this pass
        if self.doc_eos is not None and cache is None and start == 0:  # data.doc_mask
            pos = DocumentView(pos, documents(idx, self.doc_eos))
        all_weights = []
        recompute = self.checkpointing != "none" and cache is None and not need_weights and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if recompute:  # train.activation_checkpointing: the block's forward runs again in the backward
                x, weights = checkpoint(block, x, pos, positions, None, False, use_reentrant=False,
                                        context_fn=_keep_matmuls if self.checkpointing == "selective" else noop_context_fn,
                                        **_SAC_HOOKS)
            else:
                x, weights = block(x, pos, positions, cache.layers[i] if cache is not None else None, need_weights)
            all_weights.append(weights)
        if cache is not None:
            cache.pos += T
        h = self.norm(x)
        # the fused head never holds the logits, which a cap and the z-loss read (`check_head_loss`)
        fused = (not logits and targets is not None and not z_loss and self.softcap is None
                 and use_fused(h, self.lm_head.weight, head_loss))
        out = ModelOutput(None if fused else self.logits_of(h), weights=all_weights if need_weights else None,
                          hidden=h)
        if targets is None:
            return out
        main = self._head_loss(h, targets, fused, out.logits)
        out.loss = out.main_loss = main
        out.metrics["loss/main"] = main.detach()
        if z_loss:
            z = z_loss * _log_partition_squared(out.logits, targets)
            out.loss = out.loss + z
            out.metrics["train/z_loss"] = z.detach()
        if len(self.mtp):
            # head k reads the state at t and predicts targets[t + k], the token t + 1 + k
            mtp_losses = []
            for k, head in enumerate(self.mtp, start=1):
                if T <= k:
                    break
                loss_k = self._head_loss(head(h[:, :-k]), targets[:, k:], fused)
                out.metrics[f"mtp/loss_{k}"] = loss_k.detach()
                mtp_losses.append(loss_k)
            if mtp_losses:
                out.loss = out.loss + self.spec.model.mtp_weight * torch.stack(mtp_losses).mean()
        for name, aux in self.aux_losses().items():
            out.loss = out.loss + aux["weighted"]
            out.metrics.update({f"{name}/{k}": v.detach() for k, v in aux.items() if k != "weighted"})
        return out

    def decode_token(self, idx: torch.Tensor, cache: ModelCache, at: torch.Tensor | None = None) -> ModelOutput:
        """One new token per sequence, idx (B, 1), with the cache: the logits and final states
        `forward` gives, with the parts entered through their ``forward`` and each block's
        `decode_token` (on 2 CPU cores `nn.Module.__call__` is a few percent of a small
        model's token). Taken while `lean_decoding` is open, which holds no model with hooks.

        ``at``: the position, held on the device (1,), for a step recorded once as a CUDA
        graph (`llmlab.sample.graphs`, which sets the layers' ``at`` to it, checks the end and
        moves ``cache.pos`` itself); by default ``cache.pos``, which this moves on."""
        if at is None:
            p = cache.pos
            self.pos.check_end(p + 1)
            positions = torch.arange(p, p + 1, device=idx.device)
            cache.pos = p + 1
        else:
            positions = at
        x = self.pos.embed(self.embed.forward(idx), positions)
        pos = self.pos.view(positions)
        for block, layer in zip(self.blocks, cache.layers):
            x = block.decode_token(x, pos, positions, layer)
        h = self.norm.forward(x)
        return ModelOutput(self.logits_of(h, self.lm_head.forward), hidden=h)

    def _head_loss(self, h: torch.Tensor, targets: torch.Tensor, fused: bool,
                   logits: torch.Tensor | None = None) -> torch.Tensor:
        """Mean cross-entropy of the LM head on states ``h`` against ``targets``."""
        if fused:
            return linear_cross_entropy(self.head_input(h), self.lm_head.weight, targets, IGNORE)
        logits = self.logits_of(h) if logits is None else logits
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)

    def mtp_logits(self, h: torch.Tensor) -> list[torch.Tensor]:
        """Logits of each MTP head on states ``h`` (B, T, d): head k at position t predicts the
        token at t + 1 + k."""
        return [self.logits_of(head(h)) for head in self.mtp]

    def logits_of(self, h: torch.Tensor, head=None) -> torch.Tensor:
        """The LM head's logits on final states ``h``, capped where ``model.logit_softcap`` is
        set (Gemma 2: cap * tanh(logits / cap), smooth, and near the identity well below cap)."""
        logits = (head or self.lm_head)(self.head_input(h))
        cap = self.softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def aux_losses(self) -> dict[str, dict[str, torch.Tensor]]:
        """Auxiliary losses that parts computed in the last forward (MoE load balance, a sparse
        attention's indexer KL), under each kind's ``aux_name``: the weighted losses of all
        layers summed into the training loss, the logged values averaged over layers."""
        groups: dict[str, list[dict[str, torch.Tensor]]] = {}
        for blk in self.blocks:
            for part in (blk.attn, blk.ffn):
                aux = part.take_aux()
                if aux:
                    groups.setdefault(part.aux_name, []).append(aux)
        return {name: {k: torch.stack([p[k] for p in parts]).sum() if k == "weighted"
                       else torch.stack([p[k] for p in parts]).mean() for k in parts[0]}
                for name, parts in groups.items()}

    def at_step(self, step: int) -> None:
        """Tell the parts which training step is about to run (a sparse attention's dense
        warm-up ends at a step)."""
        for blk in self.blocks:
            blk.attn.at_step(step)

    def new_cache(self, batch: int, max_len: int | None = None, dtype: torch.dtype | None = None,
                  slack: int = 0) -> ModelCache:
        """Caches for ``max_len`` positions; ``slack``: how far `ModelCache.truncate` may roll
        back (rolling caches keep that many extra positions). ``dtype``: by default
        `cache_dtype`'s (autocast's on a GPU under autocast, else the parameters')."""
        p = next(self.parameters())
        max_len = max_len or self.max_seq_len
        if dtype is None:
            device = p.device.type
            dtype = cache_dtype(p.dtype, device,
                                torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None)
        return ModelCache([blk.attn.new_cache(batch, max_len, p.device, dtype, slack)
                           for blk in self.blocks])

    # -- the model card ----------------------------------------------------------------
    def caveats(self) -> list[str]:
        """What a comparison of this model should know (see the attention kinds' ``caveat``),
        once per distinct message."""
        seen = [blk.attn.caveat(self.spec.model.d_model, self.max_seq_len) for blk in self.blocks]
        return list(dict.fromkeys(c for c in seen if c))

    def param_counts(self) -> dict[str, int]:
        """Parameters: ``embedding`` counts the vocabulary's (token embedding, an untied LM
        head) and the position table's, as Kaplan et al.'s non-embedding N leaves out; so a
        model's N is the same tied or untied."""
        total = sum(p.numel() for p in self.parameters())
        head = 0 if self.spec.model.tie_embeddings else self.lm_head.weight.numel()
        embedding = self.embed.weight.numel() + head + sum(p.numel() for p in self.pos.parameters())
        active = total - sum(blk.ffn.inactive_params() for blk in self.blocks)
        return {"total": total, "embedding": embedding, "non_embedding": total - embedding, "active": active}

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token: 6 N over every matmul weight a token passes through (the
        LM head included, tied or not; MoE experts a token is not routed to left out) plus the
        attention term (Kaplan et al. 2020; PaLM appendix B)."""
        seq_len = seq_len or self.max_seq_len
        counts = self.param_counts()
        matmul_params = counts["active"] - counts["embedding"] + self.lm_head.weight.numel()  # the head is a matmul
        attn = sum(blk.attn.flops_per_token(seq_len) for blk in self.blocks)
        return 6 * matmul_params + attn

    def kv_cache_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return sum(blk.attn.kv_cache_bytes_per_token(dtype_bytes) for blk in self.blocks)


def hooked(model: nn.Module) -> bool:
    """Whether a forward hook of ``model``'s modules, or a global one, would run in a forward
    (FSDP gathers a sharded block's weights in one)."""
    from torch.nn.modules import module

    if module._global_forward_hooks or module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@contextmanager
def undrawn_weights() -> Iterator[None]:
    """Modules built while this is open get their parameters allocated but not drawn:
    ``torch.nn.init``'s functions (every module's default initialisation, and
    `Transformer.reset_parameters`) do nothing. For a model whose every weight is loaded next
    (`llmlab.train.checkpoint.build_model`, which refuses a checkpoint that lacks one):
    drawing GPT-2-124M's weights took 2 s of a command's start on 2 cores, only to be
    overwritten."""
    init = nn.init
    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_") and callable(getattr(init, n))]
    saved = {n: getattr(init, n) for n in names}

    def keep(tensor, *args, **kwargs):
        return tensor

    for n in names:
        setattr(init, n, keep)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


@contextmanager
def lean_decoding(*models: nn.Module | None) -> Iterator[None]:
    """While open, a one-token forward with a cache of each `Transformer` among ``models``
    takes `Transformer.decode_token`: the same numbers, with less per-call cost. A model with
    hooks (`hooked`) keeps the ordinary forward, which runs them."""
    lean = [m for m in models if isinstance(m, Transformer) and not m.lean_decoding and not hooked(m)]
    for m in lean:
        m.lean_decoding = True
    try:
        yield
    finally:
        for m in lean:
            m.lean_decoding = False


def _log_partition_squared(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean of log(Z)^2 over the counted targets' positions, Z the softmax's normaliser
    (PaLM's z-loss before its coefficient), in float32 at least."""
    lse = torch.logsumexp(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    counted = targets != IGNORE
    return (lse.square() * counted).sum() / counted.sum().clamp(min=1)


# what selective checkpointing keeps of a block's forward: the outputs of its matmuls and of the
# attention kernels (the costly ops); the norms, activations and other elementwise ops are
# recomputed in the backward (torchtitan's per-op selective checkpointing)
_KEPT_OPS = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")


# What selective checkpointing keeps goes through the caller's saved-tensor hooks (an offload to
# the CPU, `torch.autograd.graph.save_on_cpu`, sees the kept matmul outputs too), where torch
# has the choice (2.14 on; it warns while the default still bypasses them, and a later release
# makes honouring them the default). Older releases bypass the hooks, and have no such argument.
_SAC_HOOKS = ({"respect_saved_tensors_hooks": True}
              if "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters else {})


def _keep_matmuls():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    kept = {getattr(torch.ops.aten, name).default for name in _KEPT_OPS if hasattr(torch.ops.aten, name)}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in kept else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def documents(idx: torch.Tensor, eos: int) -> torch.Tensor:
    """(B, T) the document of each position: the end-of-document tokens before it, so that the
    token that ends a document is its document's last and the one after it begins the next."""
    ends = idx == eos
    return torch.cumsum(ends, dim=1) - ends.long()

