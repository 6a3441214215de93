"""Optimizers (config group ``optim``). A kind is the optimizer itself, built as every
registered part is: ``cls(cfg, model, device)``. A new kind can be one file in this package:
its class, registered with ``@OPTIMIZER.register(name)``, holding a nested ``Config``."""

from __future__ import annotations


import torch
from torch import nn

from llmlab.train.optim_config import OPTIMIZER


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict]:
    """Decay only matrices of linear layers: norms, biases and (by default) embeddings are
    left alone, as in GPT-2/GPT-3 practice. Tied weights appear once. Parameters the model
    gives a learning-rate factor (muP's hidden matrices: ``model.lr_multipliers()``) form
    groups of their own, whose ``lr_mult`` `build_optimizer` applies."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    multipliers = model.lr_multipliers() if hasattr(model, "lr_multipliers") else {}
    groups: dict[tuple[bool, float], list] = {(True, 1.0): [], (False, 1.0): []}  # the standard two, in this order
    seen = set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        decays = p.dim() >= 2 and (decay_embeddings or id(p) not in embedding_ids)
        groups.setdefault((decays, multipliers.get(id(p), 1.0)), []).append(p)
    return [{"params": params, "weight_decay": weight_decay if decays else 0.0, **({"lr_mult": mult} if mult != 1.0 else {})}
            for (decays, mult), params in groups.items() if params or mult == 1.0]


class OptimizerKind:
    """What every optimizer kind provides besides being an optimizer (a torch one, or an
    `OptimizerGroup`): a ``Config`` dataclass (``kind``, ``lr`` and its own settings) and a
    constructor ``(cfg, model, device)``. The schedule scales each param group's ``lr`` per
    step."""

    #: settings with which a tiny test model learns in 60 steps (tests run every kind with them)
    test_settings: dict = {}


@OPTIMIZER.register("adamw")
class AdamW(OptimizerKind, torch.optim.AdamW):
    """AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay; norms, biases and embeddings are not decayed."""

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        # the fused kernel is one launch per step on CUDA and one pass per tensor on the CPU
        # (5% of a small model's CPU step against foreach, bench.shakespeare), where it takes
        # plain tensors only (not FSDP's sharded DTensors); foreach elsewhere
        plain = all(type(p.detach()) is torch.Tensor for g in groups for p in g["params"])
        fused = device.type == "cuda" or (device.type == "cpu" and plain)
        super().__init__(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                         fused=fused, foreach=None if fused else True)


@OPTIMIZER.register("sgd")
class SGD(OptimizerKind, torch.optim.SGD):
    """Stochastic gradient descent with (Nesterov) momentum; decay as for AdamW."""

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        super().__init__(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)


class LionOptimizer(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2):
    the update is the sign of an interpolation of momentum and gradient, so every coordinate
    moves by lr; weight decay is decoupled. torch has no Lion of its own."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
                m.lerp_(p.grad, 1 - beta2)
        return loss


@OPTIMIZER.register("lion")
class Lion(OptimizerKind, LionOptimizer):
    """Lion (Chen et al. 2023): sign updates; use a 3-10x smaller lr and larger decay than AdamW (section 5)."""

    test_settings = {"lr": 1e-3}

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        super().__init__(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


# torch < 2.5 has no Adafactor: the class still defines, and the Config's check refuses the kind
@OPTIMIZER.register("adafactor")
class Adafactor(OptimizerKind, getattr(torch.optim, "Adafactor", torch.optim.Optimizer)):
    """Adafactor (Shazeer & Stern 2018): second moments of a matrix kept as a row and a column
    factor, so its state grows with rows + columns, not rows x columns (torch.optim.Adafactor)."""

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        super().__init__(groups, lr=cfg.lr, beta2_decay=cfg.beta2_decay, eps=(None, cfg.eps))


class OptimizerGroup:
    """Several optimizers stepped as one (Muon for hidden matrices, AdamW for the rest)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        for opt, s in zip(self.optimizers, state["optimizers"]):
            opt.load_state_dict(s)


@OPTIMIZER.register("muon")
class Muon(OptimizerKind, OptimizerGroup):
    """Muon (Jordan et al. 2024): momentum orthogonalised by Newton-Schulz iterations, for the
    2-D weight matrices inside the blocks; embeddings, the LM head, norms and biases use AdamW
    (``adamw_lr``), as Muon's authors recommend. Needs a torch with ``torch.optim.Muon``
    (torch >= 2.9), which runs its Newton-Schulz iterations in bf16: fast on GPUs, many times
    slower on CPUs without bf16 matrix units (about 12x slower per step than AdamW on a 2-core
    x86 machine)."""

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        hidden = {id(p) for p in model.blocks.parameters() if p.dim() == 2}
        seen: set[int] = set()
        matrices, rest = [], []
        for p in model.parameters():
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            (matrices if id(p) in hidden else rest).append(p)
        muon = torch.optim.Muon(matrices, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                                weight_decay=cfg.weight_decay, adjust_lr_fn=cfg.adjust_lr)
        rest_ids = {id(p) for p in rest}
        groups = [{"params": [p for p in g["params"] if id(p) in rest_ids], "weight_decay": g["weight_decay"]}
                  for g in param_groups(model, cfg.adamw_weight_decay)]
        adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.adamw_lr,
                                  betas=(cfg.adamw_beta1, cfg.adamw_beta2))
        super().__init__([muon, adamw])


def build_optimizer(cfg, model: nn.Module, device: torch.device):
    """The optimizer the config names; every param group remembers its peak lr as ``base_lr``
    for the schedule to scale."""
    opt = OPTIMIZER.build(cfg, model, device)
    for group in opt.param_groups:
        group["lr"] = group["lr"] * group.get("lr_mult", 1.0)
        group["base_lr"] = group["lr"]
    return opt
